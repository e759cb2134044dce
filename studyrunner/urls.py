"""URLs as they may be shown or stored: with their secrets replaced by `***`.

A ledger URL (`postgresql+psycopg://sr:PASSWORD@host/db`), a tracking URI (`https://user:PASSWORD@mlflow`)
or a storage URI can carry a password, in its user part or in its query string (`?password=...`,
`?secret_key=...`). Every line the product prints, logs or writes (hints, errors, the report, MLflow) shows
a location through `mask_url`; text that may quote one (a driver's error message) goes through
`mask_text`. Both never raise: a location that cannot be parsed is masked as text.

    mask_url("postgresql+psycopg://sr:pw@db/ledger")   -> "postgresql+psycopg://sr:***@db/ledger"
    mask_url("https://mlflow:8443/?token=abc")          -> "https://mlflow:8443/?token=***"

The same password given another way stays out of the URL altogether (`credential_note` says where):
PGPASSWORD or ~/.pgpass for PostgreSQL, MLFLOW_TRACKING_USERNAME/PASSWORD for an MLflow server.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"
# SQLAlchemy URLs: `dialect[+driver]://`; their password is exactly what SQLAlchemy sends, so SQLAlchemy
# itself renders them (make_url(...).render_as_string(hide_password=True)).
DATABASE_SCHEMES = frozenset({"sqlite", "postgresql", "postgres", "mysql", "mariadb", "mssql", "oracle", "cockroachdb"})
# A query parameter is secret when its name (lower case, letters and digits only) contains one of these,
# or is one of SECRET_NAMES: libpq's password/sslpassword, pyarrow's secret_key/session_token, SAS `sig`.
SECRET_PARTS = ("password", "passwd", "pwd", "secret", "token", "signature", "credential", "apikey", "accesskey")
SECRET_NAMES = frozenset({"sig", "key", "auth", "pass"})
# `scheme://user:password@host` anywhere in a text: the password runs to the last '@' before whitespace or
# a quote (an AWS secret key may hold an unescaped '/'), unless it is a port (`host:8080/path@x`).
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][\w+.-]*://[^\s:/@'\"]*:)(?!\d+(?:/|$))(?P<secret>[^\s'\"]+)(?=@)")
# `user:password@host` without a well-formed scheme before it (`postgresql//sr:pw@db`, a URL typed wrong).
_BARE_USERINFO = re.compile(
    r"(?P<head>(?:^|(?<=[\s/'\"(]))[\w.+-]+:)(?!\d+(?:/|$))(?P<secret>[^\s/'\"@]+)(?=@[\w.\[-])"
)
_QUERY = re.compile(r"(?P<head>(?:^|[?&;\s])(?P<name>[\w.-]+)=)(?P<value>[^&;\s'\"]+)")


def _secret_name(name: str) -> bool:
    plain = re.sub(r"[^a-z0-9]", "", name.lower())
    return plain in SECRET_NAMES or any(part in plain for part in SECRET_PARTS)


def _mask_query(query: str) -> str:
    """`a=1&password=x` -> `a=1&password=***` (the other parameters as they were)."""
    return _QUERY.sub(lambda m: m["head"] + MASK if _secret_name(m["name"]) else m[0], query)


def mask_url(url: str) -> str:
    """`url` with its password (user part and secret query parameters) shown as `***`; unchanged when it
    holds none. Never raises."""
    try:
        return _mask_url(str(url))
    except Exception:  # noqa: BLE001 - garbage in: mask it as text rather than fail a message
        return mask_text(str(url))


def _mask_url(url: str) -> str:
    if "://" not in url:
        return mask_text(url)
    scheme = url.split("://", 1)[0].lower()
    if scheme.split("+", 1)[0] in DATABASE_SCHEMES:
        from sqlalchemy import make_url

        parsed = make_url(url)
        if parsed.password is not None:
            url = parsed.render_as_string(hide_password=True)
    else:
        parts = urlsplit(url)
        if parts.password is not None:
            user, _, host = parts.netloc.rpartition("@")
            name = user.split(":", 1)[0]
            url = urlunsplit(parts._replace(netloc=f"{name}:{MASK}@{host}"))
    return mask_text(url)  # secret query parameters, and a password SQLAlchemy read short (an unescaped '@')


def without_password(url: str) -> str:
    """`url` with no password at all (`https://user@host/...`): for a link a browser opens, where `***`
    would be sent as the password. Never raises."""
    try:
        parts = urlsplit(str(url))
        if parts.password is None:
            return mask_url(url)
        user, _, host = parts.netloc.rpartition("@")
        name = user.split(":", 1)[0]
        return mask_url(urlunsplit(parts._replace(netloc=f"{name}@{host}" if name else host)))
    except Exception:  # noqa: BLE001
        return mask_text(str(url))


def passwords(*urls: str | None) -> list[str]:
    """The passwords the URLs carry (as given and percent-decoded), for masking them in free text."""
    found: set[str] = set()
    for url in filter(None, urls):
        try:
            secrets = [m["secret"] for pattern in (_USERINFO, _BARE_USERINFO) for m in pattern.finditer(url)]
            secrets += [m["value"] for m in _QUERY.finditer(url.split("?", 1)[-1]) if _secret_name(m["name"])]
            if url.split("://", 1)[0].split("+", 1)[0].lower() in DATABASE_SCHEMES:
                from sqlalchemy import make_url

                secrets.append(make_url(url).password or "")
            else:
                secrets.append(urlsplit(url).password or "")
        except Exception:  # noqa: BLE001 - an unparsable URL: what the patterns found
            pass
        found.update(s for secret in secrets if secret for s in (secret, unquote(secret)))
        # A password with a raw '@' is read short by a driver, which then quotes the rest as a host name.
        found.update(piece for secret in list(found) for piece in re.split(r"[@/?#]", secret) if piece)
    return sorted(found, key=len, reverse=True)


def mask_text(text: str, *urls: str | None) -> str:
    """`text` (an error message, a log line) with every password shown as `***`: the user part of any
    `scheme://user:password@host` in it, secret query parameters, and the passwords of `urls` wherever
    they appear (a driver may quote one alone). Never raises."""
    try:
        text = str(text)
        text = _USERINFO.sub(lambda m: m["head"] + MASK, text)
        text = _BARE_USERINFO.sub(lambda m: m["head"] + MASK, text)
        text = _QUERY.sub(lambda m: m["head"] + MASK if _secret_name(m["name"]) else m[0], text)
        # Whole words only (a password `postgres` leaves `postgresql` be), and none shorter than 3 characters
        # (they would mask ordinary words; the patterns above still hide them inside a URL).
        for secret in (s for s in passwords(*urls) if len(s) >= 3):
            text = re.sub(rf"(?<!\w){re.escape(secret)}(?!\w)", MASK, text)
        return text
    except Exception:  # noqa: BLE001
        return "<text hidden: it could not be checked for passwords>"


# Characters a password cannot hold as they are in a URL: each ends the user part (or the host) early, so the
# driver reads a wrong password and a piece of it as the host name, and prints that piece in its error.
RESERVED_IN_PASSWORD = "@/?#[] "
_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def unencoded_password_chars(url: str | None) -> str:
    """The characters of the password in `url` that should have been percent-encoded ('' when there are none,
    or no password). The user part runs to the last '@' (a raw '@' in the password makes two); a '/' after the
    first ':' is a port and a path (`host:8080/a@b`), not a password."""
    if not url or "://" not in url:
        return ""
    rest = url.split("://", 1)[1]
    if "@" not in rest:
        return ""
    userinfo = rest[: rest.rindex("@")]
    if ":" not in userinfo:
        return ""
    password = userinfo.split(":", 1)[1]
    if re.match(r"\d+(/|$)", password):
        return ""
    bad = "".join(dict.fromkeys(c for c in password if c in RESERVED_IN_PASSWORD))
    return bad + ("%" if _PERCENT.search(password) else "")


def masked_userinfo(url: str) -> str:
    """`scheme://user:***@host...` for a URL whose password may hold raw reserved characters (cut at the last
    '@', where no parser would)."""
    scheme, rest = url.split("://", 1)
    user = rest[: rest.rindex("@")].split(":", 1)[0]
    return mask_text(f"{scheme}://{user}:{MASK}@{rest[rest.rindex('@') + 1 :]}")


def check_password_encoded(url: str | None, option: str) -> None:
    """Refuse, in one line that says how to mend it, a URL whose password holds unencoded reserved characters."""
    from .errors import UsageError

    bad = unencoded_password_chars(url)
    if not bad:
        return
    names = " ".join(repr(c) for c in bad)
    codes = ", ".join(f"{c!r} as %{ord(c):02X}" for c in bad)
    raise UsageError(
        f"{option}: the password in {masked_userinfo(url)!r} holds {names} unencoded, which a URL reads as the "
        f'end of the password or an escape; percent-encode it ({codes}; python3 -c "import urllib.parse, getpass; '
        f"print(urllib.parse.quote(getpass.getpass(), safe=''))\" prints it encoded), or {credential_note(url)}"
    )


def has_password(url: str | None) -> bool:
    return bool(url) and mask_url(url) != url


def credential_note(url: str) -> str:
    """Where the password of `url` can be given instead of in the URL, for a hint that shows it masked."""
    scheme = url.split("://", 1)[0].split("+", 1)[0].lower() if "://" in url else ""
    if scheme in ("postgresql", "postgres"):
        return "put it in PGPASSWORD or ~/.pgpass and leave it out of the URL"
    if scheme in ("http", "https"):
        return "put it in MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD and leave it out of the URL"
    return "give it in the driver's own environment variable and leave it out of the URL"
