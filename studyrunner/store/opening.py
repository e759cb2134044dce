"""Opening a ledger's database: every way it fails as one line, read-only engines, a write-free probe, and
`LedgerDatabase`, the engine and sessions every part of the `Ledger` (ledger.py) works through."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ..errors import StudyrunnerError
from ..urls import mask_text, mask_url
from . import schema_versions
from .db import make_engine, sqlite_reader


def _writable(path: Path) -> bool:
    """Can SQLite write the file (and, for its journal, the folder it is in)?"""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def _sqlite_path(url: str) -> Path | None:
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None


@contextmanager
def database_errors(url: str, option: str = "--db / STUDYRUNNER_DB") -> Iterator[None]:
    """Opening a database: every way it fails is one line naming the URL (its password masked, also where the
    driver's message quotes it) and the option to mend."""
    shown = mask_url(url)
    try:
        yield
    except StudyrunnerError:
        raise
    except NoSuchModuleError:
        raise StudyrunnerError(
            f"cannot open results database {shown!r}: not a database URL SQLAlchemy knows ({option}); "
            "use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
        ) from None
    except ImportError as exc:
        raise StudyrunnerError(
            f"{option}: cannot open {shown!r}: its database driver is not installed ({mask_text(str(exc), url)}); "
            "install it (postgresql: EXTRAS=dev,postgres ./setup.sh) or use sqlite:///PATH"
        ) from None
    except (ArgumentError, SQLAlchemyError, OSError, sqlite3.Error) as exc:
        first = str(exc.args[0] if exc.args else exc).strip().splitlines()[0]
        first = mask_text(first, url)
        raise StudyrunnerError(f"cannot open results database {shown!r}: {first} (check {option})") from None


def _refuse_folder(path: Path | None) -> None:
    if path is not None and path.is_dir():
        raise StudyrunnerError(
            f"{str(path)!r} is a folder, not a ledger file (check --db / STUDYRUNNER_DB: sqlite:///PATH names the "
            "ledger file itself, e.g. sqlite:///results/ledger.db)"
        )


def open_engine(url: str, *, read_only: bool = False) -> tuple[Engine, str | None]:
    """An engine on an existing database (errors as one line); for an SQLite file with `read_only`, one
    that writes nothing (db.sqlite_reader). Returns (engine, read mode: None, "read-only" or "immutable")."""
    path = _sqlite_path(url)
    _refuse_folder(path)
    if path is not None and not path.is_file():
        raise StudyrunnerError(
            f"no results ledger at {str(path)!r}: nothing was submitted with this workspace "
            "(check --db / --workspace / STUDYRUNNER_HOME, or run: studyrunner submit FILE)"
        )
    with database_errors(url):
        if read_only and path is not None:
            return sqlite_reader(url)
        return make_engine(url), None


def probe(url: str) -> None:
    """Check that a ledger URL can be used, writing nothing: the URL parses, its driver is installed, a
    server database answers, and an SQLite file that exists is a ledger or empty (read-only: a file that is
    not a ledger is refused as it was; one is created only when the ledger is). One line if not."""
    with database_errors(url):
        parsed = make_url(url)
        parsed.get_dialect()
        if parsed.get_backend_name() != "sqlite":
            with make_engine(url).connect():
                pass
            return
        path = _sqlite_path(url)
        _refuse_folder(path)
        if path is not None and path.is_file() and path.stat().st_size > 0:
            engine, _mode = sqlite_reader(url)
            try:
                schema_versions.current(engine, url)
            finally:
                engine.dispose()


class LedgerDatabase:
    """Open the ledger at `url`: its engine and sessions, the base every part of the `Ledger` builds on.

    `create=False` (commands that work on what was submitted) opens an existing ledger only, so a mistyped
    --db or workspace says so instead of looking like an empty ledger. `read_only=True` (the read verbs:
    status, results, analyze, verify, report) also writes nothing: an SQLite ledger is opened read-only,
    or as an immutable snapshot on a read-only mount; `read_mode` then says which (None: read-write).

    A database that holds tables but no ledger (an app's, MLflow's store) is refused, never made into one."""

    def __init__(self, url: str, create: bool = True, read_only: bool = False):
        self.url = url
        self.read_mode: str | None = None
        path = _sqlite_path(url)
        if not read_only:
            self.check_writable(url)
        with database_errors(url):
            if create and not read_only:
                if path is not None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                self.engine = make_engine(url)
            else:
                self.engine, self.read_mode = open_engine(url, read_only=read_only)
            if schema_versions.current(self.engine, url) is None:
                if not create or read_only:
                    empty = path is not None and path.is_file() and path.stat().st_size == 0
                    raise StudyrunnerError(
                        f"{path} is empty (0 bytes: a submit stopped before it made the ledger there); `studyrunner "
                        "submit` makes it, or delete the file"
                        if empty
                        else f"{mask_url(url)!r} holds no studyrunner ledger (check --db / STUDYRUNNER_DB, or submit a "
                        "study first)"
                    )
                schema_versions.create(self.engine)
            schema_versions.check_current(self.engine, url)
        self._session = sessionmaker(self.engine, expire_on_commit=False)

    @staticmethod
    def check_writable(url: str) -> None:
        """Before a command writes to an SQLite ledger: one line if its file cannot be written."""
        path = _sqlite_path(url)
        if path is not None and path.is_file() and not _writable(path):
            raise StudyrunnerError(
                f"the results ledger {str(path)!r} cannot be written (a read-only location) and this command writes "
                "to it: copy the workspace somewhere writable (status, results, analyze, verify, report read it as is)"
            )

    @property
    def read_note(self) -> str | None:
        """A line for the user when the ledger could only be opened read-only (a read-only location)."""
        if self.read_mode != "immutable":
            return None
        path = _sqlite_path(self.url)
        wal = path.with_name(path.name + "-wal") if path else None
        unread = wal is not None and wal.is_file() and wal.stat().st_size > 0
        return f"{path} is on a read-only location: reading it as an immutable snapshot" + (
            f"; its write-ahead log ({wal.name}, not yet merged) cannot be read there, so the last writes "
            "may be missing (copy the folder somewhere writable to see them)"
            if unread
            else ""
        )

    def session(self) -> Session:
        return self._session()
