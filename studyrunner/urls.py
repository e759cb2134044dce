"""URLs as they may be shown: a password in a database, tracking or storage URL is never printed."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def mask_url(url: str) -> str:
    """`url` with the password of its user part replaced by `***` (anything that is not such a URL, e.g. a
    path, comes back unchanged)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.scheme or "@" not in parts.netloc:
        return url
    user, _, host = parts.netloc.rpartition("@")
    if ":" not in user:
        return url
    name = user.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{name}:***@{host}"))
