"""DeepSpeed trials (`train.engine: deepspeed`): validation, and real runs on 2 CPU workers.

The runs are real: a Ray session, Ray Tune trials that each drive a Ray Train `TorchTrainer` of two gloo
workers calling `deepspeed.initialize` (ZeRO 1, 2 and 3, a torch AdamW client optimizer), the SQLite
ledger, the MLflow store and Parquet curves. They skip where deepspeed is not installed.

Tolerance against the plain engine. The DeepSpeed engine computes the whole batch's mean-loss gradient
from two half batches (each worker's forward and backward), summed over the workers; the plain engine
from one forward over the whole batch. Same maths, other float summation order: the curves agree to
float rounding. Measured here: identical to the last bit for ZeRO 1 and 2 over these 12 steps, ~1e-7
relative for ZeRO 3 (whose partitioned parameters are gathered and reduced in other pieces); over 200
steps of the quickstart-size cell the manual (docs/guide/deepspeed.md) gives the figures. Held to rtol
1e-5 on losses; eval accuracy and exact match to one example (a near-tie between two logits could flip one).
"""

from __future__ import annotations

import importlib.util
import re

import pytest
from mlflow import MlflowClient

from studyrunner.errors import StudyrunnerError
from studyrunner.orchestrate import RerunSelection, RunOptions, ensure_ray, rerun, submit
from studyrunner.orchestrate.cluster.capacity import check_cluster_fits, concurrent_runs
from studyrunner.store import CurveStore, Ledger
from studyrunner.study import compile_study, loads
from studyrunner.study.schema import Resources
from studyrunner.train import MemoryReporter, run_trial
from studyrunner.workspace import Workspace

HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_deepspeed = pytest.mark.skipif(not HAVE_DEEPSPEED, reason="deepspeed is not installed (the deepspeed extra)")

TIMING = {"tokens_per_sec", "step_time_ms", "train_time_s"}
EXAMPLES = 32

BASE = f"""\
name: NAME
task: {{name: phop, params: {{alphabet: 4, seq_len: 12, hops: 1}}}}
model: {{family: looped, params: {{d_model: 16, n_heads: 2, block_layers: 1, loops: 2}}}}
train: {{steps: 12, batch_size: 16, lr: 1.0e-3, warmup_steps: 2, log_every: 1, checkpoint_every: 4TRAIN}}
eval: {{every: 6, examples: {EXAMPLES}}}
seeds: SEEDS
"""


def study_text(name: str, train: str = "", seeds: str = "[0]", extra: str = "") -> str:
    return BASE.replace("NAME", name).replace("TRAIN", train).replace("SEEDS", seeds) + extra


DEEPSPEED = ", engine: deepspeed"
ZERO = ", engine: deepspeed, deepspeed: {zero_stage: 1"  # + further knobs and "}"
WORKERS = "resources: {cpu: 0.5, workers: 2}\n"


# ------------------------------------------------------------------------------------- validation


def hashes(text: str) -> list[str]:
    return [c.cell_hash for c in compile_study(loads(text)).cells]


def test_the_engine_unset_or_plain_keeps_cell_hashes_and_deepspeed_is_resolved_in_full():
    plain = hashes(study_text("h"))
    assert hashes(study_text("h", ", engine: plain")) == plain
    compiled = compile_study(loads(study_text("h", DEEPSPEED, extra=WORKERS)))
    assert [c.cell_hash for c in compiled.cells] != plain
    assert compiled.cells[0].config["train"]["engine"] == "deepspeed"
    assert compiled.cells[0].config["train"]["deepspeed"] == {"zero_stage": 1, "gradient_accumulation_steps": 1}
    assert "engine" not in compile_study(loads(study_text("h", ", engine: plain"))).cells[0].config["train"]
    knobs = ", engine: deepspeed, deepspeed: {zero_stage: 3, stage3_param_persistence_threshold: 0}"
    resolved = compile_study(loads(study_text("h", knobs, extra=WORKERS))).cells[0].config["train"]["deepspeed"]
    assert resolved == {"zero_stage": 3, "gradient_accumulation_steps": 1, "stage3_param_persistence_threshold": 0}


