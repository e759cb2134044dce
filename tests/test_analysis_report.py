"""`analyze` output formats, the HTML report (rendered in headless Chromium), and the MLflow side: the
experiment marked as model training, seed aggregates on cell runs, the study-level run, the runs page."""

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from analysis_ledger import build, loglinear_outcome, study_text
from typer.testing import CliRunner

from studyrunner.analysis import data as data_mod
from studyrunner.analysis import report
from studyrunner.analysis.summary import analyze
from studyrunner.cli import app
from studyrunner.tracking import ui_links
from studyrunner.tracking.aggregates import rule_from, seed_aggregates

runner = CliRunner()
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium not installed (apt-get install chromium)"
)
CLAIMS = 'claims:\n  - "eval_accuracy[loops=8, block_layers=1] > eval_accuracy[loops=1, block_layers=1]"\n'


def curve(params, seed):
    final = loglinear_outcome()(params, seed)["eval_accuracy"]
    return [
        {"step": s, "train_loss": 2.0 / (1 + s / 20), "eval_accuracy": final * s / 100 if s else None}
        for s in range(0, 101, 20)
    ]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    build(root, loglinear_outcome(), extra=CLAIMS + 'failure: "eval_accuracy < 0.2"\n', curve=curve)
    return root


@pytest.fixture(scope="module")
def written(study):
    """The report and its tables, written once for the tests below."""
    return report.write_report(data_mod.load("synth", workspace=study), study / "report")


