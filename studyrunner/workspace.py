"""Where the embedded defaults live, and how each part is pointed elsewhere.

One folder per project (default `./.studyrunner`, or `$STUDYRUNNER_HOME`) holds:

    ledger.db      results ledger (SQLite)            --db / $STUDYRUNNER_DB
    mlflow.db      MLflow tracking store (SQLite)     --tracking-uri / $MLFLOW_TRACKING_URI
    mlartifacts/   MLflow artifacts, one folder per study
    curves/        per-step Parquet curves            --storage / $STUDYRUNNER_STORAGE
    ray/           Ray Tune experiment folders
"""

from __future__ import annotations

import os
import shlex
import uuid
from dataclasses import dataclass
from pathlib import Path

from .errors import StudyrunnerError
from .urls import check_password_encoded, credential_note, has_password, mask_text, mask_url

TRACKING_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "file", "databricks")


ENV = {"--db": "STUDYRUNNER_DB", "--tracking-uri": "MLFLOW_TRACKING_URI", "--storage": "STUDYRUNNER_STORAGE"}
# Where pyarrow (and boto3) find an S3 endpoint other than AWS's.
S3_ENDPOINT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


@dataclass(frozen=True)
class Workspace:
    root: Path
    db_url: str
    tracking_uri: str
    storage: str  # a local folder or a pyarrow filesystem URI (s3://..., gs://...)
    # The locations the user named on the command line (option -> value): the hints a command prints
    # (`resume with: ...`) repeat them, so following a hint reaches the same stores.
    flags: tuple[tuple[str, str], ...] = ()
    # Environment variables not used because an explicit --workspace names the stores (one note each).
    ignored_env: tuple[str, ...] = ()

    @classmethod
    def resolve(
        cls,
        root: str | Path | None = None,
        db: str | None = None,
        tracking_uri: str | None = None,
        storage: str | None = None,
    ) -> Workspace:
        """The workspace the options and environment name; every location is checked for form (a
        local folder that is a file, an in-memory SQLite URL, an unknown scheme) but nothing is created.

        An explicit option wins over the environment, and an explicit `root` (--workspace) means the stores
        in it: STUDYRUNNER_DB, MLFLOW_TRACKING_URI and STUDYRUNNER_STORAGE then apply only where the matching
        option is given (a workspace from STUDYRUNNER_HOME keeps them)."""
        home = Path(root or os.environ.get("STUDYRUNNER_HOME") or ".studyrunner").expanduser().resolve()
        if home.exists() and not home.is_dir():
            raise StudyrunnerError(
                f"workspace {str(home)!r} is a file, not a folder (check --workspace / STUDYRUNNER_HOME)"
            )
        given = {"--workspace": str(root) if root else None, "--db": db, "--tracking-uri": tracking_uri}
        given["--storage"] = storage
        ignored = []

        def pick(option: str, value: str | None, default: str) -> str:
            env = os.environ.get(ENV[option])
            if value:
                return value
            if env and root:
                ignored.append(
                    f"--workspace given, so {ENV[option]}={mask_url(env)} is not used (pass {option} to use it)"
                )
                return default
            return env or default

        ws = cls(
            root=home,
            db_url=pick("--db", db, f"sqlite:///{home / 'ledger.db'}"),
            tracking_uri=pick("--tracking-uri", tracking_uri, f"sqlite:///{home / 'mlflow.db'}"),
            storage=pick("--storage", storage, str(home)),
            flags=tuple((k, v) for k, v in given.items() if v),
            ignored_env=tuple(ignored),
        )
        check_password_encoded(ws.db_url, "--db / STUDYRUNNER_DB")
        check_password_encoded(ws.tracking_uri, "--tracking-uri / MLFLOW_TRACKING_URI")
        check_password_encoded(ws.storage, "--storage / STUDYRUNNER_STORAGE")
        check_sqlite_url(ws.db_url, "--db / STUDYRUNNER_DB")
        check_tracking_uri(ws.tracking_uri)
        return ws

    def hint(self, verb: str, *args: str) -> str:
        """`studyrunner VERB ARGS` with the locations the user gave, e.g. `studyrunner resume s --workspace w`."""
        return hint(verb, *args, flags=self.flags)

    def check_storage(self) -> None:
        """Before anything is written: the storage location can be opened and written to (a local folder that
        does not exist yet is not made: the folder it would be made in must be writable)."""
        check_storage(self.storage)

    @property
    def is_local_storage(self) -> bool:
        return "://" not in self.storage or self.storage.startswith("file://")

    def ensure(self) -> Workspace:
        """Make the workspace folder, and the storage folder where it is a local one (checked before)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self.is_local_storage:
            Path(self.storage.removeprefix("file://")).expanduser().mkdir(parents=True, exist_ok=True)
        return self

    def artifact_location(self, study: str) -> str:
        if self.is_local_storage:
            return (Path(self.storage.removeprefix("file://")) / "mlartifacts" / study).resolve().as_uri()
        return f"{self.storage.rstrip('/')}/mlartifacts/{study}"

    def ray_storage(self) -> str:
        if self.is_local_storage:
            return str(Path(self.storage.removeprefix("file://")) / "ray")
        return f"{self.storage.rstrip('/')}/ray"


def hint(verb: str, *args: str, flags: tuple[tuple[str, str], ...] = ()) -> str:
    """A command line to print for the user: `studyrunner VERB ARGS --option value ...` (shell-quoted).

    A location's password is shown as `***` (urls.mask_url), with a note on where to give it instead, so a
    hint never repeats a password."""
    words = ["studyrunner", verb, *args, *(w for option, value in flags for w in (option, mask_url(value)))]
    line = " ".join(shlex.quote(w) for w in words)
    hidden = [value for _option, value in flags if has_password(value)]
    if hidden:
        line += f"  (password hidden as ***: {credential_note(hidden[0])})"
    return line


def checkpoint_location(storage: str, study: str, trial_key: str) -> str:
    """Where a trial's checkpoints live: under the study's storage, so any node can resume it."""
    return f"{storage.rstrip('/')}/checkpoints/{study}/{trial_key}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_sqlite_url(url: str, option: str) -> None:
    """An SQLite URL must name a file: `sqlite://`, `sqlite:///` and `:memory:` would keep everything
    in memory and lose it when the process ends."""
    if not url.startswith("sqlite"):
        return
    path = url.split("://", 1)[1] if "://" in url else ""
    path = path.removeprefix("/").split("?", 1)[0]
    if not path or path == ":memory:" or "mode=memory" in url:
        raise StudyrunnerError(
            f"{option}: {mask_url(url)!r} is an in-memory SQLite database, which loses everything on exit; "
            "name a file, e.g. sqlite:///results/ledger.db"
        )


def check_tracking_uri(uri: str) -> None:
    scheme = uri.split("://", 1)[0].split("+", 1)[0] if "://" in uri else ""
    if "://" in uri and scheme not in TRACKING_SCHEMES:
        raise StudyrunnerError(
            f"--tracking-uri / MLFLOW_TRACKING_URI: unknown scheme {scheme!r} in {mask_url(uri)!r}; "
            f"use one of {', '.join(TRACKING_SCHEMES)} (or a local folder)"
        )
    check_sqlite_url(uri, "--tracking-uri / MLFLOW_TRACKING_URI")


def check_storage_uri(storage: str) -> None:
    """A storage URI is joined with sub-paths (curves/, checkpoints/, ray/, mlartifacts/) and handed to
    MLflow and Ray Tune as well, so it must be a plain location: pyarrow's options in a query string
    (`?endpoint_override=...`) would end up inside those paths, and MLflow would not read them."""
    if "://" in storage and has_password(storage.split("?", 1)[0]):
        raise StudyrunnerError(
            f"--storage / STUDYRUNNER_STORAGE: {mask_url(storage)!r} carries a password; give the location without "
            "it and the credentials in the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY for S3): the "
            "location is written into MLflow, Ray's files and the ledger's messages"
        )
    if "://" in storage and not storage.startswith("file://") and "?" in storage:
        raise StudyrunnerError(
            f"--storage / STUDYRUNNER_STORAGE: {mask_url(storage)!r} carries options after '?'; give the plain "
            f"location ({mask_url(storage.split('?', 1)[0])}) and set them in the environment instead "
            "(AWS_ENDPOINT_URL for an S3-compatible store's endpoint)"
        )


def unwritable_parent(path: Path) -> Path | None:
    """The nearest existing folder above `path` when this user cannot create `path` in it; None when it can."""
    above = path.parent
    while not above.exists():
        above = above.parent
    return None if above.is_dir() and os.access(above, os.W_OK | os.X_OK) else above


def _check_creatable(path: Path, option: str) -> None:
    """A folder that does not exist yet can be made: the nearest folder above it that exists is writable."""
    above = unwritable_parent(path)
    if above is not None:
        raise StudyrunnerError(
            f"{option}: cannot make {str(path)!r}: {str(above)!r} is not a folder this user can write to "
            "(give a writable folder or a URI such as s3://bucket/path)"
        )


def check_storage(storage: str) -> None:
    """Open the storage location and write a probe file, so a bad --storage fails before any study,
    experiment or run records it."""
    import pyarrow.fs as pafs

    check_storage_uri(storage)
    option = "--storage / STUDYRUNNER_STORAGE"
    try:
        if "://" in storage and not storage.startswith("file://"):
            fs, root = pafs.FileSystem.from_uri(storage)
        else:
            local = Path(storage.removeprefix("file://")).expanduser()
            if local.exists() and not local.is_dir():
                raise StudyrunnerError(f"{option}: {storage!r} is a file; give a folder or a URI")
            if not local.exists():  # made with the stores, once every location has been checked
                _check_creatable(local.resolve(), option)
                return
            fs, root = pafs.LocalFileSystem(), str(local.resolve())
        fs.create_dir(root, recursive=True)
        # A name of its own: commands started together (two resumes, hosts sharing a bucket) must not
        # delete each other's probe.
        probe = f"{root.rstrip('/')}/.studyrunner-probe-{uuid.uuid4().hex}"
        with fs.open_output_stream(probe) as f:
            f.write(b"ok")
        fs.delete_file(probe)
    except StudyrunnerError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ... per filesystem
        mend = "give a writable folder or a pyarrow filesystem URI such as s3://bucket/path"
        if storage.startswith("s3://") and not any(os.environ.get(v) for v in S3_ENDPOINT_ENV):
            mend += "; for an S3-compatible store that is not AWS (MinIO, ...), set AWS_ENDPOINT_URL"
        first = mask_text(_first_line(exc), storage)
        raise StudyrunnerError(f"{option}: cannot write to {mask_url(storage)!r}: {first} ({mend})") from None