UT_ACT = "model: {family: ut_act, params: {d_model: 16, n_heads: 2, loops: 3, memory_slots: 2}}\n"


@pytest.mark.parametrize(
    ("train", "extra", "field", "words"),
    [
        (DEEPSPEED, "", "resources", "set resources.workers"),
        ("", WORKERS, "resources.workers", "only train.engine: deepspeed"),
        (", deepspeed: {zero_stage: 2}", "", "train.deepspeed", "train.engine is not deepspeed"),
        (ZERO.replace("1", "4") + "}", WORKERS, "train.deepspeed.zero_stage", "1, 2 or 3"),
        (
            ZERO + ", stage3_prefetch_bucket_size: 8}",
            WORKERS,
            "train.deepspeed",
            "stage 3 only",
        ),
        (
            ZERO + ", offload: cpu}",
            WORKERS,
            "train.deepspeed.offload",
            "unknown key",
        ),
        (
            ZERO + ", gradient_accumulation_steps: 3}",
            WORKERS,
            "train.batch_size",
            "does not split",
        ),
        (DEEPSPEED + ", vectorize_seeds: true", WORKERS, "train.vectorize_seeds", "cannot be combined"),
        (DEEPSPEED + ", compile: default", WORKERS, "train.compile", "cannot be combined"),
        (DEEPSPEED + ", precision: bf16", WORKERS, "train.precision", "bf16 is not supported"),
        (DEEPSPEED, "resources: {workers: 2, gpu: 0.5}\n", "resources.gpu", "0 or 1"),
        (", engine: zero", "", "train.engine", "'plain' or 'deepspeed'"),
    ],
)
def test_invalid_combinations_are_rejected_naming_the_field(train, extra, field, words):
    with pytest.raises(StudyrunnerError) as err:
        compile_study(loads(study_text("bad", train, extra=extra)))
    message = str(err.value)
    assert re.search(rf":\d+: {re.escape(field)}: ", message), message
    assert words in message and "\n" not in message


def test_a_halting_family_is_rejected_with_deepspeed():
    text = re.sub(r"model: .*\n", UT_ACT, study_text("halting", DEEPSPEED, extra=WORKERS))
    with pytest.raises(StudyrunnerError, match=r"train\.engine: deepspeed does not train models with auxiliary"):
        compile_study(loads(text))


def test_a_mixed_grid_runs_plain_cells_as_plain_trials():
    compiled = compile_study(loads(study_text("mixed", extra=WORKERS + "grid: {train.engine: [plain, deepspeed]}\n")))
    engines = sorted(str(c.config["train"].get("engine")) for c in compiled.cells)
    assert engines == ["None", "deepspeed"]
    assert compiled.cells[0].cell_hash in hashes(study_text("mixed"))  # the plain cell is the plain study's


def test_the_cluster_must_hold_every_worker_at_once_and_the_driver_takes_no_cpu():
    resources = Resources(cpu=1, workers=2)
    one_node = [{"Alive": True, "Resources": {"CPU": 2.0, "memory": 8e9}}]
    check_cluster_fits(resources, one_node)  # the README's example fits a 2-CPU machine
    with pytest.raises(StudyrunnerError, match=r"needs 3 workers of 1 CPU each .* cannot place them"):
        check_cluster_fits(Resources(cpu=1, workers=3), one_node)
    two_small = [{"Alive": True, "Resources": {"CPU": 1.5}}, {"Alive": True, "Resources": {"CPU": 1.5}}]
    check_cluster_fits(resources, two_small)  # one worker per node
    assert concurrent_runs(resources, {"CPU": 8.0}) == 4
    assert concurrent_runs(Resources(cpu=1, gpu=1, workers=2), {"CPU": 64.0, "GPU": 2.0}) == 1
    assert concurrent_runs(resources, {"CPU": 1.0}) == 1


