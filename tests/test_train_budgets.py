"""Budgets, trajectories and representation diagnostics through the trainer:
eval.loops and eval.budgets are one mechanism, enumerate_all logs every grid trajectory and their spread,
LoopFormer's objective terms are weighted like any aux term, every family's loop steps are diagnosed on a
probe batch, and bad settings are refused at validate naming the field."""

import math

import pytest
import torch

from studyrunner.errors import SpecError
from studyrunner.models import build_model
from studyrunner.models.representations import representation_names
from studyrunner.models.trajectories import front_loading, grid_trajectories
from studyrunner.study import compile_study, loads
from studyrunner.tasks import build_task
from studyrunner.train import MemoryReporter, run_trial
from studyrunner.train.evaluation import best_fronts, evaluate, evaluate_schedules, held_out_halves, spearman

STUDY = """\
name: budgets
task: {{name: phop, params: {{alphabet: 4, seq_len: 12, hops: 1}}}}
model: {{family: {family}, params: {{d_model: 16, n_heads: 2, {model}}}}}
train: {{steps: {steps}, batch_size: 16, warmup_steps: 1, log_every: {log_every}, {train}}}
eval: {{every: 6, examples: 32, {eval}}}
metric: {{name: {metric}, mode: min}}
"""


def study(family="loopformer", model="loops: 4", train="", eval="", steps=6, log_every=3, metric="eval_loss"):
    text = STUDY.format(
        family=family, model=model, train=train, eval=eval, steps=steps, log_every=log_every, metric=metric
    )
    return compile_study(loads(text))


def config(**kw):
    return study(**kw).cells[0].config


def test_unset_new_knobs_stay_out_of_the_resolved_config():
    cfg = config(family="looped", model="loops: 2", eval="loops: [1, 3]")
    assert "budgets" not in cfg["eval"] and "trajectory" not in cfg["eval"] and cfg["eval"]["loops"] == [1, 3]
    assert not {"trajectory", "shortcut_lambda", "consistency_lambda"} & set(cfg["train"])
    with_budgets = config(family="looped", model="loops: 2", eval="loops: [1, 3], budgets: [2]")
    assert with_budgets["eval"]["budgets"] == [2]


def test_loops_and_budgets_are_one_mechanism():
    reporter = MemoryReporter()
    final = run_trial(config(family="looped", model="loops: 2", eval="loops: [1, 3], budgets: [3, 1]"), 0, reporter)
    for name in ("eval_loss", "eval_accuracy", "eval_exact_match"):
        for n in (1, 3):
            assert final[f"{name}_budget_{n}"] == final[f"{name}_loops_{n}"]
            assert [s for s, _ in reporter.series(f"{name}_budget_{n}")] == [6]  # once, after the last step
    assert final["eval_loss_budget_1"] != final["eval_loss_budget_3"]


def test_loopformer_trains_with_weighted_objective_terms():
    a, b = MemoryReporter(), MemoryReporter()
    fixed = run_trial(config(model="loops: 4, objective: fixed", log_every=1), 0, a)
    run_trial(config(model="loops: 4, objective: shortcut_consistency", log_every=1), 0, b)
    # step 1: the same weights and batch; the full run's loss is the same, the terms come on top at 0.1 each
    (_, loss_a), (_, loss_b) = a.series("train_loss")[0], b.series("train_loss")[0]
    short, cons = b.series("train_shortcut")[0][1], b.series("train_consistency")[0][1]
    assert loss_b - loss_a == pytest.approx(0.1 * short + 0.1 * cons, rel=1e-5)
    assert b.series("shortcut_weight")[0][1] == b.series("consistency_weight")[0][1] == 0.1
    assert "train_shortcut" not in fixed
    weighted = run_trial(config(train="shortcut_lambda: 0.5, consistency_lambda: 0", log_every=1), 0)
    assert weighted["shortcut_weight"] == 0.5 and weighted["consistency_weight"] == 0.0
    # diagnostics the model declares, and nothing undeclared
    cfg = config()
    facts = build_task(cfg["task"]["name"], cfg["task"]["params"], 0).facts
    declared = build_model(cfg["model"]["family"], cfg["model"]["params"], facts).diagnostic_names
    logged = {k for row in b.rows for k in row} - {"step"}
    trainer = {"train_loss", "lr", "step_time_ms", "tokens_per_sec", "params", "effective_depth", "weights_bytes"}
    assert not {n for n in logged - declared - trainer if not n.startswith("eval_")}
    assert {"adaln_gate_step_4", "repr_cka_0_4", "repr_erank_step_4"} <= logged


