"""MELT's conversion from a finished LoopLM trial (seed 001): `model.params.teacher` resolved at submit by
the orchestrator (ledger + storage), the weights loaded by the trial from the teacher's final checkpoint;
through the real stack (Ray Tune, the ledger, MLflow)."""

import shutil
import subprocess
import sys

import pytest
import torch
from test_ledger import _set_submission
from typer.testing import CliRunner

from studyrunner.cli import app
from studyrunner.errors import StudyrunnerError
from studyrunner.orchestrate import submit
from studyrunner.orchestrate.teachers import resolve_teachers
from studyrunner.store import Ledger
from studyrunner.study import compile_study, loads
from studyrunner.train.checkpoint import final_weights
from studyrunner.train.trainer import build_trial
from studyrunner.workspace import Workspace

pytestmark = pytest.mark.e2e

TASK = "task: {name: mqar, params: {pairs: 4, queries: 2, keys: 16, values: 16}}\n"
COMMON = (
    TASK
    + "train: {steps: 6, batch_size: 8, lr: 1.0e-3, warmup_steps: 1, log_every: 3}\n"
    + "eval: {every: 6, examples: 16}\n"
)
TEACHER = (
    "name: teacher\n"
    + COMMON
    + "model: {family: looplm, params: {d_model: 16, n_heads: 2, block_layers: 2, loops: 2}}\n"
    + "grid: {model.family: [looplm, looped]}\nseeds: [0]\n"
)


def student(key: str, name: str = "student", **params) -> str:
    extra = "".join(f", {k}: {v}" for k, v in params.items())
    return (
        f"name: {name}\n"
        + COMMON.replace("log_every: 3}", "log_every: 3, distill_lambda: 1.0, align_beta: 0.1, align_start_step: 3}")
        + "model: {family: melt, params: {d_model: 16, n_heads: 2, block_layers: 2, loops: 2, chunk_size: 2, "
        + f"teacher: {key}, interpolate_steps: 3{extra}}}}}\n"
        + "seeds: [0]\n"
    )


@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory):
    ws = Workspace.resolve(tmp_path_factory.mktemp("workspace"))
    compiled = compile_study(loads(TEACHER))
    result = submit(compiled, ws, show_progress=False)
    assert len(result.succeeded) == 2
    keys = {t.config["model"]["family"]: t.trial_key for t in compiled.trials}
    return ws, keys


def test_a_student_trains_from_its_teacher_through_the_stack(trained):
    ws, keys = trained
    result = submit(compile_study(loads(student(keys["looplm"]))), ws, show_progress=False)
    assert len(result.succeeded) == 1, result
    (row,) = Ledger(ws.db_url).trials("student")
    for name in ("train_distill", "train_attn_align", "distill_weight", "kv_cache_bytes_per_token"):
        assert name in row.metrics, name
    assert row.metrics["attn_align_weight"] == 0.1 and row.metrics["interp_alpha"] == 1.0
    assert row.metrics["kv_cache_bytes_per_token"] == 2 * 2 * 16 * 4  # N rows of keys and values, fp32
    # the teacher, scored in the student's trial: T = 2 loops of rows, and its own decoded loss
    assert row.metrics["teacher_kv_cache_bytes_per_token"] == 2 * row.metrics["kv_cache_bytes_per_token"]
    assert "teacher_eval_decode_loss" in row.metrics and "teacher_decode_tokens_per_sec" not in row.metrics


def test_the_student_starts_from_the_teachers_final_weights(trained):
    ws, keys = trained
    compiled = compile_study(loads(student(keys["looplm"], name="student-init")))
    teacher = resolve_teachers(compiled, Ledger(ws.db_url), ws)[keys["looplm"]]
    trial = build_trial(compiled.trials[0].config, 0, teacher=teacher)
    weights = final_weights(teacher["checkpoint"], teacher["config"], teacher["seed"])
    mine = trial.model.state_dict()
    for name in ("embed.tokens.weight", "blocks.1.attn.qkv.weight", "head.out.weight"):
        assert torch.equal(mine[name], weights[name]), name
    assert "exit_gate.linear.weight" in weights and not any(k.startswith("exit_gate") for k in mine)


def test_teachers_that_cannot_teach_fail_at_submit_in_one_line(trained, tmp_path):
    ws, keys = trained
    ledger = Ledger(ws.db_url)

    def refused(text: str) -> str:
        with pytest.raises(StudyrunnerError) as err:
            submit(compile_study(loads(text)), ws, show_progress=False)
        assert "\n" not in str(err.value) and "model.params.teacher" in str(err.value)
        assert "refused" not in {s.name for s in ledger.studies()}  # nothing was written
        return str(err.value)

    missing = keys["looplm"].replace("-s0", "-s9")
    assert "is not in the ledger" in refused(student(missing, name="refused"))
    assert "'looped' trial" in refused(student(keys["looped"], name="refused"))
    assert "does not fit" in refused(student(keys["looplm"], name="refused").replace("d_model: 16", "d_model: 32"))

    pending = compile_study(loads(TEACHER.replace("name: teacher", "name: unrun")))
    ledger.register(pending)
    assert "is pending, not succeeded" in refused(student(pending.trials[0].trial_key, name="refused"))

    location = resolve_teachers(compile_study(loads(student(keys["looplm"]))), ledger, ws)[keys["looplm"]]
    kept = tmp_path / "kept"
    shutil.copytree(location["checkpoint"], kept)
    shutil.rmtree(location["checkpoint"])
    try:
        assert "no final checkpoint" in refused(student(keys["looplm"], name="refused"))
    finally:
        shutil.copytree(kept, location["checkpoint"])


def test_a_teacher_left_running_by_a_killed_submit_is_called_stale_with_the_resume_command(tmp_path):
    """Its submit was killed mid-trial: the teacher is stale, not "running", and `resume` finishes it."""
    ws = Workspace.resolve(tmp_path)
    ledger = Ledger(ws.db_url)
    teacher = compile_study(loads(TEACHER))
    ledger.register(teacher)
    key = next(t.trial_key for t in teacher.trials if t.config["model"]["family"] == "looplm")
    submission = ledger.open_submission("teacher", "submit")
    assert ledger.claim("teacher", [key], submission) == [key]
    ledger.start_attempt(key, submission)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _set_submission(ledger, submission, pid=int(gone.stdout))  # the submitting process was killed
    assert ledger.trials_by_key([key])[0].status == "running"
    with pytest.raises(StudyrunnerError) as err:
        resolve_teachers(compile_study(loads(student(key))), ledger, ws)
    said = str(err.value)
    assert "\n" not in said and f"trial {key!r} is stale" in said and "is running" not in said, said
    assert f"finish it with: studyrunner resume teacher --workspace {tmp_path}" in said, said


def test_the_cli_says_what_is_wrong_with_a_teacher(trained, write_study):
    ws, keys = trained
    path = write_study(student(keys["looplm"].replace("-s0", "-s7"), name="cli-student"))
    result = CliRunner().invoke(app, ["submit", str(path), "--workspace", str(ws.root), "--no-progress"])
    assert result.exit_code == 1
    assert "model.params.teacher: trial" in result.output and "is not in the ledger" in result.output
