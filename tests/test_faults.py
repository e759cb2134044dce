"""Fault injection with real processes: a worker SIGKILLed mid-training, a driver SIGKILLed mid-study,
an injected divergence, two submits racing, Ctrl-C pressed twice, `cancel` from another terminal.

Every test reads the outcome from the ledger and from MLflow (one run per trial, whatever happened).
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_STUDY
from mlflow import MlflowClient
from rich.console import Console

from studyrunner.orchestrate import submit
from studyrunner.store import Ledger
from studyrunner.study import compile_study, loads
from studyrunner.train import run_trial
from studyrunner.workspace import Workspace

pytestmark = [pytest.mark.e2e, pytest.mark.faults]

EXE = [sys.executable, "-m", "studyrunner.cli"]
TIMING = {"tokens_per_sec", "step_time_ms", "train_time_s"}  # wall-clock figures: never bit-identical


def study_text(name: str, steps: int = 12, seeds: str = "[0, 1]", extra: str = "") -> str:
    text = TINY_STUDY.replace("name: tiny", f"name: {name}").replace("steps: 12", f"steps: {steps}")
    text = text.replace("log_every: 4", f"log_every: {max(4, steps // 10)}")
    text = text.replace("eval: {every: 6, examples: 32}", f"eval: {{every: {max(6, steps // 2)}, examples: 32}}")
    return text.replace("seeds: [0, 1]", f"seeds: {seeds}") + extra


def trial_runs(ws: Workspace, study: str) -> dict[str, list]:
    client = MlflowClient(ws.tracking_uri)
    exp = client.get_experiment_by_name(study)
    runs = client.search_runs([exp.experiment_id], "tags.kind = 'trial'", max_results=1000)
    out: dict[str, list] = {}
    for run in runs:
        out.setdefault(run.data.tags["trial_key"], []).append(run)
    return out


def without_timing(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in TIMING}


# ------------------------------------------------------------------------------- in-process driver


def test_a_worker_killed_mid_training_resumes_from_its_checkpoint_bit_exactly(ray_session, tmp_path, monkeypatch):
    ws = Workspace.resolve(tmp_path)
    compiled = compile_study(
        loads(study_text("killed", steps=24).replace("log_every", "checkpoint_every: 8, log_every"))
    )
    victim = compiled.trials[0]
    monkeypatch.setenv("STUDYRUNNER_INJECT_KILL", f"{victim.trial_key}@12")  # after step 12; last checkpoint: 8
    result = submit(compiled, ws, show_progress=False)
    assert sorted(result.succeeded) == sorted(t.trial_key for t in compiled.trials)

    ledger = Ledger(ws.db_url)
    (row,) = ledger.trials("killed", [victim.trial_key])
    attempts = ledger.attempts(victim.trial_key)
    assert [(a.status, a.error_class) for a in attempts] == [("failed", "infrastructure"), ("succeeded", None)]
    assert attempts[1].resumed_from_step == 8
    assert row.attempts == 2 and row.status == "succeeded"
    # Final metrics equal an uninterrupted run of the same trial (one thread, as the trial had).
    uninterrupted = run_trial(victim.config, victim.seed)
    assert without_timing(row.metrics) == without_timing(uninterrupted)
    # One trial, one MLflow run, through both attempts; its curve has every step once.
    runs = trial_runs(ws, "killed")
    assert len(runs[victim.trial_key]) == 1 and runs[victim.trial_key][0].info.status == "FINISHED"
    history = MlflowClient(ws.tracking_uri).get_metric_history(row.mlflow_run_id, "train_loss")
    steps = [m.step for m in history]
    assert sorted(set(steps)) == [4, 8, 12, 16, 20, 24]


def test_an_injected_divergence_ends_diverged_and_is_not_retried(ray_session, tmp_path, monkeypatch):
    ws = Workspace.resolve(tmp_path)
    compiled = compile_study(loads(study_text("diverging", extra="retries: 3\n")))
    cell = compiled.cells[1].cell_hash
    monkeypatch.setenv("STUDYRUNNER_INJECT_NAN", f"diverging-{cell}-*@5")
    result = submit(compiled, ws, show_progress=False)
    ledger = Ledger(ws.db_url)
    rows = {r.trial_key: r for r in ledger.trials("diverging")}
    diverged = sorted(k for k, r in rows.items() if r.cell_hash == cell)
    assert sorted(result.diverged) == diverged and len(result.succeeded) == 2
    for key in diverged:
        r = rows[key]
        assert r.status == "diverged" and r.failure_class == "divergence" and r.attempts == 1
        assert "step 5" in r.error and r.metrics and "train_loss" in r.metrics  # a data point: metrics kept
        assert [a.status for a in ledger.attempts(key)] == ["diverged"]
    runs = trial_runs(ws, "diverging")
    for key in diverged:
        (run,) = runs[key]
        assert run.data.tags["status"] == "diverged" and run.info.status == "FINISHED"


def test_without_the_live_display_each_failed_trial_still_gets_its_line(ray_session, tmp_path, monkeypatch):
    """`--no-progress` (show_progress=False) drops the live bar, not the `failed KEY: ...` line."""
    ws = Workspace.resolve(tmp_path)
    compiled = compile_study(loads(study_text("quiet")))
    victim = compiled.trials[0].trial_key
    monkeypatch.setenv("STUDYRUNNER_INJECT_FAULT", victim)
    said = io.StringIO()
    result = submit(compiled, ws, show_progress=False, console=Console(file=said, width=300))
    assert result.failed == [victim] and len(result.succeeded) == 3
    lines = [line for line in said.getvalue().splitlines() if line.startswith("failed ")]
    assert lines == [f"failed {victim}: InjectedFault: injected fault in {victim} (STUDYRUNNER_INJECT_FAULT)"], lines


def test_an_edit_that_changes_cells_that_ran_is_refused(ray_session, tmp_path):
    from studyrunner.errors import StudyrunnerError

    ws = Workspace.resolve(tmp_path)
    ledger = Ledger(ws.db_url)
    compiled = compile_study(loads(study_text("edited")))
    ledger.register(compiled)
    ledger.mark_running(compiled.trials[0].trial_key)
    ledger.mark_succeeded(compiled.trials[0].trial_key, {"eval_accuracy": 0.5})
    edited = compile_study(loads(study_text("edited").replace("steps: 12", "steps: 16")))
    with pytest.raises(StudyrunnerError, match=r"changes cells .* that already ran \(train.steps\).*--as-new-study"):
        submit(edited, ws, show_progress=False)
    assert Ledger(ws.db_url).trials("edited")[0].status == "succeeded"  # nothing stored is touched
    grown = compile_study(loads(study_text("edited", seeds="[0, 1, 2]").replace("[1, 2]", "[2]")))
    assert grown.cells and len(grown.cells) == 1  # a grid value dropped, a seed added: allowed
    from studyrunner.orchestrate.commands.preflight import refuse_changed_meaning

    refuse_changed_meaning(Ledger(ws.db_url), grown)


# ------------------------------------------------------------------------------ the CLI, as users


def cli(*args, workspace: Path, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "STUDYRUNNER_HOME": str(workspace), **kwargs.pop("env", {})}
    for name in ("MLFLOW_TRACKING_URI", "STUDYRUNNER_DB", "STUDYRUNNER_STORAGE"):
        env.pop(name, None)
    return subprocess.Popen([*EXE, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def wait_for(condition, timeout: float = 180, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def statuses(ws: Path, study: str) -> dict[str, str]:
    db = ws / "ledger.db"
    if not db.exists():
        return {}
    try:
        return {r.trial_key: r.status for r in Ledger(f"sqlite:///{db}", create=False).trials(study)}
    except Exception:  # noqa: BLE001 - the ledger is still being created by the process under test
        return {}


def ray_processes(session_dir: str) -> list[int]:
    from studyrunner.orchestrate.submission import _alive, _processes_of

    return [p for p in _processes_of(session_dir) if _alive(p)]


def test_a_driver_killed_mid_study_is_finished_by_resume(tmp_path):
    study = tmp_path / "crash.yaml"
    study.write_text(study_text("crash", steps=1500, seeds="[0, 1, 2]"))
    ws = tmp_path / "ws"
    driver = cli("submit", str(study), "--no-progress", "--max-concurrent", "2", workspace=ws)
    wait_for(lambda: "succeeded" in statuses(ws, "crash").values(), what="a first trial to succeed")
    wait_for(lambda: "running" in statuses(ws, "crash").values(), what="a trial to be running")
    before = statuses(ws, "crash")
    driver.kill()  # SIGKILL: no clean-up of any kind (the command's child, which runs the study, dies with it)
    driver.wait()
    ledger = Ledger(f"sqlite:///{ws / 'ledger.db'}", create=False)
    (dead,) = wait_for(lambda: ledger.dead_submissions("crash"), timeout=30, what="the killed submit to be gone")
    assert dead.ray_session_dir and ray_processes(dead.ray_session_dir)  # Ray outlived its driver

    status = subprocess.run(
        [*EXE, "status", "crash"], env={**os.environ, "STUDYRUNNER_HOME": str(ws)}, capture_output=True, text=True
    )
    assert "stale" in status.stdout and "studyrunner resume" in status.stdout

    code, output = finish(cli("resume", "crash", "--no-progress", workspace=ws))
    assert code == 0, output
    rows = {r.trial_key: r for r in ledger.trials("crash")}
    assert {r.status for r in rows.values()} == {"succeeded"}
    for key, was in before.items():
        if was == "succeeded":
            assert rows[key].attempts == 1  # nothing that succeeded ran again
    assert all(r.owner is None for r in rows.values())
    assert ray_processes(dead.ray_session_dir) == []  # the dead driver's Ray was stopped, not leaked
    runs = trial_runs(Workspace.resolve(ws), "crash")
    assert sorted(runs) == sorted(rows) and all(len(v) == 1 for v in runs.values())
    assert {v[0].info.status for v in runs.values()} == {"FINISHED"}


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh-workspace", "existing-workspace"])
def test_two_submits_racing_run_each_trial_once(tmp_path, fresh):
    ws = tmp_path / "ws"
    study = tmp_path / "race.yaml"
    if not fresh:  # a workspace that exists, with a study that grows by a seed
        study.write_text(study_text("race", steps=200, seeds="[0]"))
        code, output = finish(cli("submit", str(study), "--no-progress", workspace=ws))
        assert code == 0, output
    study.write_text(study_text("race", steps=200, seeds="[0, 1, 2]"))
    first = cli("submit", str(study), "--no-progress", workspace=ws)
    time.sleep(0.5)
    second = cli("submit", str(study), "--no-progress", workspace=ws)
    (code1, out1), (code2, out2) = finish(first), finish(second)
    assert code1 == 0, out1
    assert code2 == 0, out2
    assert "Traceback" not in out1 + out2
    rows = Ledger(f"sqlite:///{ws / 'ledger.db'}", create=False).trials("race")
    assert len(rows) == 6 and {r.status for r in rows} == {"succeeded"}
    assert {r.attempts for r in rows} == {1}
    runs = trial_runs(Workspace.resolve(ws), "race")
    assert sorted(runs) == sorted(r.trial_key for r in rows) and all(len(v) == 1 for v in runs.values())


def test_ctrl_c_twice_leaves_unfinished_trials_pending_in_ledger_and_mlflow(tmp_path):
    study = tmp_path / "stop.yaml"
    study.write_text(study_text("stop", steps=3000, seeds="[0, 1]"))
    ws = tmp_path / "ws"
    driver = cli("submit", str(study), "--no-progress", workspace=ws)
    wait_for(lambda: list(statuses(ws, "stop").values()).count("running") >= 1, what="a trial to be running")
    time.sleep(1.0)
    driver.send_signal(signal.SIGINT)
    time.sleep(0.3)
    driver.send_signal(signal.SIGINT)
    code, output = finish(driver)
    assert code == 130, output
    rows = Ledger(f"sqlite:///{ws / 'ledger.db'}", create=False).trials("stop")
    assert {r.status for r in rows} == {"pending"} and all(r.owner is None for r in rows)
    runs = trial_runs(Workspace.resolve(ws), "stop")
    started = [r for r in rows if r.attempts]
    assert started
    for r in started:
        (run,) = runs[r.trial_key]
        assert run.info.status == "SCHEDULED" and run.data.tags["status"] == "pending"


def test_cancel_from_another_terminal_stops_the_study(tmp_path):
    study = tmp_path / "cancel.yaml"
    study.write_text(study_text("cancelme", steps=3000, seeds="[0, 1, 2]"))
    ws = tmp_path / "ws"
    driver = cli("submit", str(study), "--no-progress", workspace=ws, env={"STUDYRUNNER_HEARTBEAT": "1"})
    wait_for(lambda: "running" in statuses(ws, "cancelme").values(), what="a trial to be running")
    code, output = finish(cli("cancel", "cancelme", workspace=ws), timeout=60)
    assert code == 0 and "asked 1 running submit" in output, output
    code, output = finish(driver, timeout=120)
    assert code == 1 and "cancelled; to run them after all: studyrunner resume cancelme" in output, output
    rows = Ledger(f"sqlite:///{ws / 'ledger.db'}", create=False).trials("cancelme")
    assert {r.status for r in rows} == {"cancelled"}
    runs = trial_runs(Workspace.resolve(ws), "cancelme")
    for r in rows:
        if r.attempts:
            (run,) = runs[r.trial_key]
            assert run.info.status == "KILLED" and run.data.tags["status"] == "cancelled"
