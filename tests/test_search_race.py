"""Two submits of one new search started at the same moment: exactly one runs it, on an SQLite
and a PostgreSQL ledger. Real processes, each with its own Ray, real Optuna storage, tiny models.

Both processes import everything first and then wait at a barrier (a file the test creates), so they reach the
search's claim within milliseconds of each other: before the claim was atomic, both ran the search in nearly every
round (6 configurations for `n_trials: 3`, numbers interleaved). `STUDYRUNNER_RACE_ROUNDS` sets the rounds per
ledger (2 by default; the fix was checked with 10)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from test_ledger import postgres_url  # noqa: F401 - the throwaway PostgreSQL server fixture
from test_search import optuna_trials, search_text

from studyrunner.store import Ledger
from studyrunner.tracking.tracker import Tracker
from studyrunner.workspace import Workspace

pytestmark = pytest.mark.e2e

ROUNDS = int(os.environ.get("STUDYRUNNER_RACE_ROUNDS", "2"))
N_TRIALS = 3
# Everything a submit imports, then the barrier, then the CLI: the two submits start their claims together.
AT_THE_BARRIER = """\
import os, sys, time
from pathlib import Path
import ray, optuna, mlflow, ray.tune.search.optuna  # noqa: F401 - imported before the barrier
import studyrunner.orchestrate.commands.runner, studyrunner.orchestrate.feeds.search  # noqa: F401
from studyrunner.cli import app
go = Path(sys.argv[1])
Path(f"{go}.{os.getpid()}.ready").touch()
while not go.exists():
    time.sleep(0.002)
app(sys.argv[2:], prog_name="studyrunner")
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.mark.faults
def test_two_submits_of_a_new_search_at_the_same_moment_run_it_once(tmp_path, ledger_url):
    ws = Workspace.resolve(tmp_path, db=ledger_url)
    # The stores exist before the race: this test is about the search, not about creating a workspace.
    Ledger(ws.db_url)
    Tracker(ws.tracking_uri)
    env = {**os.environ, "STUDYRUNNER_HOME": str(tmp_path), "STUDYRUNNER_DB": ledger_url}
    for name in ("MLFLOW_TRACKING_URI", "STUDYRUNNER_STORAGE"):
        env.pop(name, None)
    script = tmp_path / "at_the_barrier.py"
    script.write_text(AT_THE_BARRIER)
    losers = 0
    suffix = "pg" if ledger_url.startswith("postgresql") else "lite"
    for n in range(ROUNDS):
        name = f"race{suffix}{n}"
        study = tmp_path / f"{name}.yaml"
        study.write_text(search_text(name, n_trials=N_TRIALS, sampler="random", seeds="[0]"))
        go = tmp_path / f"go-{n}"
        submits = [
            subprocess.Popen(
                [sys.executable, str(script), str(go), "submit", str(study), "--no-progress"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(2)
        ]
        deadline = time.monotonic() + 300
        while not all(Path(f"{go}.{p.pid}.ready").exists() or p.poll() is not None for p in submits):
            assert time.monotonic() < deadline, "the submits did not reach the barrier"
            time.sleep(0.1)
        go.touch()
        outputs = [p.communicate(timeout=600)[0] for p in submits]
        assert [p.returncode for p in submits] == [0, 0], "\n----\n".join(outputs)
        busy = [o for o in outputs if "another submit runs this search" in o]
        losers += len(busy)
        assert len(busy) <= 1, "\n----\n".join(outputs)
        for line in busy:  # one line, and the loser reports no unfinished work
            assert "not finished" not in line and "resume with" not in line

        ledger = Ledger(ws.db_url)
        points = ledger.search_points(name)
        assert [p.number for p in points] == list(range(N_TRIALS)), "\n----\n".join(outputs)
        assert {p.state for p in points} == {"complete"}
        trials = ledger.trials(name)
        assert len(trials) == N_TRIALS and {t.cell_hash for t in trials} == {p.cell_hash for p in points}
        assert all(t.status == "succeeded" and t.attempts == 1 for t in trials)  # each configuration ran once
        told = optuna_trials(ws.db_url, name)
        assert [(t.number, t.state) for t in told] == [(i, optuna.trial.TrialState.COMPLETE) for i in range(N_TRIALS)]
        assert ledger.get_study(name).owner is None  # given back when the winner ended
    assert losers >= 1  # the race was run: at least once, a submit found the search taken
