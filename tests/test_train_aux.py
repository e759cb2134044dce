"""The trainer's side of the families' mechanisms: weighted aux terms and their schedules, family-blind diagnostics,
test-time depth, halt_collapsed, and the validate-time check of train/eval knobs."""

import pytest

from studyrunner.errors import SpecError
from studyrunner.models.output import AUX_TERMS
from studyrunner.study import compile_study, loads
from studyrunner.train import MemoryReporter, run_trial
from studyrunner.train.config import TrainConfig
from studyrunner.train.schedules import aux_weights, linear_warmup

STUDY = """\
name: aux
task: {{name: phop, params: {{alphabet: 4, seq_len: 12, hops: 1}}}}
model: {{family: {family}, params: {{d_model: 16, n_heads: 2, {model}}}}}
train: {{steps: {steps}, batch_size: 16, warmup_steps: 2, log_every: {log_every}, {train}}}
eval: {{every: 6, examples: 32, {eval}}}
seeds: [0]
"""


def study(family="ut_act", model="loops: 3, memory_slots: 2", train="", eval="", steps=12, log_every=4):
    text = STUDY.format(family=family, model=model, train=train, eval=eval, steps=steps, log_every=log_every)
    return compile_study(loads(text))


def config(**kw):
    return study(**kw).cells[0].config


def test_linear_warmup_rises_from_zero():
    assert [linear_warmup(s, 4) for s in (0, 1, 2, 4, 9)] == [0.0, 0.25, 0.5, 1.0, 1.0]
    assert linear_warmup(0, 0) == 1.0  # 0 = constant from the first step


def test_every_aux_term_has_a_schedule_and_unknown_terms_fail_loudly():
    train = TrainConfig(steps=20, ponder_lambda=0.1, ponder_lambda_warmup_steps=10, regulariser_lambda=2.0)
    unset = TrainConfig(steps=20)
    assert aux_weights(5, train, ["ponder", "regulariser"]) == {"ponder": 0.05, "regulariser": 2.0}
    assert aux_weights(5, unset, ["ponder", "regulariser"]) == {"ponder": 0.0, "regulariser": 0.0}  # unset = 0
    assert aux_weights(5, unset, ["shortcut", "consistency"]) == {"shortcut": 0.1, "consistency": 0.1}  # LoopFormer's
    assert aux_weights(5, unset, ["exit_kl_uniform", "distill", "attn_align"]) == dict.fromkeys(
        ["exit_kl_uniform", "distill", "attn_align"], 0.0
    )
    assert set(aux_weights(0, unset, AUX_TERMS)) == set(AUX_TERMS)
    with pytest.raises(KeyError, match="telepathy"):
        aux_weights(0, train, ["telepathy"])


def test_ponder_weight_warms_up_and_router_diagnostics_are_logged():
    reporter = MemoryReporter()
    cfg = config(train="ponder_lambda: 0.01, ponder_lambda_warmup_steps: 8", eval="loops: [1, 5]")
    final = run_trial(cfg, seed=0, reporter=reporter)
    weights = reporter.series("ponder_weight")
    # the weight of the last step of each 4-step window (0-based steps 3, 7, 11)
    assert weights == [(4, pytest.approx(0.01 * 3 / 8)), (8, pytest.approx(0.01 * 7 / 8)), (12, 0.01)]
    ponder = [v for _, v in reporter.series("train_ponder")]
    assert len(ponder) == 3 and all(2 < v <= 4 for v in ponder)  # N + R with N <= 3 steps
    assert all(v > 0 for _, v in reporter.series("router_grad_norm"))
    for name in ("ponder_steps_mean", "halt_prob_step_1", "halt_weight_step_3", "attn_seq_to_mem"):
        assert [s for s, _ in reporter.series(name)] == [6, 12], name
    for n in (1, 5):  # test-time depth, once at the end
        assert 0 <= final[f"eval_accuracy_loops_{n}"] <= 1 and f"eval_exact_match_loops_{n}" in final
        assert [s for s, _ in reporter.series(f"eval_accuracy_loops_{n}")] == [12]
    assert final["halt_collapsed"] == 0.0  # deep start, 12 steps: still running every step
    model_names = {k for row in reporter.rows for k in row} - {"step"}
    from studyrunner.models import build_model
    from studyrunner.tasks import build_task

    facts = build_task(cfg["task"]["name"], cfg["task"]["params"], 0).facts
    declared = build_model(cfg["model"]["family"], cfg["model"]["params"], facts).diagnostic_names
    trainer = {"train_loss", "lr", "step_time_ms", "tokens_per_sec", "params", "effective_depth", "weights_bytes"}
    undeclared = {n for n in model_names - declared - trainer if not n.startswith("eval_")}
    assert not undeclared  # every model-specific name the trainer logged was declared by the model


