"""A study's `tune:` section: each cell's learning rate chosen on the validation split before its seeds run,
recorded so that a resubmit, `resume` and `verify` read the same choice; refused where nothing can be chosen."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from studyrunner.cli import app
from studyrunner.errors import SpecError
from studyrunner.store import Ledger
from studyrunner.study import compile_study, loads
from studyrunner.study.tuning import choose, tuned_paths, tuning_of, with_choices
from studyrunner.tasks import build_task
from studyrunner.workspace import Workspace

TUNED = """\
name: tuned
task: {name: mqar, params: {pairs: 4, queries: 2, keys: 16, values: 16}}
model: {family: looped, params: {d_model: 16, n_heads: 2, block_layers: 1, loops: 1}}
train: {steps: 8, batch_size: 16, lr: 1.0e-3, warmup_steps: 1, log_every: 4}
eval: {every: 8, examples: 32}
grid:
  model.params.loops: [1, 2]
seeds: [0, 1]
resources: {cpu: 1, gpu: 0}
metric: {name: eval_accuracy, mode: max}
tune: {grid: {train.lr: [1.0e-3, 1.0e-2]}, metric: {name: eval_loss, mode: min}}
claims: ["eval_accuracy[loops=2] > eval_accuracy[loops=1]"]
"""


def test_validation_splits_share_no_example_with_the_test_splits():
    for name, params in [("mqar", {}), ("recall", {}), ("var_assign", {}), ("addition", {"eval_operands": [2, 3]}),
                         ("phop", {}), ("igsm", {})]:  # fmt: skip
        task = build_task(name, params, 0)
        test, validation = task.eval_sets(128), task.validation_sets(128)
        assert set(test) == set(validation)
        for split in test:
            a = {tuple(r) for r in test[split].inputs.tolist()}
            b = {tuple(r) for r in validation[split].inputs.tolist()}
            assert len(validation[split]) == 128 and not a & b, name


def _score(config: dict) -> float:
    """A made-up outcome: one-loop cells score best at the largest lr, the others at the smallest."""
    sign = 1 if config["model"]["params"]["loops"] == 1 else -1
    return config["train"]["lr"] * sign


def test_the_tuning_study_crosses_every_cell_with_the_grid_on_the_validation_split():
    compiled = compile_study(loads(TUNED))
    tuning = tuning_of(compiled)
    assert tuning.study.name == "tuned--tune" and tuning.study.seeds == [1000] and not tuning.study.claims
    assert len(tuning.trials) == 4 and {t.config["eval"]["split"] for t in tuning.trials} == {"validation"}
    assert sorted({t.config["train"]["lr"] for t in tuning.trials}) == [1.0e-3, 1.0e-2]
    # each cell takes the value its own tuning trials score best on
    outcomes = {t.trial_key: {"eval_loss": _score(t.config)} for t in tuning.trials}  # every trial ended, succeeded
    choices = choose(tuning, tuned_paths(compiled.study), outcomes)
    chosen = with_choices(compiled, choices)
    assert {c.label: c.config["train"]["lr"] for c in chosen.cells} == {"loops=1": 1.0e-3, "loops=2": 1.0e-2}
    assert {t.trial_key for t in chosen.trials}.isdisjoint(t.trial_key for t in compiled.trials[2:])  # new keys
    assert choose(tuning, tuned_paths(compiled.study), {}) is None  # nothing ended yet: no choice
    failed = {**outcomes, tuning.trials[0].trial_key: None}  # one point ended without succeeding: not chosen
    assert choose(tuning, tuned_paths(compiled.study), failed) is not None


@pytest.fixture
def own_task():
    """A user's own task registered without a validation split (every shipped task has one)."""
    from studyrunner.tasks.base import Task
    from studyrunner.tasks.mqar import MqarParams
    from studyrunner.tasks.registry import TASKS, register_task

    @register_task("own_task", MqarParams)
    def build(params, seed):
        task = build_task("mqar", params.model_dump(), seed)
        task.__class__ = type("OwnTask", (type(task),), {"validation_sets": Task.validation_sets})
        return task

    yield
    del TASKS._entries["own_task"]


@pytest.mark.parametrize(
    "change,says",
    [
        ("tune: {grid: {model.params.loops: [1, 2]}}", "only train.* settings are tuned"),
        ("tune: {grid: {train.lr: [1.0e-3]}}", "at least two distinct values"),
        ("tune: {grid: {train.lr: [1.0e-3, 2.0e-3]}}\ntask: {name: own_task, params: {}}", "no validation split"),
    ],
)
def test_a_tune_section_that_cannot_work_is_refused_in_one_line(own_task, tmp_path, change, says):
    text = "\n".join(
        line
        for line in TUNED.splitlines()
        if not line.startswith(("tune:", "task:") if "task:" in change else ("tune:",))
    )
    path = tmp_path / "t.yaml"
    path.write_text(text + "\n" + change + "\n")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and says in result.output, result.output


@pytest.mark.e2e
def test_a_tuned_study_runs_its_tuning_first_and_every_later_command_reads_the_same_choice(ray_session, tmp_path):
    from studyrunner.orchestrate import RunOptions, resume, submit

    ws = Workspace.resolve(tmp_path)
    said = io.StringIO()
    result = submit(compile_study(loads(TUNED)), ws, show_progress=False, console=Console(file=said, width=300))
    text = said.getvalue()
    assert "tune: 4 tuning trials first" in text and "loops=1: lr" in text, text
    ledger = Ledger(ws.db_url)
    assert {t.status for t in ledger.trials("tuned--tune")} == {"succeeded"} and len(result.succeeded) == 4
    lrs = {c.config["train"]["lr"] for c in ledger.cells("tuned")}
    assert lrs <= {1.0e-3, 1.0e-2}
    # again: nothing runs, the choice read from the ledger gives the same trial keys
    again = submit(compile_study(loads(TUNED)), ws, show_progress=False, console=Console(file=io.StringIO()))
    assert again.ran == 0 and set(again.skipped) == {t.trial_key for t in ledger.trials("tuned")}
    assert resume("tuned", ws, options=RunOptions(show_progress=False)).ran == 0
    shown = CliRunner().invoke(app, ["verify", "tuned", "--workspace", str(tmp_path)])
    assert "chosen per cell on the validation split" in shown.stdout, shown.output
    rows = json.loads(CliRunner().invoke(app, ["verify", "tuned", "--workspace", str(tmp_path), "-f", "json"]).stdout)
    assert {s["cell"] for side in rows[0]["tuned"].values() for s in side} == {"loops=1", "loops=2"}
    # each arm at its own best rate is the design, not a confound (the `tuned` entry says what each chose)
    assert not any("train.lr" in t["detail"] for t in rows[0]["validity"] if t["threat"] == "confound"), rows[0]
    with pytest.raises(SpecError):  # a study name too long for its tuning study's
        loads(TUNED.replace("name: tuned", "name: " + "x" * 60))


def test_plan_says_which_tuning_trials_run_first(tmp_path):
    path = tmp_path / "tuned.yaml"
    path.write_text(TUNED)
    result = CliRunner().invoke(app, ["plan", str(path)])
    assert result.exit_code == 0, result.output
    assert "tuning first: 4 trials as study 'tuned--tune' (train.lr in [0.001, 0.01]" in " ".join(result.output.split())
