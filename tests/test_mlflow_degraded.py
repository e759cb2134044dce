"""MLflow going away mid-study: the guard keeps the driver going, `sync-mlflow` backfills afterwards.

(a) MlflowGuard alone (a fake tracker and clock); (b) sync_mlflow on a ledger built without Ray against
an SQLite MLflow store; (c) a real `mlflow server` killed and restarted on the same port and store.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from sqlalchemy import update

from studyrunner.errors import StudyrunnerError
from studyrunner.store import CurveStore, Ledger
from studyrunner.store.db import TrialRow
from studyrunner.study import compile_study, loads
from studyrunner.tracking.guard import MlflowGuard
from studyrunner.tracking.http import HTTP_DEFAULTS
from studyrunner.tracking.sync import sync_mlflow
from studyrunner.tracking.tracker import Tracker

STUDY = """\
name: degraded
task: {name: phop, params: {alphabet: 4, seq_len: 12, hops: 1}}
model: {family: looped, params: {d_model: 16, n_heads: 2, block_layers: 1, loops: 1}}
train: {steps: 12, batch_size: 16, log_every: 4}
grid:
  model.params.loops: [1, 2]
seeds: [0, 1, 2]
metric: {name: eval_accuracy, mode: max}
"""
# train_loss every 4 steps, eval_accuracy at 6 and 12: rows carry different metrics (NaN in Parquet)
STEPS = {"train_loss": [0, 4, 8, 12], "eval_accuracy": [6, 12]}


def curve(seed: int) -> list[dict]:
    rows: dict[int, dict] = {}
    for key, steps in STEPS.items():
        for step in steps:
            rows.setdefault(step, {"step": step})[key] = round(1.0 / (step + 1 + seed), 4)
    return [rows[s] for s in sorted(rows)]


def metrics_of(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "step"}


def final(seed: int) -> dict:
    last = curve(seed)[-1]
    return {"train_loss": last["train_loss"], "eval_accuracy": last["eval_accuracy"], "effective_depth": 1.0}


@pytest.fixture
def http_defaults(monkeypatch):
    """The guard sets MLflow's HTTP retry variables for the process: keep them out of other tests."""
    for name, value in HTTP_DEFAULTS.items():
        monkeypatch.setenv(name, value)


# --- (a) the guard --------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeTracker:
    uri = "http://mlflow.invalid"

    def __init__(self):
        self.broken = False
        self.calls = 0

    def log(self, value: int) -> int:
        self.calls += 1
        if self.broken:
            raise ConnectionError("connection refused")
        return value


def test_guard_skips_while_down_and_probes_after_retry_after(http_defaults):
    tracker, clock, said = FakeTracker(), Clock(), []
    guard = MlflowGuard(tracker, retry_after_s=30, study="degraded", clock=clock, warn=said.append)
    assert guard.call(tracker.log, 1) == (True, 1) and not guard.down

    tracker.broken = True
    assert guard.call(tracker.log, 2) == (False, None)
    assert guard.down and tracker.calls == 2
    assert len(said) == 1 and "unreachable (connection refused)" in said[0]
    assert "studyrunner sync-mlflow degraded" in said[0] and tracker.uri in said[0]

    for _ in range(5):  # skipped without trying
        clock.now += 5
        assert guard.call(tracker.log, 3) == (False, None)
    assert tracker.calls == 2

    clock.now += 6  # 31 s after the failure: one probe, which fails; nothing new is said
    assert guard.call(tracker.log, 4) == (False, None)
    assert tracker.calls == 3 and guard.down and len(said) == 1
    assert guard.call(tracker.log, 5) == (False, None) and tracker.calls == 3

    tracker.broken = False
    clock.now += 29
    assert guard.call(tracker.log, 6) == (False, None) and tracker.calls == 3  # not yet
    clock.now += 1
    assert guard.call(tracker.log, 7) == (True, 7)
    assert not guard.down and said[-1].startswith("MLflow is back")
    assert guard.call(tracker.log, 8) == (True, 8) and tracker.calls == 5
    assert guard.outages == 1 and guard.ever_down and len(said) == 2


