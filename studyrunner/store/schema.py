"""Ledger schema versions (Alembic). A new ledger is created at the newest revision; an older one is
refused, with the command that upgrades it (`studyrunner db upgrade`), rather than changed behind the
user's back: ledgers are often shared (PostgreSQL) and outlive the code that wrote them.

Ledgers written before migrations existed have no `alembic_version` table; they are revision 0001.
A schema change is a new file in migrations/versions/ plus the matching change to `db.py`; a test
checks that migrating from nothing gives exactly the tables `db.py` declares.
"""

from __future__ import annotations

import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect
from sqlalchemy.exc import SQLAlchemyError

from ..errors import StudyrunnerError
from .db import Base, TrialRow

FIRST = "0001"  # the schema of the first release, which had no version table


def _config(connection=None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    cfg.attributes["connection"] = connection
    return cfg


def head() -> str:
    return ScriptDirectory.from_config(_config()).get_current_head()


def current(engine: Engine) -> str | None:
    """The ledger's revision; None for a database without a ledger."""
    if not inspect(engine).has_table(TrialRow.__tablename__):
        return None
    with engine.connect() as conn:
        rev = MigrationContext.configure(conn).get_current_revision()
    return rev or _unversioned(engine)


def _unversioned(engine: Engine) -> str:
    """The revision of a ledger without a version table, read from its columns: the first release's
    (0001), or one from development builds that added cells.baseline_of before migrations (0002)."""
    cells = {c["name"] for c in inspect(engine).get_columns("cells")}
    return "0002" if "baseline_of" in cells else FIRST


def create(engine: Engine) -> None:
    """A new ledger, at the newest revision. Two processes creating one ledger at once (two submits on
    a fresh workspace) both succeed: the loser of the race finds the winner's ledger."""
    try:
        Base.metadata.create_all(engine)
        with engine.begin() as conn:
            command.stamp(_config(conn), "head")
    except SQLAlchemyError:
        for _ in range(50):
            time.sleep(0.1)
            if current(engine) == head():
                return
        raise


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Bring the ledger to the newest revision; returns (before, after)."""
    before = current(engine)
    with engine.begin() as conn:
        cfg = _config(conn)
        if before is not None and MigrationContext.configure(conn).get_current_revision() is None:
            command.stamp(cfg, before)  # an unversioned ledger: record what it is, then upgrade from there
        command.upgrade(cfg, "head")
    return before, head()


def check_current(engine: Engine, url: str) -> None:
    rev, newest = current(engine), head()
    if rev != newest:
        raise StudyrunnerError(
            f"the ledger {url!r} is at schema revision {rev}, this studyrunner needs {newest}: "
            f"back it up if you like, then run: studyrunner db upgrade --db '{url}'"
        )
