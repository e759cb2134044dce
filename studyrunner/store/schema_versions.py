"""Ledger schema versions (Alembic). A new ledger is created at the newest revision; an older one is
refused, with the command that upgrades it (`studyrunner db upgrade`), rather than changed behind the
user's back: ledgers are often shared (PostgreSQL) and outlive the code that wrote them.

Ledgers written before migrations existed have no `alembic_version` table; they are revision 0001.
A schema change is a new file in migrations/versions/ plus the matching change to `db.py`; a test
checks that migrating from nothing gives exactly the tables `db.py` declares.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import SQLAlchemyError

from ..errors import StudyrunnerError
from ..urls import mask_url
from ..workspace import hint
from .db import LEDGER_TABLES, Base

FIRST = "0001"  # the schema of the first release, which had no version table


def _config(connection=None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    cfg.attributes["connection"] = connection
    return cfg


def head() -> str:
    return ScriptDirectory.from_config(_config()).get_current_head()


VERSION_TABLE = "alembic_version"


def _known_revisions() -> list[str]:
    return [rev.revision for rev in ScriptDirectory.from_config(_config()).walk_revisions()]


def current(engine: Engine, url: str = "") -> str | None:
    """The ledger's revision; None for an empty database (no tables: a ledger may be created there).

    Raises StudyrunnerError, naming the database, for one that holds other tables (an app's, MLflow's,
    Optuna's), and for a ledger whose recorded revision is missing, recorded twice or unknown to this
    studyrunner (a newer one wrote it)."""
    where = mask_url(url) if url else engine.url.render_as_string(hide_password=True)
    tables = set(inspect(engine).get_table_names())
    if not tables - {VERSION_TABLE}:
        return None
    trial_columns = {c["name"] for c in inspect(engine).get_columns("trials")} if "trials" in tables else set()
    if not LEDGER_TABLES <= tables or "trial_key" not in trial_columns:
        shown = ", ".join(sorted(tables)[:6]) + (", ..." if len(tables) > 6 else "")
        raise StudyrunnerError(
            f"{where!r} holds tables ({shown}) but no studyrunner ledger; point --db at a ledger, or at a new "
            "(empty) database for a new one"
        )
    if VERSION_TABLE not in tables:
        return _unversioned(engine)
    with engine.connect() as conn:
        revisions = [row[0] for row in conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))]
    if not revisions:
        raise StudyrunnerError(
            f"the ledger {where!r} has an empty {VERSION_TABLE} table, so its schema revision is unknown; "
            f"restore it from a backup, or record the revision by hand (studyrunner db current names this one's)"
        )
    if len(revisions) > 1:
        raise StudyrunnerError(
            f"the ledger {where!r} records {len(revisions)} schema revisions ({', '.join(sorted(revisions))}) "
            f"where there must be one; keep the right row of its {VERSION_TABLE} table (this studyrunner: {head()})"
        )
    (revision,) = revisions
    if revision not in _known_revisions():
        raise StudyrunnerError(
            f"the ledger {where!r} was written by a newer studyrunner (schema revision {revision}); this one "
            f"knows revisions up to {head()}: upgrade studyrunner to read it"
        )
    return revision


def _unversioned(engine: Engine) -> str:
    """The revision of a ledger without a version table, read from its columns: the first release's
    (0001), or one from development builds that added cells.baseline_of before migrations (0002)."""
    cells = {c["name"] for c in inspect(engine).get_columns("cells")}
    return "0002" if "baseline_of" in cells else FIRST


def create(engine: Engine) -> None:
    """A new ledger, at the newest revision, in one transaction (tables and version row together, so no
    reader sees a ledger without its revision, and a process killed half way leaves an empty database). Two
    processes creating one ledger at once (two submits on a fresh workspace) both succeed: the loser of the
    race finds the winner's ledger."""
    try:
        with _transaction(engine) as conn:
            Base.metadata.create_all(conn)
            command.stamp(_config(conn), "head")
    except SQLAlchemyError:
        for _ in range(50):
            time.sleep(0.1)
            try:
                if current(engine) == head():
                    return
            except StudyrunnerError:
                pass  # the winner is still writing
        raise


def upgrade(engine: Engine, url: str = "") -> tuple[str | None, str]:
    """Bring the ledger to the newest revision (an empty database: migrate from nothing); returns (before,
    after). A database holding other tables is refused, as `current` says."""
    before = current(engine, url)
    with _transaction(engine) as conn:
        cfg = _config(conn)
        if before is not None and MigrationContext.configure(conn).get_current_revision() is None:
            command.stamp(cfg, before)  # an unversioned ledger: record what it is, then upgrade from there
        command.upgrade(cfg, "head")
    return before, head()


@contextmanager
def _transaction(engine: Engine) -> Iterator[Connection]:
    """One transaction around DDL, so a command killed half way changes nothing: on SQLite begun by hand
    (pysqlite runs DDL outside any transaction otherwise, and a migration stopped between copying a table and
    renaming it back would leave an `_alembic_tmp_*` table), and IMMEDIATE, so a second writer waits."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        yield conn
        conn.commit()


def check_current(engine: Engine, url: str) -> None:
    rev, newest = current(engine, url), head()
    if rev != newest:
        raise StudyrunnerError(
            f"the ledger {mask_url(url)!r} is at schema revision {rev}, this studyrunner needs {newest}: "
            f"back it up if you like, then run: {hint('db', 'upgrade', flags=(('--db', url),))}"
        )