def chromium(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def non_blank(png: Path) -> float:
    """Fraction of pixels that are not background white."""
    from matplotlib.image import imread

    pixels = imread(png)[..., :3]
    return float((np.abs(pixels - 1.0).sum(axis=-1) > 0.1).mean())


def test_analyze_json_and_csv(study):
    result = runner.invoke(app, ["analyze", "synth", "--workspace", str(study), "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["study"] == "synth" and doc["trials_missing"] == 0 and len(doc["cells"]) == 8
    assert doc["failure_rule"] == "eval_accuracy < 0.2"
    best = doc["fits"][0]
    assert best["form"] in ("loglinear", "logistic") and best["n"] == 32
    loglinear = next(f for f in doc["fits"] if f["form"] == "loglinear")
    assert 0 < loglinear["alpha_lo"] <= loglinear["alpha"] <= loglinear["alpha_hi"]
    assert doc["claims"][0]["verdict"] == "supported"
    assert {p["differs_in"] for p in doc["paired"]} == {"loops", "block_layers"}
    result = runner.invoke(app, ["analyze", "synth", "--workspace", str(study), "--format", "csv"])
    header = result.stdout.splitlines()[0].split(",")
    assert result.exit_code == 0 and header[:2] == ["cell", "cell_hash"] and "failure_rate" in header
    assert len(result.stdout.splitlines()) == 9


def test_time_to_solve_from_curves(study):
    a = analyze(data_mod.load("synth", workspace=study), threshold=0.35)
    per_cell = a.time_to_solve_cells.set_index("cell")
    # final accuracy 0.3 never reaches 0.35 (censored); loops=8 x 2 blocks (0.716) crosses at step 60
    assert per_cell.loc["loops=1 block_layers=1", "solved"] == 0
    assert math.isnan(per_cell.loc["loops=1 block_layers=1", "median_step"])
    assert per_cell.loc["loops=8 block_layers=2", "solved"] == 4
    assert per_cell.loc["loops=8 block_layers=2", "median_step"] == 60


def test_report_is_self_contained_html(written):
    paths = written
    html = paths[0].read_text()
    assert paths[0].name == "synth-report.html" and {p.name for p in paths} >= {"synth-cells.csv", "synth-fits.csv"}
    assert html.count("data:image/png;base64,") >= 4  # strip plot, profile, fits, a curve panel per cell
    assert "<script" not in html and 'src="http' not in html and "<link" not in html  # nothing to fetch
    assert "eval_accuracy[loops=8, block_layers=1] &gt; eval_accuracy[loops=1, block_layers=1]" in html
    assert 'class="supported"' in html
    assert "run-synth-" in html  # every trial's MLflow run id


@pytest.mark.e2e
@needs_chromium
def test_report_renders_in_headless_chromium(written, tmp_path):
    shot = tmp_path / "report.png"
    proc = chromium("--window-size=1280,2400", f"--screenshot={shot}", written[0].as_uri())
    assert shot.is_file(), proc.stderr[-2000:]
    assert non_blank(shot) > 0.05  # text, tables and plots, not an empty page


def test_seed_aggregates_for_cell_runs():
    rows = [
        ("succeeded", {"eval_accuracy": 0.6}),
        ("succeeded", {"eval_accuracy": 0.1}),
        ("failed", None),
        ("running", None),
        ("succeeded", {"eval_accuracy": 0.8}),
    ]
    agg = seed_aggregates(rows, "eval_accuracy", rule_from("eval_accuracy < 0.2"))
    assert agg["seeds_done"] == 4 and agg["seeds_failed"] == 2 and agg["failure_rate"] == 0.5
    assert agg["eval_accuracy_n"] == 3 and agg["eval_accuracy_mean"] == pytest.approx(0.5)
    assert agg["eval_accuracy_sd"] == pytest.approx(np.std([0.6, 0.1, 0.8], ddof=1))
    assert "eval_accuracy_sd" not in seed_aggregates(rows[:1], "eval_accuracy", None)


def test_recorder_logs_aggregates_on_the_cell_run(tmp_path):
    from studyrunner.orchestrate.cluster.recorder import Recorder
    from studyrunner.store import Ledger
    from studyrunner.study import compile_study, loads

    compiled = compile_study(loads(study_text(extra='failure: "eval_accuracy < 0.35"\n')))
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.register(compiled)

    class FakeTracker:
        def __init__(self):
            self.logged, self.ended = [], []

        def log_metrics(self, run_id, step, metrics):
            self.logged.append((run_id, step, metrics))

        def end(self, run_id, status):
            self.ended.append((run_id, status))

    tracker = FakeTracker()
    cell = compiled.cells[0]
    recorder = Recorder(compiled, ledger, tracker, None, "1", {cell.cell_hash: "parent-run"})
    keys = [t.trial_key for t in compiled.trials if t.cell_hash == cell.cell_hash]
    for key, acc in zip(keys[:2], (0.3, 0.5), strict=True):
        ledger.mark_running(key)
        ledger.mark_succeeded(key, {"eval_accuracy": acc})
        recorder._log_cell_aggregates(key)
    assert [(r, s) for r, s, _ in tracker.logged] == [("parent-run", 1), ("parent-run", 2)]
    last = tracker.logged[-1][2]
    assert last["eval_accuracy_mean"] == pytest.approx(0.4) and last["failure_rate"] == 0.5
    assert tracker.ended == [("parent-run", "FINISHED")] * 2


def test_runs_url():
    assert ui_links.runs_url("http://127.0.0.1:5000/", "7") == (
        "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning"
    )
    assert ui_links.runs_url("sqlite:////tmp/x/mlflow.db", "7").startswith("http://127.0.0.1:5000/#/experiments/7/")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mlflow_server(uri: str, port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    return subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.e2e
def test_mlflow_experiment_study_run_and_runs_page(written, tmp_path):
    """The experiment is marked as model training, `report` logs its files to a study-level run, and
    (with Chromium) the runs URL opens MLflow's runs table with the cell runs, not the GenAI overview."""
    from mlflow import MlflowClient

    from studyrunner.study import compile_study, loads
    from studyrunner.tracking.tracker import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri)
    compiled = compile_study(loads(study_text()))
    exp = tracker.experiment("synth", (tmp_path / "artifacts").as_uri())
    assert tracker.client.get_experiment(exp).tags[ui_links.EXPERIMENT_KIND_TAG] == ui_links.EXPERIMENT_KIND
    tracker.client.delete_experiment_tag(exp, ui_links.EXPERIMENT_KIND_TAG)  # an experiment from before the tag
    assert tracker.experiment("synth", (tmp_path / "artifacts").as_uri()) == exp
    assert tracker.client.get_experiment(exp).tags[ui_links.EXPERIMENT_KIND_TAG] == ui_links.EXPERIMENT_KIND
    runs = [tracker.cell_run(exp, compiled.study, cell, None) for cell in compiled.cells[:2]]
    tracker.log_metrics(runs[0], 2, {"eval_accuracy_mean": 0.5, "failure_rate": 0.0})

    files = written
    run_id = ui_links.log_study_run(uri, "synth", exp, files)
    assert ui_links.log_study_run(uri, "synth", exp, files[:1]) == run_id  # one study-level run
    client = MlflowClient(uri)
    logged = {Path(a.path).name for a in client.list_artifacts(run_id, "analysis")}
    assert {"synth-report.html", "synth-cells.csv", "synth-fits.csv"} <= logged
    assert client.get_run(runs[0]).data.metrics["eval_accuracy_mean"] == 0.5

    if CHROMIUM is None:
        pytest.skip("headless Chromium not installed: the runs page is not rendered")
    port = _free_port()
    server = _mlflow_server(uri, port, tmp_path / "server.log")
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=2).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
                time.sleep(0.5)
        url = ui_links.runs_url(base, exp)
        dom = chromium("--virtual-time-budget=10000", "--dump-dom", url).stdout
        assert compiled.cells[0].label in dom and "synth: study" in dom  # the runs table, with our runs
        shot = tmp_path / "runs.png"
        chromium("--virtual-time-budget=10000", "--window-size=1400,900", f"--screenshot={shot}", url)
        assert shot.is_file() and non_blank(shot) > 0.05
    finally:
        os.killpg(server.pid, 15)
        server.wait(20)


def test_the_reports_claims_table_gives_both_sides_and_each_claims_threats(tmp_path):
    """The claims table printed lhs and rhs empty for sequential studies and named no threat: a claim whose
    side is still climbing at the end of training carries `unconverged`, one that is not carries none."""
    claims = CLAIMS + '  - "eval_accuracy[loops=8] > 0.3"\n'
    build(tmp_path, loglinear_outcome(), extra=claims, curve=curve)
    html = report.write_report(data_mod.load("synth", workspace=tmp_path), tmp_path / "report")[0].read_text()
    rows = html.split('<td class="claim">')[1:]
    assert len(rows) == 2
    cells = [row.split("</tr>")[0] for row in rows]
    assert all("<td></td><td></td>" not in c for c in cells)  # lhs and rhs filled
    assert '<td class="wrap threats">none found</td>' in cells[0]
    assert "<b>unconverged</b>: lhs eval_accuracy still rising" in cells[1]