def test_budgets_and_train_trajectory_on_loopformer():
    cfg = config(model="loops: 4, block_layers: 2", train="trajectory: [0.4, 0.4, 0.2]", eval="budgets: [1, 2, 6]")
    final = run_trial(cfg, 0)
    assert final["effective_depth"] == 6  # 2 blocks x the 3 trained steps
    for m in (1, 2, 6):
        assert 0 <= final[f"eval_accuracy_budget_{m}"] <= 1 and math.isfinite(final[f"eval_loss_budget_{m}"])
    named = run_trial(config(eval="budgets: [2], trajectory: front_loaded"), 0)
    uniform = run_trial(config(eval="budgets: [2]"), 0)
    assert named["eval_loss"] == uniform["eval_loss"]  # training and the trained depth are unaffected
    assert named["eval_loss_budget_2"] != uniform["eval_loss_budget_2"]  # (2/3, 1/3) vs (1/2, 1/2)


def test_enumerate_all_logs_every_grid_trajectory_and_their_spread():
    compiled = study(eval="budgets: [2, 4], trajectory: enumerate_all", metric="eval_loss_budget_2_spread")
    final = run_trial(compiled.cells[0].config, 0)
    labels = ["1_3", "2_2", "3_1"]  # every 2-step trajectory on the 1/4 grid
    losses = [final[f"eval_loss_budget_2_steps_{label}"] for label in labels]
    assert final["eval_loss_budget_2_steps_2_2"] == final["eval_loss_budget_2"]  # the uniform one
    assert final["eval_loss_budget_2_spread"] == pytest.approx(
        final["eval_loss_budget_2_max"] - final["eval_loss_budget_2_min"]
    )
    assert final["selection_heldout"] == 1.0  # chosen on one half of the examples, scored on the other
    assert final["eval_loss_budget_2_front_rho"] == pytest.approx(spearman([0.0, 0.5, 1.0], losses))
    assert final["eval_loss_budget_4_spread"] == 0.0 and "eval_loss_budget_4_steps_1_1_1_1" in final
    # validate knows every name: a metric from the enumeration is accepted, one that cannot exist is not
    study(eval="budgets: [2], trajectory: enumerate_all", metric="eval_accuracy_budget_2_steps_3_1")
    with pytest.raises(SpecError, match="metric.name: no trial of this study reports 'eval_loss_budget_2_steps_4_0'"):
        study(eval="budgets: [2], trajectory: enumerate_all", metric="eval_loss_budget_2_steps_4_0")


def test_the_best_trajectory_is_chosen_on_one_half_of_the_examples_and_scored_on_the_other():
    """`_min`/`_max` are the test-half scores of the trajectories best and worst on the validation half, so the
    best of many is not inflated by the noise it was chosen for; the halves are disjoint and cover the split."""
    cfg = config(eval="budgets: [2], trajectory: enumerate_all", metric="eval_loss_budget_2_spread")
    task = build_task(cfg["task"]["name"], cfg["task"]["params"], 0)
    model = build_model(cfg["model"]["family"], cfg["model"]["params"], task.facts)
    torch.manual_seed(0)
    with torch.no_grad():  # off its zero-initialised modulators, where every trajectory scores the same
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    splits = task.eval_sets(33)
    validation, test = held_out_halves(splits)
    assert len(validation[""]) == 17 and len(test[""]) == 16
    assert not set(map(tuple, validation[""].inputs.tolist())) & set(map(tuple, test[""].inputs.tolist())) or (
        len({tuple(r) for r in splits[""].inputs.tolist()}) < 33  # repeats in the split itself
    )
    record = evaluate_schedules(model, task, splits, 2, "_budget_2")
    trajectories = grid_trajectories(model.trajectory_grid, 2)
    on = {
        half: [evaluate(model, task, s, trajectory=t)["eval_loss"] for t in trajectories]
        for half, s in (("validation", validation), ("test", test))
    }
    best = min(range(3), key=on["validation"].__getitem__)
    worst = max(range(3), key=on["validation"].__getitem__)
    assert record["eval_loss_budget_2_min"] == on["test"][best]
    assert record["eval_loss_budget_2_max"] == on["test"][worst]
    assert record["eval_loss_budget_2_best_front"] == front_loading(trajectories[best])
    assert record["selection_heldout"] == 1.0


