"""Making the stores of a brand-new workspace: commands started together, and commands killed
half way, never leave a half-made store; one left by an older studyrunner is named with how to mend it.

Real processes: each opens the stores as `submit` does, released at one moment so their creations overlap."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import TINY_STUDY
from typer.testing import CliRunner

from studyrunner.cli import app
from studyrunner.store import Ledger
from studyrunner.store import schema_versions as ledger_schema
from studyrunner.store.db import sqlite_reader

pytestmark = pytest.mark.faults

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
# Imports first, then waits for the start file, so the processes open the stores at the same moment.
OPENER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401 - imported before the start
    from studyrunner.errors import StudyrunnerError
    from studyrunner.orchestrate.commands.preflight import open_stores
    from studyrunner.workspace import Workspace

    workspace, start = Workspace.resolve(sys.argv[1]), Path(sys.argv[2])
    Path(sys.argv[3]).touch()
    while not start.exists():
        time.sleep(0.005)
    try:
        open_stores(workspace)
    except StudyrunnerError as exc:
        sys.exit(f"error: {exc}")
    """
)


def open_together(ws: Path, root: Path, n: int) -> list[subprocess.CompletedProcess]:
    """`n` processes open the stores of the workspace `ws` at one moment (their start files in `root`)."""
    root.mkdir()
    start = root / "start"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, str(ws), str(start), str(root / f"ready-{i}")],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    while len(list(root.glob("ready-*"))) < n and all(p.poll() is None for p in procs):
        time.sleep(0.05)
    start.touch()
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=600), *p.communicate()) for p in procs]


