"""`studyrunner db current|upgrade` (and every verb that opens a ledger) check what they touch: a database that
is not a ledger is refused and left as it was; an odd or newer revision, and a bad URL, are one line each.
SQLite, and a real PostgreSQL on 127.0.0.1 where its binaries are installed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from conftest import TINY_STUDY
from sqlalchemy import create_engine, inspect, text
from test_ledger import postgres_url  # noqa: F401 - a fixture
from typer.testing import CliRunner

from studyrunner.cli import app
from studyrunner.errors import StudyrunnerError
from studyrunner.store import Ledger
from studyrunner.store import schema_versions as ledger_schema


def run(*args: str):
    result = CliRunner().invoke(app, list(args))
    lines = result.stderr.strip().splitlines()
    return result.exit_code, lines


def tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def app_database(path: Path) -> str:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO users (name) VALUES ('ada')")
    con.commit()
    con.close()
    return f"sqlite:///{path}"


def mlflow_store(path: Path) -> str:
    from mlflow import MlflowClient

    url = f"sqlite:///{path}"
    MlflowClient(url).search_experiments()  # creates MLflow's tables (and its own alembic_version)
    return url


@pytest.mark.parametrize("kind", ["app", "mlflow"])
def test_a_database_with_other_tables_is_refused_and_left_as_it_was(tmp_path, kind):
    url = app_database(tmp_path / "app.db") if kind == "app" else mlflow_store(tmp_path / "mlflow.db")
    before = tables(url)
    for verb in (["db", "upgrade"], ["db", "current"], ["status"], ["results"]):
        code, lines = run(*verb, "--db", url)
        assert code == 1 and len(lines) == 1, (verb, lines)
        assert "holds tables" in lines[0] and "but no studyrunner ledger" in lines[0], lines
    with pytest.raises(StudyrunnerError, match="holds tables .* but no studyrunner ledger"):
        Ledger(url)  # what submit opens: never made into a ledger
    assert tables(url) == before


@pytest.mark.parametrize("kind", ["app", "mlflow"])
def test_a_refused_database_keeps_its_bytes_and_journal_mode(tmp_path, kind):
    """Refusing a database must not change it first (a `db upgrade` that opened it for writing would turn a
    foreign SQLite file's journal from `delete` to `wal`). Every verb that opens a ledger leaves its bytes as they
    were and creates nothing beside it; `submit` refuses it before making an MLflow store."""
    path = tmp_path / f"{kind}.db"
    url = app_database(path) if kind == "app" else mlflow_store(path)
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    before = path.read_bytes()
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY_STUDY)
    ws = tmp_path / "ws"
    verbs = (["db", "upgrade"], ["db", "current"], ["status"], ["submit", str(study), "--workspace", str(ws)])
    for verb in verbs:
        code, lines = run(*verb, "--db", url)
        assert code == 1 and "but no studyrunner ledger" in lines[-1], (verb, lines)
        assert path.read_bytes() == before, verb
        assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, "tiny.yaml"], verb  # no -wal, -shm, ws
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_an_empty_database_has_no_ledger_to_upgrade(tmp_path):
    path = tmp_path / "empty.db"
    path.touch()
    url = f"sqlite:///{path}"
    for verb, says in ((["db", "upgrade"], "nothing to upgrade"), (["db", "current"], "holds no studyrunner ledger")):
        code, lines = run(*verb, "--db", url)
        assert code == 1 and len(lines) == 1 and says in lines[0], (verb, lines)
    assert tables(url) == set()
    Ledger(url)  # the first submit makes it a ledger
    assert ledger_schema.LEDGER_TABLES <= tables(url)
    code, lines = run("db", "current", "--db", url)
    assert code == 0


def _versions(url: str, *revisions: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM alembic_version"))
        for rev in revisions:
            conn.execute(text("INSERT INTO alembic_version (version_num) VALUES (:v)"), {"v": rev})
    engine.dispose()


@pytest.mark.parametrize(
    ("revisions", "says"),
    [
        (("0099",), "written by a newer studyrunner (schema revision 0099)"),
        ((), "empty alembic_version table"),
        (("0002", "0003"), "records 2 schema revisions (0002, 0003)"),
    ],
    ids=["newer", "no-row", "two-rows"],
)
def test_an_odd_revision_is_one_line_everywhere(tmp_path, revisions, says):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    Ledger(url)
    _versions(url, *revisions)
    for verb in (["db", "current"], ["db", "upgrade"], ["status"]):
        code, lines = run(*verb, "--db", url)
        assert code == 1 and len(lines) == 1 and says in lines[0], (verb, lines)
        assert "db upgrade" not in lines[0] or says.startswith("records")  # never "upgrade it" for a newer ledger


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("notaurl", "cannot open results database 'notaurl'"),
        ("postgresql+psycopg://postgres@127.0.0.1:1/ledger", "cannot open results database"),
        ("mysql://user@127.0.0.1/ledger", "driver is not installed"),
    ],
    ids=["not-a-url", "unreachable-postgresql", "mysql"],
)
def test_a_bad_url_is_one_line_for_every_verb(url, says):
    for verb in (["db", "current"], ["db", "upgrade"], ["status"], ["results"]):
        code, lines = run(*verb, "--db", url)
        assert code == 1 and len(lines) == 1 and says in lines[0], (verb, lines)
        assert "unexpected" not in lines[0]


def test_db_current_names_an_older_revision_and_its_upgrade(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    Ledger(url)
    code, lines = run("db", "current", "--db", url)
    assert code == 0
    result = CliRunner().invoke(app, ["db", "current", "--db", url])
    assert f"revision {ledger_schema.head()}" in result.stdout and "current" in result.stdout


@pytest.mark.e2e
def test_postgresql_with_other_tables_is_refused_and_left_as_it_was(postgres_url):  # noqa: F811
    engine = create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE users (id INTEGER PRIMARY KEY)"))
    try:
        for verb in (["db", "upgrade"], ["status"]):
            code, lines = run(*verb, "--db", postgres_url)
            assert code == 1 and len(lines) == 1 and "holds tables (users) but no studyrunner ledger" in lines[0]
        with pytest.raises(StudyrunnerError, match="but no studyrunner ledger"):
            Ledger(postgres_url)
        assert tables(postgres_url) == {"users"}
    finally:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE users"))
        engine.dispose()
