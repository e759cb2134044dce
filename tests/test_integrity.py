"""Integrity under crashes and odd stores, as a user meets them: real `studyrunner` processes, a real
Ray, real MLflow and SQLite stores; `kill -9` at chosen moments, corrupt files, a read-only mount.

- a live submit is never taken over (`rerun --stale --stale-after 0`, `resume` beside it);
- a driver killed mid-trial leaves no hole in curves or MLflow histories (two racing resumes included), and a
  corrupt newest checkpoint is reported (console and attempt) and fallen back from;
- a driver killed while recording a finished trial is mended by `resume` (and `sync-mlflow` then agrees);
- an unreadable curve is named and left out by the analysis, set aside and rebuilt by `rerun`;
- a rerun that stops before its attempt starts keeps the trial's outcome;
- a workspace on a read-only mount can be read;
- smaller points: hints carry the options given, an explicit --workspace beats the environment, an unreachable
  tracking URI leaves no ledger, a new ledger beside an old MLflow store makes no second runs.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import TINY_STUDY
from mlflow import MlflowClient
from test_faults import EXE, TIMING, cli, finish, ray_processes, statuses, study_text, trial_runs, wait_for

from studyrunner.orchestrate.submission import stop_ray_session
from studyrunner.store import CurveStore, Ledger
from studyrunner.study import compile_study, loads
from studyrunner.train import MemoryReporter, run_trial
from studyrunner.workspace import Workspace

pytestmark = [pytest.mark.e2e, pytest.mark.faults]


def ledger_of(ws: Path) -> Ledger:
    return Ledger(f"sqlite:///{ws / 'ledger.db'}", create=False)


def checkpoint_steps(ws: Path, study: str, key: str) -> list[int]:
    folder = ws / "checkpoints" / study / key
    return sorted(int(p.name[5:14]) for p in folder.glob("step-*.ckpt")) if folder.is_dir() else []


def strip(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING and not (isinstance(v, float) and math.isnan(v))}


def uninterrupted(trial) -> list[dict]:
    reporter = MemoryReporter()
    run_trial(trial.config, trial.seed, reporter)
    return [strip(r) for r in reporter.rows]


def curve_rows(ws: Path, study: str, key: str) -> list[dict]:
    frame = CurveStore(str(ws)).read(study, key).drop(columns=["trial_key"])
    return [strip({k: (int(v) if k == "step" else v) for k, v in r.items()}) for r in frame.to_dict("records")]


def mlflow_points(ws: Path, run_id: str) -> dict[str, list[tuple[int, float]]]:
    client = MlflowClient(Workspace.resolve(ws).tracking_uri)
    keys = client.get_run(run_id).data.metrics
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


def assert_run_mirrors_curve(ws: Path, study: str, key: str, run_id: str) -> None:
    """Every (metric, step) of the curve is in the run once, with the curve's value."""
    points = mlflow_points(ws, run_id)
    for metric, history in points.items():
        steps = [s for s, _ in history]
        assert len(steps) == len(set(steps)), (key, metric, steps)
    for row in curve_rows(ws, study, key):
        for metric, value in row.items():
            if metric != "step" and metric not in TIMING:
                assert (row["step"], value) in points[metric], (key, metric, row["step"])


# --------------------------------------------------------------------------------- 1: live submit


