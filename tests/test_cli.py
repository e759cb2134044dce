"""The `studyrunner` command as a user runs it: real subprocesses, a real Ray, a real MLflow server."""

import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY_STUDY

pytestmark = pytest.mark.e2e

EXE = [sys.executable, "-m", "studyrunner.cli"]


def sr(*args, workspace: Path, check=True, timeout=600):
    env = {**os.environ, "STUDYRUNNER_HOME": str(workspace)}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("STUDYRUNNER_DB", None)
    proc = subprocess.run([*EXE, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"studyrunner {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def submitted(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    study = root / "tiny.yaml"
    study.write_text(TINY_STUDY)
    workspace = root / "ws"
    first = sr("submit", str(study), "--no-progress", workspace=workspace)
    return study, workspace, first


def test_submit_reports_what_it_ran(submitted):
    _, _, first = submitted
    assert "4 to run" in first.stderr
    assert "4 succeeded" in first.stderr
    assert "Traceback" not in first.stderr


def test_status_shows_every_trial_succeeded(submitted):
    _, workspace, _ = submitted
    out = sr("status", "tiny", workspace=workspace).stdout
    row = next(line for line in out.splitlines() if "tiny" in line)
    # pending, running, succeeded, failed, diverged, cancelled, stale, total
    assert [c.strip() for c in row.strip("│ ").split("│")] == ["tiny", "0", "0", "4", "0", "0", "0", "0", "4"]


def test_results_in_every_format(submitted, tmp_path):
    _, workspace, _ = submitted
    csv = pd.read_csv(io.StringIO(sr("results", "tiny", "--format", "csv", workspace=workspace).stdout))
    assert len(csv) == 4 and set(csv.status) == {"succeeded"}
    assert {"trial_key", "seed", "model.params.loops", "eval_accuracy", "params"} <= set(csv.columns)
    rows = json.loads(sr("results", "tiny", "--format", "json", workspace=workspace).stdout)
    assert sorted(r["trial_key"] for r in rows) == sorted(csv.trial_key)
    out = tmp_path / "r.parquet"
    sr("results", "tiny", "--format", "parquet", "--out", str(out), workspace=workspace)
    assert len(pd.read_parquet(out)) == 4
    table = sr("results", "tiny", workspace=workspace).stdout
    assert "eval_accuracy" in table and "succeeded" in table


def test_second_submit_runs_zero_trials(submitted):
    study, workspace, _ = submitted
    again = sr("submit", str(study), "--no-progress", workspace=workspace)
    assert "4 already succeeded (skipped)" in again.stderr and "0 to run" in again.stderr
    assert "nothing to run" in again.stderr


def test_unknown_study_and_bad_arguments_fail_cleanly(submitted):
    _, workspace, _ = submitted
    missing = sr("results", "nope", workspace=workspace, check=False)
    assert missing.returncode == 1 and "no study named 'nope'" in missing.stderr and "tiny" in missing.stderr
    bad_format = sr("results", "tiny", "--format", "xlsx", workspace=workspace, check=False)
    assert bad_format.returncode == 2 and "xlsx" in bad_format.stderr
    parquet_to_stdout = sr("results", "tiny", "--format", "parquet", workspace=workspace, check=False)
    assert parquet_to_stdout.returncode == 1 and "--out" in parquet_to_stdout.stderr
    for proc in (missing, bad_format, parquet_to_stdout):
        assert "Traceback" not in proc.stderr


def test_plan_counts_cells_trials_and_parameters(submitted):
    study, workspace, _ = submitted
    out = sr("plan", str(study), workspace=workspace).stdout
    assert "2 cells x 2 seeds = 4 trials" in out
    assert out.count("loops=") == 2


def test_schema_is_json(submitted):
    _, workspace, _ = submitted
    schema = json.loads(sr("schema", workspace=workspace).stdout)
    assert schema["title"] == "studyrunner study file"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ui_serves_the_study_on_localhost(submitted):
    """Waits for what it checks, never for a fixed time: the ui's own "ready" lines (it prints them once its
    server answers), then the server's answer; the bounds are generous, for a loaded machine."""
    _, workspace, _ = submitted
    port = _free_port()
    env = {**os.environ, "STUDYRUNNER_HOME": str(workspace)}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen(
        [*EXE, "ui", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    said: list[str] = []

    def read() -> None:
        for line in proc.stderr:
            said.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    runs_page = f"tiny: http://127.0.0.1:{port}/#/experiments/"
    url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/get-by-name?experiment_name=tiny"
    try:
        deadline = time.monotonic() + 600
        while not any(runs_page in line for line in said) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert any(runs_page in line for line in said), "".join(said)
        with urllib.request.urlopen(url, timeout=120) as resp:
            body = json.load(resp)
        assert body["experiment"]["name"] == "tiny"
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=300)
        reader.join(timeout=60)
    err = "".join(said)
    assert f"http://127.0.0.1:{port}" in err
    assert runs_page in err and "workflowType=machine_learning" in err
    # Stopping `ui` stops its server: nothing answers on the port afterwards, and no traceback was printed.
    assert proc.returncode == 0 and "Traceback" not in err
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)


def test_ui_on_a_busy_port_is_an_error(submitted):
    _, workspace, _ = submitted
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = sr("ui", "--port", str(port), workspace=workspace, check=False, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: --port {port}: cannot listen on 127.0.0.1:{port}")
