"""A tiny study through the real stack: Ray Tune, the MLflow SQLite store, the SQL ledger, Parquet."""

import json
from pathlib import Path

import pytest
from conftest import TINY_STUDY
from mlflow import MlflowClient

from studyrunner import results
from studyrunner.orchestrate import RerunSelection, RunOptions, rerun, submit
from studyrunner.store import CurveStore, Ledger
from studyrunner.study import compile_study, loads
from studyrunner.workspace import Workspace

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def run(ray_session, tmp_path_factory):
    ws = Workspace.resolve(tmp_path_factory.mktemp("workspace"))
    compiled = compile_study(loads(TINY_STUDY))
    first = submit(compiled, ws, show_progress=False)
    return ws, compiled, first


def test_every_trial_succeeds_and_is_in_the_ledger(run):
    ws, compiled, first = run
    assert sorted(first.succeeded) == sorted(t.trial_key for t in compiled.trials)
    assert first.failed == [] and first.skipped == []
    rows = Ledger(ws.db_url).trials("tiny")
    assert len(rows) == 4
    for row in rows:
        assert row.status == "succeeded"
        assert row.attempts == 1
        assert row.started_at <= row.finished_at
        assert row.mlflow_run_id
        for name in (
            "eval_accuracy",
            "eval_exact_match",
            "eval_loss",
            "train_loss",
            "params",
            "effective_depth",
            "tokens_per_sec",
            "step_time_ms",
        ):
            assert name in row.metrics, name
    depth = {r.metrics["effective_depth"] for r in rows}
    assert depth == {1.0, 2.0}


def test_mlflow_holds_one_child_run_per_trial_nested_under_its_cell(run):
    ws, compiled, _ = run
    client = MlflowClient(ws.tracking_uri)
    exp = client.get_experiment_by_name("tiny")
    assert exp.artifact_location == ws.artifact_location("tiny")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = {r.data.tags["cell_hash"]: r for r in runs if r.data.tags.get("kind") == "cell"}
    children = [r for r in runs if r.data.tags.get("kind") == "trial"]
    assert set(parents) == {c.cell_hash for c in compiled.cells}
    assert sorted(r.data.tags["trial_key"] for r in children) == sorted(t.trial_key for t in compiled.trials)
    for child in children:
        tags = child.data.tags
        assert tags["mlflow.parentRunId"] == parents[tags["cell_hash"]].info.run_id
        assert tags["study"] == "tiny"
        assert {"git_sha", "studyrunner_version", "seed"} <= set(tags)
        assert child.info.status == "FINISHED"
        assert child.data.params["model.params.loops"] in {"1", "2"}
        assert child.info.run_name.endswith(f"seed={tags['seed']}")
        history = client.get_metric_history(child.info.run_id, "eval_accuracy")
        assert [m.step for m in history] == [6, 12]
        artifacts = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"study.yaml", "resolved_config.json"} <= artifacts
        local = client.download_artifacts(child.info.run_id, "resolved_config.json")
        assert json.loads(Path(local).read_text())["trial_key"] == tags["trial_key"]


def test_parquet_curves_per_trial(run):
    ws, compiled, _ = run
    store = CurveStore(ws.storage)
    for t in compiled.trials:
        curve = store.read("tiny", t.trial_key)
        assert (curve.trial_key == t.trial_key).all()
        assert list(curve.step) == sorted(curve.step)
        assert list(curve.dropna(subset=["eval_accuracy"]).step) == [6, 12]
        assert list(curve.dropna(subset=["train_loss"]).step) == [4, 8, 12]
    assert len(results.curves("tiny", workspace=str(ws.root)).trial_key.unique()) == 4


def test_results_frame_has_one_row_per_trial(run):
    ws, compiled, _ = run
    df = results.load("tiny", workspace=str(ws.root))
    assert len(df) == 4
    assert set(df.status) == {"succeeded"}
    assert sorted(df["model.params.loops"].unique()) == [1, 2]
    assert df["eval_accuracy"].between(0, 1).all()