def test_a_live_submit_is_never_taken_over(tmp_path):
    study = tmp_path / "live.yaml"
    study.write_text(study_text("live", steps=3000, seeds="[0, 1]"))
    ws = tmp_path / "ws"
    driver = cli("submit", str(study), "--no-progress", "--max-concurrent", "1", workspace=ws)
    try:
        wait_for(lambda: "running" in statuses(ws, "live").values(), what="a trial to be running")
        for verb in (["rerun", "live", "--stale"], ["resume", "live"]):
            code, output = finish(cli(*verb, "--stale-after", "0", "--no-progress", workspace=ws), timeout=120)
            assert code == 0, output
            assert "0 to run" in output, output
        code, output = finish(driver, timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert code == 0, output
    rows = ledger_of(ws).trials("live")
    assert {r.status for r in rows} == {"succeeded"} and {r.attempts for r in rows} == {1}
    for key, (run,) in trial_runs(Workspace.resolve(ws), "live").items():  # trained once: each point once
        steps = [s for s, _ in mlflow_points(ws, run.info.run_id)["train_loss"]]
        assert steps == sorted(set(steps)) == list(range(300, 3001, 300)), key


# ------------------------------------------------------------- 2 and 7: kill -9 mid-trial, no holes

HOLES = (
    TINY_STUDY.replace("name: tiny", "name: holes")
    .replace("steps: 12,", "steps: 1200,")
    .replace("log_every: 4}", "log_every: 20, checkpoint_every: 40}")
    .replace("eval: {every: 6, examples: 32}", "eval: {every: 200, examples: 32}")
)


def test_a_driver_killed_mid_trial_leaves_no_hole_and_racing_resumes_finish_it(tmp_path):
    """kill -9 while the workers are ahead of the driver; then a corrupt newest checkpoint; then two resumes at
    once. Every curve and MLflow history equals an uninterrupted run's: same steps, same values."""
    study = tmp_path / "holes.yaml"
    study.write_text(HOLES)
    ws = tmp_path / "ws"
    compiled = compile_study(loads(HOLES))
    first = compiled.trials[0].trial_key
    driver = cli("submit", str(study), "--no-progress", "--max-concurrent", "2", workspace=ws)
    wait_for(
        lambda: len(checkpoint_steps(ws, "holes", first)) >= 2 and checkpoint_steps(ws, "holes", first)[-1] >= 400,
        what="the first trial to checkpoint step 400",
    )
    driver.kill()
    driver.wait()
    # The dead driver's Ray outlives it, and its workers go on checkpointing: stop them (as the resumes' reaping
    # would) and wait until none is left, so that the newest checkpoint stays the newest.
    (dead,) = wait_for(lambda: ledger_of(ws).dead_submissions("holes"), timeout=30, what="the killed submit gone")
    stop_ray_session(dead.ray_session_dir)
    wait_for(lambda: not ray_processes(dead.ray_session_dir), timeout=120, what="the dead driver's Ray to end")
    held = {r.trial_key for r in ledger_of(ws).trials("holes") if r.status == "running"}
    assert first in held

    # the newest checkpoint of the first trial is corrupt: the resume falls back to the one before and says so
    newest = checkpoint_steps(ws, "holes", first)[-1]
    victim = ws / "checkpoints" / "holes" / first / f"step-{newest:09d}.ckpt"
    victim.write_bytes(victim.read_bytes()[:100])
    fallback = checkpoint_steps(ws, "holes", first)[-2]

    racers = [cli("resume", "holes", "--no-progress", workspace=ws) for _ in range(2)]
    outputs = [finish(r, timeout=600) for r in racers]
    for code, output in outputs:
        assert code == 0, output
        assert "Traceback" not in output
    said = " ".join(" ".join(o.split()) for _, o in outputs)
    assert f"step-{newest:09d}.ckpt is unusable" in said and f"at step {fallback} of 1200" in said, said

    ledger = ledger_of(ws)
    rows = {r.trial_key: r for r in ledger.trials("holes")}
    assert {r.status for r in rows.values()} == {"succeeded"} and not any(r.mlflow_dirty for r in rows.values())
    resumed = ledger.attempts(first)[-1]
    history = [(a.number, a.status, a.resumed_from_step, a.submission, a.message) for a in ledger.attempts(first)]
    assert resumed.resumed_from_step == fallback, (history, said)
    assert f"step-{newest:09d}.ckpt is unusable" in resumed.message and f"at step {fallback}" in resumed.message
    for key in rows:
        succeeded = [a for a in ledger.attempts(key) if a.status == "succeeded"]
        assert len(succeeded) == 1, key  # the racing resumes never both ran a trial
    runs = trial_runs(Workspace.resolve(ws), "holes")
    assert sorted(runs) == sorted(rows) and all(len(v) == 1 for v in runs.values())
    for trial in compiled.trials:
        key = trial.trial_key
        assert curve_rows(ws, "holes", key) == uninterrupted(trial), key
        assert_run_mirrors_curve(ws, "holes", key, rows[key].mlflow_run_id)
        assert runs[key][0].info.status == "FINISHED"


# ------------------------------------------------------- 2: driver killed while recording an end


def test_a_driver_killed_while_recording_a_trials_end_is_mended_by_resume(tmp_path):
    study = tmp_path / "mend.yaml"
    study.write_text(study_text("mend", steps=120, seeds="[0]"))
    ws = tmp_path / "ws"
    driver = cli(
        "submit",
        str(study),
        "--no-progress",
        "--max-concurrent",
        "1",
        workspace=ws,
        env={"STUDYRUNNER_INJECT_DRIVER_KILL": "mend-*@finish"},
    )
    code, output = finish(driver, timeout=300)
    assert code == -9, output
    ledger = ledger_of(ws)
    (done,) = [r for r in ledger.trials("mend") if r.status == "succeeded"]
    assert done.mlflow_dirty  # the ledger has the outcome; MLflow does not yet
    client = MlflowClient(Workspace.resolve(ws).tracking_uri)
    assert client.get_run(done.mlflow_run_id).info.status == "RUNNING"

    code, output = finish(cli("resume", "mend", "--no-progress", workspace=ws), timeout=300)
    assert code == 0, output
    assert re.search(r"mended [12] trials in MLflow", " ".join(output.split())), output
    rows = {r.trial_key: r for r in ledger.trials("mend")}
    assert {r.status for r in rows.values()} == {"succeeded"} and not any(r.mlflow_dirty for r in rows.values())
    assert rows[done.trial_key].attempts == 1  # recorded, not run again
    for key, row in rows.items():
        run = client.get_run(row.mlflow_run_id)
        assert run.info.status == "FINISHED" and run.data.tags["status"] == "succeeded"
        assert_run_mirrors_curve(ws, "mend", key, row.mlflow_run_id)
        assert "train_time_s" in run.data.metrics  # the final metrics the curve lacks
    code, output = finish(cli("sync-mlflow", "mend", workspace=ws), timeout=300)
    assert code == 0 and "agree with the ledger" in output, output


# ------------------------------------------------------------ 3, 5, 8: one finished study, many readers

BASE = study_text("base", steps=60, seeds="[0, 1]").replace(
    "metric: {name: eval_accuracy, mode: max}",
    'metric: {name: eval_accuracy, mode: max}\nclaims:\n  - "eval_accuracy[loops=1] > 0.1"',
)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A finished study: 3 trials succeeded, the loops=2 seed 1 diverged (NaN at step 20)."""
    root = tmp_path_factory.mktemp("base")
    study = root / "base.yaml"
    study.write_text(BASE)
    ws = root / "ws"
    cell = compile_study(loads(BASE)).cells[1].cell_hash
    code, output = finish(
        cli("submit", str(study), "--no-progress", workspace=ws, env={"STUDYRUNNER_INJECT_NAN": f"base-{cell}-s1@20"}),
        timeout=300,
    )
    assert code == 0, output  # a diverged seed is a data point, not a failure
    return study, ws


def copy_of(base, tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(base[1], ws)
    return ws


def diverged_key(ws: Path) -> str:
    (row,) = ledger_of(ws).trials("base", statuses=("diverged",))
    return row.trial_key


def test_an_unreadable_curve_is_named_and_left_out_then_rebuilt_by_rerun(base, tmp_path):
    ws = copy_of(base, tmp_path)
    key = diverged_key(ws)
    other = next(r.trial_key for r in ledger_of(ws).trials("base") if r.status == "succeeded")
    for k in (key, other):
        (ws / "curves" / "base" / f"{k}.parquet").write_bytes(b"not parquet at all")

    for verb in (["analyze", "base"], ["report", "base", "--no-mlflow"]):
        code, output = finish(cli(*verb, workspace=ws), timeout=300)
        flat = " ".join(output.split())
        assert code == 0, output
        assert "unexpected" not in flat and "Traceback" not in flat
        assert f"curve {ws}/curves/base/{other}.parquet is unreadable" in flat and "left out" in flat, output

    code, output = finish(cli("rerun", "base", "--diverged", "--no-progress", workspace=ws), timeout=300)
    assert code == 0, output
    assert f"{key}.parquet is unreadable" in " ".join(output.split())
    (row,) = ledger_of(ws).trials("base", [key])
    assert row.status == "succeeded" and row.attempts == 2
    trial = next(t for t in compile_study(loads(BASE)).trials if t.trial_key == key)
    assert curve_rows(ws, "base", key) == uninterrupted(trial)  # written again: checkpoint replay + new steps
    assert list((ws / "curves" / "base").glob(f"{key}.parquet.unreadable-*"))  # set aside, not deleted


def test_a_rerun_that_stops_before_its_attempt_keeps_the_outcome(base, tmp_path):
    ws = copy_of(base, tmp_path)
    key = diverged_key(ws)
    (before,) = ledger_of(ws).trials("base", [key])
    code, output = finish(cli("rerun", "base", "--diverged", "--address", "127.0.0.1:1", workspace=ws), timeout=120)
    assert code == 1 and "cannot reach the Ray cluster" in output, output
    (after,) = ledger_of(ws).trials("base", [key])
    assert (after.status, after.error, after.metrics, after.attempts, after.owner) == (
        "diverged",
        before.error,
        before.metrics,
        before.attempts,
        None,
    )


@pytest.fixture
def read_only(tmp_path):
    """Makes a folder read-only for this process: a read-only bind mount as root, else chmod."""
    mounted: list[Path] = []

    def make(folder: Path) -> Path:
        if os.geteuid() == 0:
            view = folder.with_name(folder.name + "-ro")
            view.mkdir()
            ok = subprocess.run(["mount", "--bind", str(folder), str(view)], capture_output=True).returncode == 0
            ok = (
                ok
                and subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], capture_output=True).returncode == 0
            )
            if ok:
                mounted.append(view)
        else:
            for path in [folder, *folder.rglob("*")]:
                path.chmod(path.stat().st_mode & ~0o222)
            view = folder
        try:
            (view / "probe").touch()
        except OSError:
            return view
        pytest.skip("cannot make a read-only folder here (no bind mount, no permission bits)")

    yield make
    for view in mounted:
        subprocess.run(["umount", str(view)], capture_output=True)


def test_a_workspace_on_a_read_only_mount_can_be_read(base, tmp_path, read_only):
    ws = read_only(copy_of(base, tmp_path))
    env = {"STUDYRUNNER_HOME": str(ws)}
    for verb in (["status", "base"], ["results", "base", "--format", "csv"], ["analyze", "base"], ["verify", "base"]):
        proc = subprocess.run([*EXE, *verb], env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (verb, proc.stderr)
        flat = " ".join(proc.stderr.split())
        assert "read-only location" in flat and "immutable snapshot" in flat, (verb, proc.stderr)
        assert f"read from ledger sqlite:///{ws}/ledger.db" in flat
    report = subprocess.run([*EXE, "report", "base"], env={**os.environ, **env}, capture_output=True, text=True)
    assert report.returncode == 1
    last = report.stderr.strip().splitlines()[-1]  # after the note that the ledger is read as a snapshot
    assert report.stderr.count("error:") == 1 and "cannot write to" in last and "--out" in last, report.stderr
    out = tmp_path / "report"
    report = subprocess.run(
        [*EXE, "report", "base", "--out", str(out)], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert report.returncode == 0 and (out / "base-report.html").is_file(), report.stderr
    assert "could not log the report to MLflow" in report.stderr and report.stderr.count("Traceback") == 0


def test_hints_carry_the_options_given_and_a_workspace_beats_the_environment(base, tmp_path):
    ws = copy_of(base, tmp_path)
    elsewhere = tmp_path / "elsewhere.db"
    env = {"STUDYRUNNER_DB": f"sqlite:///{elsewhere}"}
    proc = subprocess.run(
        [*EXE, "status", "base", "--workspace", str(ws)], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert f"STUDYRUNNER_DB=sqlite:///{elsewhere} is not used" in " ".join(proc.stderr.split())
    assert not elsewhere.exists()
    # a submit whose trials fail prints hints that reach the same workspace
    failing = tmp_path / "failing.yaml"
    failing.write_text(study_text("failing", steps=20, seeds="[0]"))
    code, output = finish(
        cli(
            "submit",
            str(failing),
            "--no-progress",
            "--workspace",
            str(ws),
            workspace=tmp_path / "other",
            env={"STUDYRUNNER_INJECT_FAULT": "*"},
        ),
        timeout=300,
    )
    assert code == 1 and f"see errors: studyrunner status failing --workspace {ws}" in " ".join(output.split())


def test_an_unreachable_tracking_server_leaves_no_ledger(tmp_path):
    ws = tmp_path / "fresh"
    study = tmp_path / "s.yaml"
    study.write_text(study_text("nowhere"))
    code, output = finish(cli("submit", str(study), "--tracking-uri", "http://127.0.0.1:1", workspace=ws), timeout=60)
    assert code == 1 and output.strip().count("\n") == 0 and "cannot reach MLflow tracking server" in output
    assert not (ws / "ledger.db").exists()


def test_a_new_ledger_beside_an_old_mlflow_store_makes_no_second_runs(base, tmp_path):
    ws = copy_of(base, tmp_path)
    before = trial_runs(Workspace.resolve(ws), "base")
    client = MlflowClient(Workspace.resolve(ws).tracking_uri)
    exp = client.get_experiment_by_name("base").experiment_id
    cells_before = client.search_runs([exp], "tags.kind = 'cell'")
    for name in ("ledger.db", "ledger.db-wal", "ledger.db-shm"):
        (ws / name).unlink(missing_ok=True)
    shutil.rmtree(ws / "checkpoints")  # a fresh start: every trial trains again
    code, output = finish(cli("submit", str(base[0]), "--no-progress", workspace=ws), timeout=300)
    assert code == 0, output
    after = trial_runs(Workspace.resolve(ws), "base")
    assert sorted(after) == sorted(before)
    assert {k: [r.info.run_id for r in v] for k, v in after.items()} == {
        k: [r.info.run_id for r in v] for k, v in before.items()
    }
    assert len(client.search_runs([exp], "tags.kind = 'cell'")) == len(cells_before)


def test_commands_started_together_share_files_without_tripping_each_other(tmp_path):
    """Two resumes started at once both check that the workspace is writable: one must not delete the
    other's probe file (it did: "Cannot delete file .studyrunner-probe"); nor its half-written curve."""
    from concurrent.futures import ThreadPoolExecutor

    from studyrunner.workspace import check_storage

    folder = str(tmp_path / "shared")
    Path(folder).mkdir()  # a folder that exists gets probe files (one that does not is made only with the stores)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: check_storage(folder), range(400)))
    assert list(Path(folder).iterdir()) == []  # every probe cleaned up after itself

    # two audits of one trial (two resumes) write its curve at once: each write lands whole
    curves = CurveStore(folder)
    rows = lambda n: [{"step": s, "train_loss": float(n)} for s in range(1, 50)]  # noqa: E731
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: curves.write("s", "k", rows(n)), range(200)))
    frame = curves.read("s", "k")
    assert len(frame) == 49 and frame["train_loss"].nunique() == 1
    assert [p.name for p in Path(folder, "curves", "s").iterdir()] == ["k.parquet"]


def test_a_report_gives_up_on_an_unreachable_mlflow_server_in_seconds(base, tmp_path, monkeypatch):
    """The report is written; logging it to a dead server fails after one retry (tracking.http.HTTP_DEFAULTS), not
    after MLflow's 7 retries with backoff (about two minutes), and says so in one warning."""
    from typer.testing import CliRunner

    from studyrunner.cli import app
    from studyrunner.tracking.http import HTTP_DEFAULTS

    for name in HTTP_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    ws, out = copy_of(base, tmp_path), tmp_path / "out"
    args = ["report", "base", "--workspace", str(ws), "--tracking-uri", "http://127.0.0.1:9", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0 and (out / "base-report.html").is_file(), result.output
    assert "could not log the report to MLflow at http://127.0.0.1:9" in " ".join(result.output.split())
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "1" and os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "5"