def test_best_schedules_front_loading():
    """The paper's statement, "the best schedules are front-loaded", as numbers: the front-loading of the best
    trajectory and the mean of the best fifth; ties for best share it."""
    fronts = [0.0, 0.25, 0.5, 0.75, 1.0, 0.9, 0.1, 0.6, 0.4, 0.3]
    losses = [5.0, 4.0, 3.0, 2.0, 1.0, 1.0, 6.0, 7.0, 8.0, 9.0]
    assert best_fronts(fronts, losses, lower_is_better=True) == (pytest.approx(0.95), pytest.approx(0.95))
    accuracy = [-v for v in losses]
    assert best_fronts(fronts, accuracy, lower_is_better=False) == (pytest.approx(0.95), pytest.approx(0.95))
    # one clear best; the top fifth (2 of 10) reaches into a nine-way tie, which counts whole
    assert best_fronts(fronts, [1.0] * 9 + [0.0], lower_is_better=True) == (0.3, pytest.approx(0.48))


def test_spearman():
    assert spearman([1, 2, 3], [3, 2, 1]) == -1.0
    assert spearman([1, 2, 3, 4], [1, 1, 2, 2]) == pytest.approx(0.894427, rel=1e-5)
    assert spearman([1, 2, 3], [5, 5, 5]) is None