def test_resubmission_runs_nothing(run):
    ws, compiled, first = run
    before = len(
        MlflowClient(ws.tracking_uri).search_runs(
            [MlflowClient(ws.tracking_uri).get_experiment_by_name("tiny").experiment_id]
        )
    )
    again = submit(compile_study(loads(TINY_STUDY)), ws, show_progress=False)
    assert again.ran == 0
    assert sorted(again.skipped) == sorted(first.succeeded)
    client = MlflowClient(ws.tracking_uri)
    assert len(client.search_runs([client.get_experiment_by_name("tiny").experiment_id])) == before


def test_a_new_seed_runs_only_the_new_trials(run):
    ws, compiled, first = run
    grown = compile_study(loads(TINY_STUDY.replace("seeds: [0, 1]", "seeds: [0, 1, 2]")))
    again = submit(grown, ws, show_progress=False)
    assert len(again.skipped) == 4
    assert len(again.succeeded) == 2
    assert all(k.endswith("-s2") for k in again.succeeded)


def test_failed_trials_are_recorded_and_run_again_by_rerun_only(ray_session, tmp_path, monkeypatch):
    ws = Workspace.resolve(tmp_path)
    compiled = compile_study(loads(TINY_STUDY.replace("name: tiny", "name: faulty")))
    # Fault injection (the one test double): every seed-1 trial raises inside its Ray worker.
    monkeypatch.setenv("STUDYRUNNER_INJECT_FAULT", "faulty-*-s1")
    first = submit(compiled, ws, show_progress=False)
    assert len(first.succeeded) == 2 and len(first.failed) == 2
    ledger = Ledger(ws.db_url)
    failed = [r for r in ledger.trials("faulty") if r.status == "failed"]
    assert sorted(r.trial_key for r in failed) == sorted(first.failed)
    assert all("injected fault" in r.error and r.seed == 1 for r in failed)
    client = MlflowClient(ws.tracking_uri)
    for r in failed:
        assert client.get_run(r.mlflow_run_id).info.status == "FAILED"
        (attempt,) = ledger.attempts(r.trial_key)
        assert attempt.error_class == "error" and attempt.traceback_artifact == "attempts/1/traceback.txt"
        assert attempt.provenance["host"] and attempt.provenance["torch_version"]
        text = Path(client.download_artifacts(r.mlflow_run_id, attempt.traceback_artifact)).read_text()
        assert "InjectedFault" in text and "Traceback" in text

    assert all(r.failure_class == "error" and r.attempts == 1 for r in failed)  # a code error: not retried

    monkeypatch.delenv("STUDYRUNNER_INJECT_FAULT")
    second = submit(compiled, ws, show_progress=False)  # failed trials are `rerun`'s, not a submit's
    assert second.ran == 0 and sorted(second.held) == sorted(first.failed)
    third = rerun("faulty", ws, RerunSelection(failed=True), options=RunOptions(show_progress=False))
    assert sorted(third.succeeded) == sorted(first.failed)
    rows = {r.trial_key: r for r in ledger.trials("faulty")}
    assert all(r.status == "succeeded" and r.error is None for r in rows.values())
    assert all(rows[k].attempts == 2 for k in first.failed)
    for k in first.failed:  # one trial, one MLflow run, however many attempts
        assert rows[k].mlflow_run_id == next(r.mlflow_run_id for r in failed if r.trial_key == k)
        assert client.get_run(rows[k].mlflow_run_id).info.status == "FINISHED"
        assert [a.status for a in ledger.attempts(k)] == ["failed", "succeeded"]


def test_a_study_asking_for_resources_no_node_has_fails_fast(ray_session, tmp_path):
    from studyrunner.errors import StudyrunnerError

    ws = Workspace.resolve(tmp_path)
    for resources, says in (("{cpu: 1, gpu: 1}", "1 GPU per trial"), ("{cpu: 64}", "64 CPU per trial")):
        compiled = compile_study(loads(TINY_STUDY.replace("resources: {cpu: 1, gpu: 0}", f"resources: {resources}")))
        with pytest.raises(StudyrunnerError, match=f"asks for {says}.*the largest node of the Ray cluster has"):
            submit(compiled, ws, show_progress=False)
    rows = Ledger(ws.db_url).trials("tiny")
    assert rows and all(r.status == "pending" and r.attempts == 0 for r in rows)  # nothing started
    assert MlflowClient(ws.tracking_uri).get_experiment_by_name("tiny") is None