def test_the_trainer_adds_the_weighted_term_to_the_loss():
    base = config(model="loops: 3, memory_slots: 0", steps=3, log_every=1)
    weighted = config(model="loops: 3, memory_slots: 0", train="ponder_lambda: 0.5", steps=3, log_every=1)
    a, b = MemoryReporter(), MemoryReporter()
    run_trial(base, seed=0, reporter=a)
    run_trial(weighted, seed=0, reporter=b)
    # first record: the same forward pass before any update, so the losses differ by 0.5 * ponder
    (_, loss_a), (_, loss_b) = a.series("train_loss")[0], b.series("train_loss")[0]
    ponder = b.series("train_ponder")[0][1]
    assert loss_b - loss_a == pytest.approx(0.5 * ponder, rel=1e-5)
    assert a.series("ponder_weight")[0][1] == 0.0


def test_halt_collapsed_uses_the_configured_fraction():
    shallow = "loops: 6, memory_slots: 0, halt_bias_init: 0.0"  # halts after ~2 of 6 steps
    trapped = run_trial(config(model=shallow, steps=6, log_every=3), seed=0)
    assert trapped["ponder_steps_fraction"] < 0.5 and trapped["halt_collapsed"] == 1.0
    lenient = run_trial(config(model=shallow, steps=6, log_every=3, eval="halt_collapse_fraction: 0.1"), seed=0)
    assert lenient["halt_collapsed"] == 0.0
    no_halting = run_trial(config(model="loops: 2, memory_slots: 0, act: false", steps=6, log_every=3), seed=0)
    assert "halt_collapsed" not in no_halting and "ponder_steps_mean" not in no_halting


def test_a_large_regulariser_weight_pulls_the_blocks_together():
    model = "block_layers: 2, loops: 1, regulariser_k: 1"
    pulled = run_trial(
        config(family="looped", model=model, train="lr: 1.0e-2, regulariser_lambda: 100.0", steps=60, log_every=20),
        seed=0,
    )
    free = run_trial(config(family="looped", model=model, train="lr: 1.0e-2", steps=60, log_every=20), seed=0)
    assert pulled["block_cos_mean"] > 0.98
    assert free["block_cos_mean"] < 0.5  # the term is logged at weight 0 but does not act
    assert free["regulariser_weight"] == 0.0 and free["train_regulariser"] > 0.5


@pytest.mark.parametrize(
    "family,model,train,eval,field",
    [
        ("looped", "loops: 2", "ponder_lambda: 0.001", "", "train.ponder_lambda"),
        ("looped", "loops: 2", "ponder_lambda_warmup_steps: 5", "", "train.ponder_lambda_warmup_steps"),
        ("looped", "block_layers: 2", "regulariser_lambda: 1.0", "", "train.regulariser_lambda"),
        ("ut_act", "act: false", "ponder_lambda: 0.001", "", "train.ponder_lambda"),
        ("adaptive_layers", "n_layers: 1, loops: 1", "ponder_lambda: 0.1", "", "train.ponder_lambda"),
        ("looped", "loops: 2", "", "halt_collapse_fraction: 0.3", "eval.halt_collapse_fraction"),
    ],
)
def test_a_knob_for_something_the_family_lacks_is_rejected_naming_the_field(family, model, train, eval, field):
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        study(family=family, model=model, train=train, eval=eval)


def test_the_same_knobs_are_accepted_where_the_family_has_them():
    assert study(family="looped", model="block_layers: 2, regulariser_k: 1", train="regulariser_lambda: 10.0")
    assert study(family="ut_act", train="ponder_lambda: 0.001, ponder_lambda_warmup_steps: 5")
    assert study(family="adaptive_layers", model="n_layers: 1, loops: 3", train="ponder_lambda: 0.1")
    assert study(family="looped", model="loops: 2", eval="loops: [1, 2, 8]")


def test_message_says_how_to_get_the_term():
    with pytest.raises(SpecError, match="model.params.act: true"):
        study(family="ut_act", model="act: false", train="ponder_lambda: 0.001")


QUICKSTART = """\
name: quickstart
description: looped vs unlooped on p-hop (n=32, p=2)
task:  {name: phop, params: {alphabet: 4, seq_len: 32, hops: 2}}
model: {family: looped, params: {d_model: 64, n_heads: 4, block_layers: 1, loops: 1}}
train: {steps: 2000, batch_size: 64, lr: 2.0e-3, warmup_steps: 100, weight_decay: 0.1, grad_clip: 1.0}
eval:  {every: 500, examples: 2048}
zip:
  - {model.params.block_layers: [1, 1, 4], model.params.loops: [1, 4, 1]}
seeds: [0, 1]
resources: {cpu: 1, gpu: 0}
metric: {name: eval_accuracy, mode: max}
"""


def test_cells_that_use_no_new_knob_keep_their_hashes():
    # The quickstart's recorded hashes: train/eval/model knobs are left out of a cell's hash while unset.
    hashes = [c.cell_hash for c in compile_study(loads(QUICKSTART)).cells]
    assert hashes == ["b0798ba908c7", "ef712b8ca8ea", "d7173e55d97a"]