# ------------------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def ray_four_cpus():
    """A Ray of its own with 4 logical CPUs (the shared session Ray has 2), stopped after the module."""
    import ray

    ray.shutdown()
    ensure_ray(num_cpus=4)  # logical CPUs: three 2-worker runs at 0.5 CPU a worker (their drivers take none)
    yield
    ray.shutdown()


@pytest.mark.e2e
def test_workers_that_take_every_cpu_are_placed(ray_four_cpus, tmp_path):
    """Two workers of 2 CPUs on the 4-CPU Ray: their Train driver reserves no CPU (one that reserved 0.1 would
    leave them no room, and the study would be refused). Without deepspeed installed the workers fail at its
    import: they ran."""
    ws = Workspace.resolve(tmp_path)
    text = study_text("full", DEEPSPEED, extra="resources: {cpu: 2, workers: 2}\n")
    result = submit(compile_study(loads(text)), ws, show_progress=False)
    (row,) = Ledger(ws.db_url).trials("full")
    if HAVE_DEEPSPEED:
        assert result.succeeded == [row.trial_key] and row.status == "succeeded"
    else:
        assert result.failed == [row.trial_key] and "deepspeed" in row.error, row.error


@pytest.fixture(scope="module")
def zero_runs(ray_four_cpus, tmp_path_factory):
    ws = Workspace.resolve(tmp_path_factory.mktemp("deepspeed"))
    text = study_text("zero", ZERO + "}", extra=WORKERS + "grid: {train.deepspeed.zero_stage: [1, 2, 3]}\n")
    compiled = compile_study(loads(text))
    return ws, compiled, submit(compiled, ws, show_progress=False)


def plain_run(config: dict, seed: int) -> tuple[MemoryReporter, dict]:
    plain = {**config, "train": {k: v for k, v in config["train"].items() if k not in ("engine", "deepspeed")}}
    reporter = MemoryReporter()
    return reporter, run_trial(plain, seed, reporter)


def assert_close(name: str, a: float, b: float) -> None:
    if name.startswith(("eval_accuracy", "eval_exact_match")):
        assert a == pytest.approx(b, abs=1.01 / EXAMPLES), name
    else:
        assert a == pytest.approx(b, rel=1e-5, abs=1e-7), name


@pytest.mark.e2e
@needs_deepspeed
def test_zero_1_2_and_3_train_on_two_workers_and_match_the_plain_engine(zero_runs):
    ws, compiled, result = zero_runs
    assert sorted(result.succeeded) == sorted(t.trial_key for t in compiled.trials) and not result.failed
    curves = CurveStore(ws.storage)
    stages = set()
    for trial in compiled.trials:
        stages.add(trial.config["train"]["deepspeed"]["zero_stage"])
        reporter, final = plain_run(trial.config, trial.seed)
        curve = curves.read("zero", trial.trial_key)
        rows = {int(r["step"]): r for r in curve.to_dict("records")}
        assert sorted(rows) == [r["step"] for r in reporter.rows] == list(range(13))
        for plain_row in reporter.rows:
            for name, value in plain_row.items():
                if name not in TIMING and name != "step":
                    assert_close(name, rows[plain_row["step"]][name], value)
        (row,) = Ledger(ws.db_url).trials("zero", [trial.trial_key])
        assert set(row.metrics) == set(final)
        for name, value in final.items():
            if name not in TIMING:
                assert_close(name, row.metrics[name], value)
    assert stages == {1, 2, 3}