def test_a_failing_trial_is_one_line_on_the_console(ray_session, tmp_path, monkeypatch, capfd):
    import io

    from rich.console import Console

    ws = Workspace.resolve(tmp_path)
    compiled = compile_study(
        loads(TINY_STUDY.replace("name: tiny", "name: loud").replace("seeds: [0, 1]", "seeds: [0]"))
    )
    monkeypatch.setenv("STUDYRUNNER_INJECT_FAULT", "loud-*")
    console = Console(file=io.StringIO(), width=200)
    result = submit(compiled, ws, console=console, show_progress=True)
    assert len(result.failed) == 2
    shown = console.file.getvalue()
    captured = capfd.readouterr()
    for key in result.failed:
        line = next(li for li in shown.splitlines() if li.startswith(f"failed {key}: "))
        assert line.endswith(f"InjectedFault: injected fault in {key} (STUDYRUNNER_INJECT_FAULT)")
    assert "Traceback" not in shown + captured.out + captured.err


def test_seeds_trained_together_are_still_one_trial_each(ray_session, tmp_path):
    """`train.vectorize_seeds`: a cell's seeds train in one Ray trial; each seed keeps its own ledger row,
    attempt, MLflow run and curve, with the metrics its separate run gives (float tolerance)."""
    from studyrunner.train import run_trial

    ws = Workspace.resolve(tmp_path)
    text = TINY_STUDY.replace("name: tiny", "name: together").replace(
        "grad_clip: 1.0,", "grad_clip: 1.0, vectorize_seeds: true,"
    )
    compiled = compile_study(loads(text))
    result = submit(compiled, ws, show_progress=False)
    assert sorted(result.succeeded) == sorted(t.trial_key for t in compiled.trials)
    ledger = Ledger(ws.db_url)
    runs = {r.trial_key: r for r in ledger.trials("together")}
    client = MlflowClient(ws.tracking_uri)
    for t in compiled.trials:
        row = runs[t.trial_key]
        assert row.attempts == 1 and len(ledger.attempts(t.trial_key)) == 1
        separate = run_trial(t.config, t.seed)
        assert row.metrics["train_loss"] == pytest.approx(separate["train_loss"], rel=1e-4)
        assert row.metrics["eval_accuracy"] == pytest.approx(separate["eval_accuracy"], abs=1 / 32 + 1e-9)
        assert client.get_run(row.mlflow_run_id).data.tags["trial_key"] == t.trial_key
        assert list(CurveStore(ws.storage).read("together", t.trial_key).dropna(subset=["train_loss"]).step) == [
            4,
            8,
            12,
        ]
    # Two Ray trials (one per cell), not four.
    assert len({a.ray_trial_id for t in compiled.trials for a in ledger.attempts(t.trial_key)}) == 2


def test_cells_of_one_shape_pack_into_one_trial(ray_session, tmp_path):
    """`train.pack: cells`: two learning rates x two seeds of one shape train as one Ray trial (one pack);
    each member keeps its own ledger row, with the metrics its separate run gives."""
    from studyrunner.train import run_trial

    ws = Workspace.resolve(tmp_path)
    text = (
        TINY_STUDY.replace("name: tiny", "name: packed")
        .replace("grad_clip: 1.0,", "grad_clip: 1.0, pack: cells,")
        .replace("model.params.loops: [1, 2]", "train.lr: [1.0e-3, 3.0e-3]")
    )
    compiled = compile_study(loads(text))
    assert len(compiled.cells) == 2 and len(compiled.trials) == 4
    result = submit(compiled, ws, show_progress=False)
    assert sorted(result.succeeded) == sorted(t.trial_key for t in compiled.trials)
    ledger = Ledger(ws.db_url)
    runs = {r.trial_key: r for r in ledger.trials("packed")}
    for t in compiled.trials:
        separate = run_trial(t.config, t.seed)
        assert runs[t.trial_key].metrics["train_loss"] == pytest.approx(separate["train_loss"], rel=1e-4)
    assert len({a.ray_trial_id for t in compiled.trials for a in ledger.attempts(t.trial_key)}) == 1