def test_a_refused_request_is_not_an_outage(http_defaults):
    said = []
    guard = MlflowGuard(FakeTracker(), warn=said.append)

    def refuse():
        raise MlflowException("Changing param values is not allowed", error_code=INVALID_PARAMETER_VALUE)

    assert guard.call(refuse) == (False, None)
    assert guard.call(refuse) == (False, None)
    assert not guard.down and guard.outages == 0
    assert len(said) == 1 and said[0].startswith("MLflow refused refuse: Changing param values")


def test_guard_keeps_the_users_http_settings(monkeypatch):
    for name, value in HTTP_DEFAULTS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "42")
    MlflowGuard(FakeTracker())
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "42"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == HTTP_DEFAULTS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]


def test_guard_is_thread_safe_and_probes_one_at_a_time(http_defaults):
    tracker, said = FakeTracker(), []
    guard = MlflowGuard(tracker, retry_after_s=0.0, warn=said.append)
    lock, inside, most = threading.Lock(), [0], [0]

    def log(value: int) -> int:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            time.sleep(0.002)
            return tracker.log(value)
        finally:
            with lock:
                inside[0] -= 1

    tracker.broken = True
    guard.call(log, 0)
    assert guard.down
    results: list[tuple[bool, object]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker(n: int) -> None:
        try:
            while not stop.is_set():
                results.append(guard.call(log, n))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(results) < 500 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert most[0] == 1  # while down, only the probing thread ever reached MLflow
    tracker.broken = False
    while guard.down and time.monotonic() < deadline:
        time.sleep(0.01)
    calls = tracker.calls
    while tracker.calls < calls + 50 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    assert not errors and not guard.down and guard.outages == 1
    assert [s.split(" ")[1] for s in said] == ["at", "is"]  # one "unreachable", one "is back"
    assert sum(ok for ok, _ in results) >= 50 and not results[0][0]


# --- building a study's records without Ray ---------------------------------------------------------


def _set(ledger: Ledger, key: str, **values) -> None:
    with ledger.session() as s, s.begin():
        s.execute(update(TrialRow).where(TrialRow.trial_key == key).values(**values))


class Study:
    """The study registered in a ledger, with an MLflow experiment and cell runs as `submit` makes them."""

    def __init__(self, root: Path, tracking_uri: str):
        root.mkdir(parents=True, exist_ok=True)
        path = root / "degraded.yaml"
        path.write_text(STUDY)
        self.compiled = compile_study(loads(STUDY, source=str(path)))
        self.study = self.compiled.study
        self.ledger = Ledger(f"sqlite:///{root / 'ledger.db'}")
        self.ledger.register(self.compiled)
        self.curves = CurveStore(str(root))
        self.tracker = Tracker(tracking_uri)
        self.experiment_id = self.tracker.experiment("degraded", (root / "mlartifacts").as_uri())
        self.ledger.set_experiment("degraded", self.experiment_id)
        self.parents = {}
        for cell in self.compiled.cells:
            self.parents[cell.cell_hash] = self.tracker.cell_run(self.experiment_id, self.study, cell, None)
            self.ledger.set_cell_run("degraded", cell.cell_hash, self.parents[cell.cell_hash])
        self.trials = self.compiled.trials

    def new_run(self, trial) -> str:
        return self.tracker.trial_run(self.experiment_id, self.parents[trial.cell_hash], self.study, trial)

    def log(self, run_id: str, seed: int, upto: int = 99) -> None:
        for row in curve(seed):
            if row["step"] <= upto:
                self.tracker.log_metrics(run_id, row["step"], metrics_of(row))

    def history(self, run_id: str) -> dict[str, list[int]]:
        client = self.tracker.client
        keys = (*STEPS, "effective_depth")
        return {k: sorted(m.step for m in client.get_metric_history(run_id, k)) for k in keys}

    def row(self, key: str) -> TrialRow:
        return self.ledger.trials_by_key([key])[0]

    def sync(self):
        return sync_mlflow(self.ledger, self.tracker, self.curves, "degraded")


FULL = {"train_loss": [0, 4, 8, 12], "eval_accuracy": [6, 12], "effective_depth": [12]}


def test_a_run_mlflow_cannot_read_now_is_continued_later_not_replaced(tmp_path, http_defaults, monkeypatch):
    """A new attempt of a trial whose run MLflow fails to read (down, timing out) must not give the trial
    a second run: only a run the store says is gone is replaced (the sync continues the ledger's run)."""
    from studyrunner.orchestrate.cluster.recorder import Recorder

    s = Study(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")
    trial, client = s.trials[0], s.tracker.client
    run_id = s.new_run(trial)
    s.ledger.mark_running(trial.trial_key, run_id)
    said: list[str] = []
    recorder = Recorder(s.compiled, s.ledger, s.tracker, s.curves, s.experiment_id, s.parents, warn=said.append)
    get_run = client.get_run

    def timing_out(run):
        raise MlflowException(f"API request to {s.tracker.uri}/api/2.0/mlflow/runs/get failed: Read timed out")

    monkeypatch.setattr(client, "get_run", timing_out)
    assert recorder._open_run(trial.trial_key) is None  # no run this attempt; the trial is flagged
    assert recorder.mlflow.down and len(said) == 1 and "unreachable" in said[0]
    assert s.row(trial.trial_key).mlflow_dirty and s.row(trial.trial_key).mlflow_run_id == run_id
    monkeypatch.setattr(client, "get_run", get_run)
    runs = client.search_runs([s.experiment_id], "tags.kind = 'trial'")
    assert [r.info.run_id for r in runs] == [run_id]
    with pytest.raises(MlflowException):  # the cell's parent run is not replaced on a failed read either
        monkeypatch.setattr(client, "get_run", timing_out)
        s.tracker.cell_run(s.experiment_id, s.study, s.compiled.cells[0], s.parents[trial.cell_hash])
    monkeypatch.setattr(client, "get_run", get_run)

    client.delete_run(run_id)  # gone, as the store says: a new attempt gets a new run
    recorder = Recorder(s.compiled, s.ledger, s.tracker, s.curves, s.experiment_id, s.parents, warn=said.append)
    replacement = recorder._open_run(trial.trial_key)
    assert replacement not in (None, run_id) and not recorder.mlflow.down


# --- (b) sync against an SQLite store ---------------------------------------------------------------


def test_sync_backfills_missing_runs_and_points_once(tmp_path):
    s = Study(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")
    clean, no_run, dirty, deleted, cancelled, never = s.trials
    client = s.tracker.client

    # clean: everything reached MLflow while it ran (the curve, then the final metrics it lacks, as the driver
    # logs them at the end)
    run_clean = s.new_run(clean)
    s.ledger.mark_running(clean.trial_key, run_clean)
    s.log(run_clean, clean.seed)
    s.tracker.log_metrics(run_clean, 12, {"effective_depth": 1.0})
    s.curves.write("degraded", clean.trial_key, curve(clean.seed))
    s.ledger.mark_succeeded(clean.trial_key, final(clean.seed))
    s.tracker.set_outcome(run_clean, "succeeded")
    clean_before = s.history(run_clean)

    # no_run: MLflow was down when it started, so it never got one
    s.ledger.mark_running(no_run.trial_key, None)
    s.ledger.set_mlflow_dirty(no_run.trial_key)
    s.curves.write("degraded", no_run.trial_key, curve(no_run.seed))
    s.ledger.mark_succeeded(no_run.trial_key, final(no_run.seed))

    # dirty: MLflow went away after step 4; the trial failed later
    run_dirty = s.new_run(dirty)
    s.ledger.mark_running(dirty.trial_key, run_dirty)
    s.log(run_dirty, dirty.seed, upto=4)
    s.ledger.set_mlflow_dirty(dirty.trial_key)
    s.curves.write("degraded", dirty.trial_key, curve(dirty.seed))
    s.ledger.mark_failed(dirty.trial_key, "RuntimeError: boom", metrics=final(dirty.seed))

    # deleted: interrupted (pending again), and its run was deleted from MLflow by hand
    run_deleted = s.new_run(deleted)
    s.ledger.mark_running(deleted.trial_key, run_deleted)
    s.log(run_deleted, deleted.seed, upto=8)
    s.curves.write("degraded", deleted.trial_key, curve(deleted.seed)[:3])
    _set(s.ledger, deleted.trial_key, status="pending", failure_class="interrupted")
    client.delete_run(run_deleted)

    # cancelled mid-run, its end never reached MLflow
    run_cancelled = s.new_run(cancelled)
    s.ledger.mark_running(cancelled.trial_key, run_cancelled)
    s.log(run_cancelled, cancelled.seed, upto=4)
    s.curves.write("degraded", cancelled.trial_key, curve(cancelled.seed)[:2])
    _set(s.ledger, cancelled.trial_key, status="cancelled", failure_class="cancelled", mlflow_dirty=True)

    # never: pending, never started (no run in a healthy study either)
    first = s.sync()
    assert (first.trials_synced, first.runs_created, first.runs_continued) == (4, 2, 2)
    assert first.cell_runs_created == 0 and first.held == []

    assert s.history(run_clean) == clean_before  # untouched
    rows = {t.trial_key: s.row(t.trial_key) for t in s.trials}
    new_run = rows[no_run.trial_key].mlflow_run_id
    assert new_run and s.history(new_run) == FULL
    run = client.get_run(new_run)
    assert run.data.tags["trial_key"] == no_run.trial_key and run.data.tags["kind"] == "trial"
    assert run.data.tags["mlflow.parentRunId"] == s.parents[no_run.cell_hash]
    assert run.data.tags["status"] == "succeeded" and run.info.status == "FINISHED"
    assert run.data.params["seed"] == str(no_run.seed) and run.data.params["model.params.loops"] == "1"
    assert run.info.experiment_id == s.experiment_id

    assert s.history(run_dirty) == FULL  # only steps 8 and 12 (and the final-only metric) were added
    run = client.get_run(run_dirty)
    assert run.info.status == "FAILED" and run.data.tags["failure_class"] == "error"
    attempt = s.ledger.attempts(dirty.trial_key)[-1]
    assert attempt.traceback_artifact == "attempts/1/traceback.txt"
    local = client.download_artifacts(run_dirty, attempt.traceback_artifact, str(tmp_path))
    assert Path(local).read_text() == "RuntimeError: boom"

    replacement = rows[deleted.trial_key].mlflow_run_id
    assert replacement not in (None, run_deleted)
    assert s.history(replacement) == {"train_loss": [0, 4], "eval_accuracy": [6], "effective_depth": []}
    assert client.get_run(replacement).info.status == "SCHEDULED"

    run = client.get_run(run_cancelled)
    assert run.info.status == "KILLED" and run.data.tags["status"] == "cancelled"
    assert s.history(run_cancelled)["train_loss"] == [0, 4]

    assert rows[never.trial_key].mlflow_run_id is None
    assert not any(r.mlflow_dirty for r in rows.values())
    runs = {r.info.run_id for r in client.search_runs([s.experiment_id])}
    before = {r: s.history(r) for r in runs}

    # the parent of the cells that were synced got the seed aggregates the driver logs as seeds finish
    parent = s.parents[no_run.cell_hash]
    assert [m.step for m in client.get_metric_history(parent, "seeds_done")] == [3]

    second = s.sync()
    assert not second.changed and (second.runs_created, second.runs_continued) == (0, 0)
    assert {r.info.run_id for r in client.search_runs([s.experiment_id])} == runs
    assert {r: s.history(r) for r in runs} == before


def test_sync_leaves_trials_a_live_submit_holds(tmp_path):
    s = Study(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")
    held = s.trials[0]
    submission = s.ledger.open_submission("degraded", "submit")
    assert s.ledger.claim("degraded", [held.trial_key], submission) == [held.trial_key]
    s.ledger.start_attempt(held.trial_key, submission)
    s.ledger.set_mlflow_dirty(held.trial_key)
    report = s.sync()
    assert report.held == [held.trial_key] and report.trials_synced == 0
    assert s.row(held.trial_key).mlflow_dirty


def test_sync_an_unknown_study_names_the_known_ones(tmp_path):
    s = Study(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(StudyrunnerError, match="known studies: degraded"):
        sync_mlflow(s.ledger, s.tracker, s.curves, "nope")


# --- (c) a real MLflow server, killed and restarted ---------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        urllib.request.urlopen(url + "/health", timeout=2).close()
        return True
    except (urllib.error.URLError, OSError):
        return False


class Server:
    """`mlflow server` on a fixed port and store, in its own process group (so it can be killed whole)."""

    def __init__(self, root: Path, port: int):
        self.root, self.port, self.url = root, port, f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> float:
        began = time.monotonic()
        cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--workers", "1", "--backend-store-uri", f"sqlite:///{self.root / 'server.db'}"]
        cmd += ["--default-artifact-root", str(self.root / "artifacts")]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - the server's lifetime, closed in stop
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        while not _healthy(self.url):
            if self.proc.poll() is not None or time.monotonic() - began > 120:
                self.kill()
                pytest.fail(f"mlflow server did not start: {(self.root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.3)
        return time.monotonic() - began

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group this test started: server and its uvicorn
            self.proc.wait(30)
        self.proc = None


@pytest.fixture
def server(tmp_path):
    srv = Server(tmp_path / "server", _free_port())
    srv.root.mkdir()
    yield srv
    srv.kill()


def test_a_hung_server_costs_one_bounded_call(http_defaults):
    """A server that accepts connections but never answers: MLflow's own defaults wait 120 s per try, 7
    retries; with HTTP_DEFAULTS one call gives up in ~10 s and the guard skips the calls after it."""
    from mlflow import MlflowClient

    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)  # never accepted: connects succeed, reads time out
        tracker = FakeTracker()
        tracker.uri = f"http://127.0.0.1:{hung.getsockname()[1]}"
        said: list[str] = []
        guard = MlflowGuard(tracker, study="degraded", warn=said.append)
        client = MlflowClient(tracker.uri)
        began = time.monotonic()
        assert guard.call(client.get_experiment_by_name, "degraded") == (False, None)
        took = time.monotonic() - began
        began = time.monotonic()
        assert guard.call(client.get_experiment_by_name, "degraded") == (False, None)
        assert time.monotonic() - began < 0.1
    assert guard.down and took < 15 and "unreachable" in said[0]
    print(f"hung server: the call gave up after {took:.1f} s")


@pytest.mark.e2e
def test_a_killed_server_fails_fast_and_sync_backfills_after_restart(tmp_path, server, http_defaults):
    started = server.start()
    s = Study(tmp_path / "ws", server.url)
    said: list[str] = []
    guard = MlflowGuard(s.tracker, retry_after_s=1.0, study="degraded", warn=said.append)
    early, late = s.trials[0], s.trials[1]

    ok, run_early = guard.call(s.new_run, early)
    assert ok and run_early
    s.ledger.mark_running(early.trial_key, run_early)
    for row in curve(early.seed)[:2]:  # steps 0 and 4 reach MLflow
        assert guard.call(s.tracker.log_metrics, run_early, row["step"], metrics_of(row))[0]

    server.kill()
    began = time.monotonic()
    ok, _ = guard.call(s.tracker.log_metrics, run_early, 6, {"eval_accuracy": 0.5})
    failed_in = time.monotonic() - began
    assert not ok and guard.down and failed_in < 12
    s.ledger.set_mlflow_dirty(early.trial_key)
    began = time.monotonic()
    assert guard.call(s.new_run, late) == (False, None)  # skipped, not tried
    assert time.monotonic() - began < 0.5
    s.ledger.mark_running(late.trial_key, None)
    s.ledger.set_mlflow_dirty(late.trial_key)
    assert len(said) == 1 and "unreachable" in said[0]

    for t in (early, late):  # the trials finish; the ledger and the curves get everything
        s.curves.write("degraded", t.trial_key, curve(t.seed))
        s.ledger.mark_succeeded(t.trial_key, final(t.seed))

    # a sync while MLflow is down: one line, nothing lost
    with pytest.raises(StudyrunnerError, match="could not sync degraded to MLflow at http://127.0.0.1"):
        s.sync()

    restarted = server.start()
    time.sleep(1.0)
    assert guard.call(s.tracker.client.get_run, run_early)[0] and not guard.down
    assert said[-1].startswith("MLflow is back")

    report = s.sync()
    assert (report.trials_synced, report.runs_created, report.runs_continued) == (2, 1, 1)
    assert s.history(run_early) == FULL  # steps 0 and 4 once each
    run_late = s.row(late.trial_key).mlflow_run_id
    assert s.history(run_late) == FULL
    assert s.tracker.client.get_run(run_late).info.status == "FINISHED"
    assert not s.sync().changed
    assert s.history(run_early) == FULL and s.history(run_late) == FULL
    print(f"server start {started:.1f} s, restart {restarted:.1f} s, dead call failed in {failed_in:.2f} s")


@pytest.mark.e2e
def test_cli_sync_mlflow(tmp_path, server):
    server.start()
    s = Study(tmp_path / "ws", server.url)
    t = s.trials[0]
    s.ledger.mark_running(t.trial_key, None)
    s.curves.write("degraded", t.trial_key, curve(t.seed))
    s.ledger.mark_succeeded(t.trial_key, final(t.seed))
    args = ["--db", s.ledger.url, "--storage", str(tmp_path / "ws"), "--workspace", str(tmp_path / "ws")]

    def cli(uri: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "studyrunner.cli", "sync-mlflow", "degraded", "--tracking-uri", uri, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    done = cli(server.url)
    assert done.returncode == 0, done.stderr
    assert "mended 1 trials: 1 runs created, 0 continued" in done.stdout
    assert s.history(s.row(t.trial_key).mlflow_run_id) == FULL
    again = cli(server.url)
    assert again.returncode == 0 and "MLflow and the curves agree with the ledger" in again.stdout

    server.kill()
    dead = cli(server.url)
    assert dead.returncode == 1
    lines = dead.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach MLflow tracking server"), dead.stderr


# --- (d) end to end: `studyrunner submit` loses its MLflow server mid-study -------------------------


def _curve_points(curves: CurveStore, study: str, key: str) -> dict[str, dict[int, float]]:
    """metric -> step -> value of a trial's Parquet curve (a row's NaN: a metric it does not carry)."""
    frame = curves.read(study, key)
    points: dict[str, dict[int, float]] = {}
    for column in frame.columns.drop(["trial_key", "step"]):
        for step, value in zip(frame["step"], frame[column], strict=True):
            if value == value:
                points.setdefault(column, {})[int(step)] = float(value)
    return points


def _mlflow_histories(client, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(step, value)] of every metric the run has, in step order (duplicates kept)."""
    keys = client.get_run(run_id).data.metrics
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


@pytest.mark.e2e
@pytest.mark.faults
def test_submit_survives_mlflow_dying_mid_study_and_sync_backfills(tmp_path, server):
    """With real processes: the MLflow server of a running `submit` is SIGKILLed while
    its first trials run. The study finishes on time with everything in the ledger and the curves, says
    so once, and `sync-mlflow` after a restart leaves one complete run per trial; a second sync is a no-op."""
    from mlflow import MlflowClient
    from test_faults import cli, finish, statuses, study_text, wait_for

    from studyrunner.workspace import Workspace

    name, steps = "degraded-live", 1500
    server.start()
    path, ws = tmp_path / "live.yaml", tmp_path / "ws"
    path.write_text(study_text(name, steps=steps, seeds="[0, 1]"))
    began = time.monotonic()
    driver = cli("submit", str(path), "--no-progress", "--tracking-uri", server.url, workspace=ws)
    client = MlflowClient(server.url)

    def a_trial_logging() -> bool:  # running, with its run in MLflow and a first point in it
        if "running" not in statuses(ws, name).values():  # (the submit creates the ledger first)
            return False
        return any(
            r.status == "running" and r.mlflow_run_id and client.get_metric_history(r.mlflow_run_id, "train_loss")
            for r in Ledger(f"sqlite:///{ws / 'ledger.db'}", create=False).trials(name)
        )

    try:
        wait_for(a_trial_logging, what="a trial logging to MLflow")
        ledger = Ledger(f"sqlite:///{ws / 'ledger.db'}", create=False)
        before_kill = {r.trial_key: r for r in ledger.trials(name)}
        server.kill()
        killed_at = time.monotonic() - began
        code, output = finish(driver, timeout=400)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    took = time.monotonic() - began
    assert code == 0, output
    assert "Traceback" not in output
    assert not any(r.status in ("succeeded", "failed") for r in before_kill.values())  # all cut mid-study

    # the ledger and the Parquet curves have everything
    rows = {r.trial_key: r for r in ledger.trials(name)}
    assert len(rows) == 4 and {r.status for r in rows.values()} == {"succeeded"}
    assert all(r.metrics and "eval_accuracy" in r.metrics for r in rows.values())
    curves = CurveStore(Workspace.resolve(ws).storage)
    every = steps // 10
    logged = {"train_loss": list(range(every, steps + 1, every)), "eval_accuracy": [steps // 2, steps]}
    points = {key: _curve_points(curves, name, key) for key in rows}
    for key, curve_of in points.items():
        for metric, at in logged.items():
            assert sorted(curve_of[metric]) == at, (key, metric)
    # MLflow lacks something of every trial: the ends of the first ones, everything of the later ones
    assert all(r.mlflow_dirty for r in rows.values())
    with_run = {k for k, r in before_kill.items() if r.mlflow_run_id}
    assert with_run and {k for k, r in rows.items() if r.mlflow_run_id} == with_run
    flat = " ".join(output.split())  # the console wraps long lines
    again = f"studyrunner sync-mlflow {name} --tracking-uri {server.url}"  # hints carry the options given
    assert flat.count("is unreachable") == 1 and f"run `{again}` afterwards" in flat
    assert f"MLflow missed records of 4 trials (the ledger has them): {again}" in flat

    # the server comes back on the same port and store; sync-mlflow backfills
    server.start()
    code, synced = finish(cli("sync-mlflow", name, "--tracking-uri", server.url, workspace=ws), timeout=300)
    assert code == 0, synced
    flat = " ".join(synced.split())
    assert f"mended 4 trials: {4 - len(with_run)} runs created, {len(with_run)} continued" in flat, synced
    rows = {r.trial_key: r for r in ledger.trials(name)}
    assert not any(r.mlflow_dirty for r in rows.values())
    for key in with_run:
        assert rows[key].mlflow_run_id == before_kill[key].mlflow_run_id  # continued, not replaced

    client = MlflowClient(server.url)
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id], "tags.kind = 'trial'", max_results=100)
    assert sorted(r.data.tags["trial_key"] for r in runs) == sorted(rows)  # one run per trial
    histories = {}
    for run in runs:
        key = run.data.tags["trial_key"]
        assert run.info.run_id == rows[key].mlflow_run_id
        assert run.info.status == "FINISHED" and run.data.tags["status"] == "succeeded"
        histories[key] = history = _mlflow_histories(client, run.info.run_id)
        for metric, at in history.items():
            steps_of = [s for s, _ in at]
            assert len(steps_of) == len(set(steps_of)), (key, metric, steps_of)  # each step once
        for metric, by_step in points[key].items():  # the Parquet curve, point for point
            assert dict(history[metric]) == pytest.approx(by_step, rel=1e-6), (key, metric)
    cells = client.search_runs([experiment.experiment_id], "tags.kind = 'cell'", max_results=100)
    assert len(cells) == 2 and {c.info.status for c in cells} == {"FINISHED"}
    for cell in cells:  # the seed aggregates at the final count (2 seeds), once
        assert [m.step for m in client.get_metric_history(cell.info.run_id, "seeds_done")][-1:] == [2]
        done = [m.step for m in client.get_metric_history(cell.info.run_id, "seeds_done")]
        assert len(done) == len(set(done))

    code, again = finish(cli("sync-mlflow", name, "--tracking-uri", server.url, workspace=ws), timeout=300)
    assert code == 0 and "MLflow and the curves agree with the ledger" in again, again
    assert {r.data.tags["trial_key"]: _mlflow_histories(client, r.info.run_id) for r in runs} == histories
    assert len(client.search_runs([experiment.experiment_id], max_results=100)) == 6
    print(f"submit with MLflow killed at {killed_at:.1f} s took {took:.1f} s")


def test_a_full_sync_finds_disagreements_no_flag_marks(tmp_path):
    """A run left RUNNING though the ledger says succeeded, and a hole in a run's history, are found by the
    audit even when nothing flagged the trial; the commands' closing sync (only_dirty) leaves such trials."""
    s = Study(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")
    running, holed = s.trials[0], s.trials[1]
    for t in (running, holed):
        run_id = s.new_run(t)
        s.ledger.mark_running(t.trial_key, run_id)
        s.curves.write("degraded", t.trial_key, curve(t.seed))
        s.ledger.mark_succeeded(t.trial_key, final(t.seed))
        for row in curve(t.seed):
            if t is running or row["step"] != 4:  # `holed` misses step 4
                s.tracker.log_metrics(run_id, row["step"], metrics_of(row))
        s.tracker.log_metrics(run_id, 12, {"effective_depth": 1.0})
        if t is holed:
            s.tracker.set_outcome(run_id, "succeeded")
    assert not any(s.row(t.trial_key).mlflow_dirty for t in (running, holed))

    quick = sync_mlflow(s.ledger, s.tracker, s.curves, "degraded", only_dirty=True)
    assert not quick.changed
    report = s.sync()
    assert (report.trials_synced, report.statuses_set, report.runs_created) == (2, 2, 0)
    assert s.tracker.client.get_run(s.row(running.trial_key).mlflow_run_id).info.status == "FINISHED"
    assert s.history(s.row(holed.trial_key).mlflow_run_id) == FULL
    assert not s.sync().changed


def test_a_dead_submission_flags_every_trial_it_ran_for_the_audit(tmp_path):
    s = Study(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")
    done, cut, untouched = s.trials[0], s.trials[1], s.trials[2]
    sub = s.ledger.open_submission("degraded", "submit")
    s.ledger.claim("degraded", [done.trial_key, cut.trial_key], sub)
    for t in (done, cut):
        s.ledger.start_attempt(t.trial_key, sub)
    s.ledger.finish(done.trial_key, "succeeded", metrics=final(done.seed))
    from studyrunner.orchestrate.submission import reap_dead

    _set_submission_pid(s.ledger, sub, 2**22 + 12345)  # a pid no process has: the submit died
    assert list(reap_dead(s.ledger, "degraded")) == [sub]
    rows = {t.trial_key: s.row(t.trial_key) for t in (done, cut, untouched)}
    assert rows[done.trial_key].mlflow_dirty and rows[cut.trial_key].mlflow_dirty
    assert not rows[untouched.trial_key].mlflow_dirty
    assert rows[done.trial_key].status == "succeeded" and rows[cut.trial_key].status == "pending"


def _set_submission_pid(ledger: Ledger, sid: str, pid: int) -> None:
    from studyrunner.store.db import SubmissionRow

    with ledger.session() as s, s.begin():
        s.execute(update(SubmissionRow).where(SubmissionRow.id == sid).values(pid=pid))