def sqlite_tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as con:
        return {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


@pytest.mark.e2e
def test_commands_started_together_in_a_new_workspace_all_open_it(tmp_path):
    """Three submits into one new workspace, three rounds: each used to fail 3 rounds in 4 (`table
    _alembic_tmp_experiments already exists`), bricking the workspace for every later command."""
    for round_ in range(3):
        ws = tmp_path / f"ws-{round_}"
        ended = open_together(ws, tmp_path / f"round-{round_}", 3)
        assert [p.returncode for p in ended] == [0, 0, 0], [p.stderr.strip().splitlines()[-1:] for p in ended]
        assert not {t for t in sqlite_tables(ws / "mlflow.db") if t.startswith("_alembic_tmp_")}
        assert ledger_schema.current(Ledger(f"sqlite:///{ws / 'ledger.db'}").engine) == ledger_schema.head()
        (later,) = open_together(ws, tmp_path / f"later-{round_}", 1)  # and every command after them
        assert later.returncode == 0, later.stderr


def _mlflow_store(path: Path, runs: int) -> None:
    """An MLflow store holding `runs` runs, made in another process (MLflow keeps a store it opened in memory,
    and would not read this one's file again)."""
    make = f"""from mlflow import MlflowClient
client = MlflowClient("sqlite:///{path}")
experiment = client.create_experiment("e")
for _ in range({runs}):
    client.create_run(experiment)
"""
    subprocess.run([sys.executable, "-c", make], env=ENV, check=True, capture_output=True)


@pytest.mark.e2e
@pytest.mark.parametrize("runs", [0, 1])
def test_a_half_made_mlflow_store_is_named_with_how_to_mend_it(tmp_path, write_study, runs):
    """What a command stopped half way through MLflow's migrations leaves (and what racing submits left): a
    leftover `_alembic_tmp_*` table and no recorded revision. Every command said only MLflow's error."""
    ws = tmp_path / "ws"
    ws.mkdir()
    store = ws / "mlflow.db"
    _mlflow_store(store, runs)
    with sqlite3.connect(store) as con:
        con.execute("CREATE TABLE _alembic_tmp_experiments (experiment_id INTEGER)")
        con.execute("DELETE FROM alembic_version")
    study = write_study(TINY_STUDY)
    result = CliRunner().invoke(app, ["submit", str(study), "--workspace", str(ws), "--no-progress"])
    (line,) = result.stderr.strip().splitlines()
    assert result.exit_code == 1
    assert f"the MLflow store '{store}' is half-made (leftover table _alembic_tmp_experiments" in line
    if runs == 0:
        assert line.endswith(f"it holds no runs: delete mlflow.db (in {ws}) and run the command again")
        store.unlink()  # as it says; then the next command makes it anew
        (again,) = open_together(ws, tmp_path / "again", 1)
        assert again.returncode == 0, again.stderr
    else:
        assert "it holds 1 run: back it up" in line and f"mlflow db upgrade sqlite:///{store}" in line


MLFLOW_MAKER = textwrap.dedent(
    """
    import sys
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401 - imported before "go"
    from studyrunner.errors import StudyrunnerError
    from studyrunner.tracking.tracker import Tracker

    print("go", flush=True)
    try:
        Tracker(sys.argv[1])
    except StudyrunnerError as exc:
        sys.exit(f"error: {exc}")
    """
)


@pytest.mark.e2e
def test_an_mlflow_store_killed_while_being_made_is_finished_or_named_with_how_to_mend_it(tmp_path):
    """kill -9 at some moment of MLflow's migrations: the next command opens the store (MLflow continues its
    migrations), or says it is half-made and to delete it; after that, the next one makes it anew."""
    rng = random.Random(6)
    for i in range(2):
        uri = f"sqlite:///{tmp_path / f'mlflow-{i}.db'}"
        run = [sys.executable, "-c", MLFLOW_MAKER, uri]
        proc = subprocess.Popen(run, env=ENV, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "go"
        time.sleep(rng.uniform(0.5, 6))
        proc.kill()
        proc.wait()
        after = subprocess.run(run, env=ENV, capture_output=True, text=True)
        if after.returncode != 0:
            (line,) = after.stderr.strip().splitlines()[-1:]
            assert "is half-made" in line and f"it holds no runs: delete mlflow-{i}.db" in line, after.stderr
            (tmp_path / f"mlflow-{i}.db").unlink()
            again = subprocess.run(run, env=ENV, capture_output=True, text=True)
            assert again.returncode == 0, again.stderr


def test_an_empty_ledger_file_says_what_made_it_and_how_to_mend_it(tmp_path):
    (tmp_path / "ledger.db").touch()  # a submit killed right after SQLite created the file
    result = CliRunner().invoke(app, ["status", "--workspace", str(tmp_path)])
    assert result.exit_code == 1
    assert "ledger.db is empty (0 bytes: a submit stopped before it made the ledger there)" in result.stderr
    Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")  # submit makes it there
    assert CliRunner().invoke(app, ["status", "--workspace", str(tmp_path)]).exit_code == 0


# Creates (`new`) or upgrades (`old`: a first-release ledger) the ledger of argv[1], saying "go" just before.
LEDGER_WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[3])
    from studyrunner.store import schema_versions as schema
    from studyrunner.store.db import make_engine

    url = sys.argv[1]
    if sys.argv[2] == "old":
        from test_ledger import _first_release_ledger

        _first_release_ledger(url)
    engine = make_engine(url)
    schema.current(engine, url)
    print("go", flush=True)
    schema.create(engine) if sys.argv[2] == "new" else schema.upgrade(engine, url)
    """
)


@pytest.mark.e2e
@pytest.mark.parametrize("what", ["new", "old"])
def test_a_ledger_killed_while_being_made_or_upgraded_is_left_whole(tmp_path, what):
    """kill -9 at any moment of a ledger's creation (or upgrade) leaves it as it was or as it would be, never
    between: no tables without their revision, no `_alembic_tmp_*` table, no empty `alembic_version`."""
    rng = random.Random(21)
    for i in range(8):
        url = f"sqlite:///{tmp_path / f'ledger-{i}.db'}"
        proc = subprocess.Popen(
            [sys.executable, "-c", LEDGER_WRITER, url, what, str(Path(__file__).parent)],
            env=ENV,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline().strip() == "go"
        time.sleep(rng.uniform(0, 0.15))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        tables = sqlite_tables(tmp_path / f"ledger-{i}.db")
        assert not {t for t in tables if t.startswith("_alembic_tmp_")}
        engine, _ = sqlite_reader(url)  # read as `status` does, writing nothing
        revision = ledger_schema.current(engine, url)  # raises on a ledger between revisions
        engine.dispose()
        before = None if what == "new" else ledger_schema.FIRST
        assert revision in (before, ledger_schema.head()), (i, revision, sorted(tables))