@pytest.mark.e2e
@needs_deepspeed
def test_deepspeed_trials_are_recorded_like_any_other(zero_runs):
    ws, compiled, _ = zero_runs
    ledger = Ledger(ws.db_url)
    client = MlflowClient(ws.tracking_uri)
    experiment = client.get_experiment_by_name("zero")
    runs = client.search_runs([experiment.experiment_id], "tags.kind = 'trial'", max_results=100)
    by_key = {r.data.tags["trial_key"]: r for r in runs}
    assert sorted(by_key) == sorted(t.trial_key for t in compiled.trials)
    for trial in compiled.trials:
        (row,) = ledger.trials("zero", [trial.trial_key])
        assert (
            row.status == "succeeded" and row.attempts == 1 and row.mlflow_run_id == by_key[trial.trial_key].info.run_id
        )
        (attempt,) = ledger.attempts(trial.trial_key)
        stage = str(trial.config["train"]["deepspeed"]["zero_stage"])
        assert attempt.host and attempt.resumed_from_step == 0
        assert {k: attempt.provenance[k] for k in ("engine", "zero_stage", "workers", "dist_backend")} == {
            "engine": "deepspeed",
            "zero_stage": stage,
            "workers": "2",
            "dist_backend": "gloo",
        }
        run = by_key[trial.trial_key]
        assert run.info.status == "FINISHED" and run.data.tags["status"] == "succeeded"
        assert run.data.params["runtime.engine"] == "deepspeed" and run.data.params["runtime.zero_stage"] == stage
        assert run.data.params["train.deepspeed.zero_stage"] == stage
        history = client.get_metric_history(run.info.run_id, "train_loss")
        assert sorted(m.step for m in history) == list(range(1, 13))
        assert [m.step for m in client.get_metric_history(run.info.run_id, "eval_accuracy")] == [6, 12]


@pytest.mark.e2e
@needs_deepspeed
def test_a_killed_deepspeed_trial_is_rerun_from_its_checkpoint_bit_exactly_until_its_divergence_rule_holds(
    zero_runs, tmp_path, monkeypatch
):
    """The ZeRO-3 cell, seed 0, with `retries: 0`: rank 0 SIGKILLed after step 6 (checkpoints every 4) fails
    the trial (infrastructure). `rerun --failed` resumes it from step 4, and every record after the resume
    equals the uninterrupted run's (zero_runs) to the last bit, until the study's divergence rule holds on
    rank 0 at step 9 (train_loss 1.5906 > 1.55; the largest before is 1.5435): every worker stops there."""
    ws_zero, zero_compiled, _ = zero_runs
    ws = Workspace.resolve(tmp_path)
    extra = WORKERS + "retries: 0\ndivergence: 'train_loss > 1.55'\n"
    compiled = compile_study(
        loads(study_text("killed", ", engine: deepspeed, deepspeed: {zero_stage: 3}", extra=extra))
    )
    (killed,) = compiled.trials
    monkeypatch.setenv("STUDYRUNNER_INJECT_KILL", f"{killed.trial_key}@6")
    first = submit(compiled, ws, show_progress=False)
    assert first.failed == [killed.trial_key]
    again = rerun("killed", ws, RerunSelection(failed=True), options=RunOptions(show_progress=False))
    assert again.diverged == [killed.trial_key]

    ledger = Ledger(ws.db_url)
    (row,) = ledger.trials("killed")
    attempts = ledger.attempts(killed.trial_key)
    assert [(a.status, a.error_class) for a in attempts] == [("failed", "infrastructure"), ("diverged", "divergence")]
    assert "DeepSpeed workers failed: rank 0: " in attempts[0].message
    assert attempts[1].resumed_from_step == 4
    assert row.status == "diverged" and "step 9" in row.error and "train_loss > 1.55" in row.error
    assert row.metrics["train_loss"] > 1.55 and "eval_loss" in row.metrics  # a data point: metrics kept

    (reference,) = [t for t in zero_compiled.trials if t.cell_hash == killed.cell_hash]
    curve = CurveStore(ws.storage).read("killed", killed.trial_key).set_index("step")
    uninterrupted = CurveStore(ws_zero.storage).read("zero", reference.trial_key).set_index("step")
    assert list(curve.index) == list(range(10))  # every step once, across the two attempts
    for name in ("train_loss", "lr", "eval_loss", "eval_accuracy"):
        ours, theirs = curve[name].dropna(), uninterrupted[name].dropna().loc[:9]
        assert ours.tolist() == theirs.tolist(), name
    client = MlflowClient(ws.tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("killed").experiment_id], "tags.kind = 'trial'")
    assert run.info.run_id == row.mlflow_run_id and run.data.tags["status"] == "diverged"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train_loss")) == list(range(1, 10))