FAMILIES = {
    "looped": ("loops: 3, memory_slots: 2", 3),
    "ut_act": ("loops: 3, memory_slots: 2, norm: layernorm", 3),
    "adaptive_layers": ("n_layers: 2, loops: 2", 4),  # every layer's steps in turn
    "loopformer": ("loops: 3, conditioning: loop_index", 3),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_reports_representation_diagnostics_per_loop_step(family):
    model_params, steps = FAMILIES[family]
    cfg = config(family=family, model=model_params)
    task = build_task(cfg["task"]["name"], cfg["task"]["params"], 0)
    model = build_model(cfg["model"]["family"], cfg["model"]["params"], task.facts)
    out = evaluate(model, task, task.eval_sets(16))
    reported = {k for k in out if k.startswith("repr_")}
    assert reported == representation_names(steps) <= model.diagnostic_names
    assert all(math.isfinite(out[k]) for k in reported)
    assert all(-1 <= out[f"repr_cos_step_{t}"] <= 1 and out[f"repr_update_step_{t}"] >= 0 for t in range(1, steps + 1))
    assert all(0 <= out[k] <= 1 + 1e-9 for k in reported if k.startswith("repr_cka"))
    assert all(1 <= out[f"repr_erank_step_{t}"] <= 16 for t in range(steps + 1))
    assert getattr(model, "step_trace", None) is None  # the trace is gone: training pays nothing
    assert not {k for k in evaluate(model, task, task.eval_sets(16), loops=2) if k.startswith("repr_")}


def test_representation_diagnostics_are_validated_metric_names():
    study(family="looped", model="loops: 2", metric="repr_cka_adjacent_mean")
    with pytest.raises(SpecError, match="metric.name: no trial of this study reports 'repr_cos_step_3'"):
        study(family="looped", model="loops: 2", metric="repr_cos_step_3")


@pytest.mark.parametrize(
    "family,model,train,eval,message",
    [
        ("loopformer", "loops: 4", "trajectory: [0.5, 0.6]", "", "train.trajectory: step sizes must sum to 1"),
        ("loopformer", "loops: 4", "trajectory: [0.5, 0, 0.5]", "", "train.trajectory: step 1 is 0; every step"),
        ("loopformer", "loops: 2", "trajectory: [0.25, 0.25, 0.5]", "", "train.trajectory: lists 3 steps, more than"),
        ("loopformer", "loops: 4, conditioning: none", "trajectory: back_loaded", "", "train.trajectory: step sizes"),
        ("looped", "loops: 4", "trajectory: back_loaded", "", "train.trajectory: model family 'looped' takes no"),
        ("loopformer", "loops: 4", "", "trajectory: enumerate_all", "eval.trajectory: applies to the evaluations"),
        ("loopformer", "loops: 4", "", "budgets: [8], trajectory: enumerate_all", "eval.trajectory: enumerate_all"),
        ("loopformer", "loops: 4", "", "budgets: [2, 4], trajectory: [0.5, 0.5]", "eval.trajectory: lists 2 steps"),
        ("loopformer", "loops: 4", "", "budgets: [2], trajectory: [0.5, 0.5, 0.5]", "eval.trajectory: step sizes"),
        ("loopformer", "loops: 4", "trajectory: enumerate_all", "", "train.trajectory: unknown schedule"),
        ("loopformer", "loops: 4, objective: early_exit", "", "budgets: [2], trajectory: uniform", "is evaluated by"),
        ("loopformer", "loops: 4, objective: fixed", "shortcut_lambda: 0.1", "", "train.shortcut_lambda: weights"),
        ("loopformer", "loops: 4, objective: early_exit", "consistency_lambda: 0.1", "", "train.consistency_lambda"),
        ("looped", "loops: 4", "", "budgets: [0, 2]", "eval.budgets: loop counts must be distinct"),
        ("loopformer", "loops: 1", "", "", "model.params: objective shortcut_consistency trains a shorter run"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(family, model, train, eval, message):
    with pytest.raises(SpecError) as err:
        study(family=family, model=model, train=train, eval=eval)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_analysis_reads_budget_columns_as_test_time_depth():
    import pandas as pd

    from studyrunner.analysis.data import loops_columns

    columns = ["eval_loss_loops_2", "eval_loss_budget_4", "eval_loss_budget_4_spread", "eval_loss_budget_4_steps_2_1_1"]
    found = loops_columns(pd.DataFrame(columns=columns), "eval_loss")
    assert found == {2: "eval_loss_loops_2", 4: "eval_loss_budget_4"}


def test_representation_diagnostics_can_be_turned_off_without_changing_the_cell_hash():
    from conftest import TINY_STUDY

    from studyrunner.study import compile_study, loads

    def with_eval(extra: str):
        base = "eval: {every: 6, examples: 32"
        return compile_study(loads(TINY_STUDY.replace(base + "}", base + extra + "}")))

    plain, off, on = with_eval(""), with_eval(", representations: false"), with_eval(", representations: true")
    assert [c.cell_hash for c in plain.cells] != [c.cell_hash for c in off.cells]  # set: part of the config
    assert "representations" not in plain.cells[0].config["eval"]  # unset: out of the config and hash
    names = lambda compiled: {k for r in _rows(compiled) for k in r}  # noqa: E731
    assert any(k.startswith("repr_") for k in names(on)) and not any(k.startswith("repr_") for k in names(off))


def _rows(compiled):
    from studyrunner.train import MemoryReporter, run_trial

    reporter = MemoryReporter()
    trial = compiled.trials[0]
    run_trial(trial.config, trial.seed, reporter)
    return reporter.rows


def test_late_step_cka_is_the_mean_over_the_second_half_of_the_steps():
    import torch

    from studyrunner.models.representations import representation_diagnostics

    torch.manual_seed(0)
    states = [torch.randn(40, 8, dtype=torch.float64) for _ in range(9)]  # steps 0..8
    out = representation_diagnostics(states)
    late = [out[f"repr_cka_{t - 1}_{t}"] for t in range(5, 9)]
    assert out["repr_cka_adjacent_late_mean"] == pytest.approx(sum(late) / 4)
    assert representation_diagnostics(states[:2])["repr_cka_adjacent_late_mean"] == out["repr_cka_0_1"]
