"""FLOPs counted per trial (train/flops.py): the counter sees attention and every mechanism that runs,
halting models are counted at the depth they realise, counting changes no training, and `plan` shows the
analytic figure. Tiny models on the CPU; no Ray."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from studyrunner.cli import app
from studyrunner.models import build_model
from studyrunner.models.trajectories import schedule
from studyrunner.study import compile_study, loads
from studyrunner.tasks import TaskFacts
from studyrunner.train import MemoryReporter, run_trial
from studyrunner.train import flops as flops_module
from studyrunner.train.flops import (
    FLOP_METRICS,
    analytic_flops_per_token,
    count_forward_backward,
    count_step,
    format_flops,
    mean_loops,
    realised_loops,
)
from studyrunner.train.metrics import TRAINER_METRICS
from studyrunner.train.vectorized import run_trials_together

FACTS = TaskFacts(vocab_size=12, seq_len=16, causal=True)
CORE = {"d_model": 32, "n_heads": 2}
B, T = 4, 16


def model(family: str, **params) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(family, {**CORE, **params}, FACTS)


def per_token(family: str, **params) -> float:
    return count_step(model(family, **params), B, T, "cpu").per_token()["flops_per_token"]


def tokens() -> torch.Tensor:
    return torch.randint(0, FACTS.vocab_size, (B, T), generator=torch.Generator().manual_seed(1))


# ------------------------------------------------------------------------------------------ the counter


@pytest.mark.parametrize("causal", [True, False])
def test_attention_is_counted_on_the_cpu_flash_kernel(causal):
    """The CPU kernel of scaled_dot_product_attention (which torch's counter does not know) counts QK^T and
    AV in the forward and twice that in the backward, the same as the math path on the meta device."""
    heads, d = 2, 8

    class Attend(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    attend = Attend()
    shape = (B, heads, T, d)
    expected_forward = 2 * (2 * B * heads * T * T * d)  # two products of (T x d) (d x T) per head
    for device in ("cpu", "meta"):
        q, k, v = (torch.randn(shape, device=device, requires_grad=True) for _ in range(3))
        counter = flops_module._Counter(attend)
        with counter.counting() as mode:
            y = attend(q, k, v)
        assert mode.get_total_flops() == expected_forward, device
        with counter.counting() as mode:
            y.sum().backward()
        assert mode.get_total_flops() == 2 * expected_forward, device


def test_torch_alone_misses_the_cpu_attention_kernel():
    """Why ATTENTION exists: without it the CPU flash kernel counts nothing."""
    from torch.utils.flop_counter import FlopCounterMode

    q = k = v = torch.randn(B, 2, T, 8)
    with FlopCounterMode(display=False) as mode:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert mode.get_total_flops() == 0


def test_a_block_counts_its_matmuls_and_attention_and_backward_is_twice_forward():
    m = model("looped", loops=1)
    d, vocab, hidden = CORE["d_model"], FACTS.vocab_size, 4 * CORE["d_model"]
    per_token_forward = 2 * (3 * d * d + d * d + 2 * d * hidden) + 2 * 2 * T * d + 2 * d * vocab
    count = count_step(m, B, T, "cpu")
    assert count.forward == per_token_forward * B * T
    assert count.backward == 2 * count.forward
    assert count.per_token() == {"flops_per_token": 3 * per_token_forward, "flops_per_token_forward": per_token_forward}


FAMILIES = [
    ("looped", {"loops": 3, "memory_slots": 2}),
    ("ut_act", {"loops": 3, "memory_slots": 2, "norm": "layernorm"}),
    ("adaptive_layers", {"n_layers": 2, "loops": 2, "memory_slots": 4, "memory_global_slots": 2}),
    ("loopformer", {"loops": 3, "fourier_features": 16}),
    ("looplm", {"loops": 2}),
    ("melt", {"loops": 2, "chunk_size": 4}),
]


@pytest.mark.parametrize(("family", "params"), FAMILIES, ids=[f for f, _ in FAMILIES])
def test_the_meta_device_counts_what_the_cpu_counts(family, params):
    """`plan` counts on the meta device (no weights): the same figure as the real model on the CPU, where
    attention runs the fused kernel rather than the math path."""
    real = count_step(model(family, **params), B, T, "cpu", realised=False)
    with torch.device("meta"):
        meta_model = build_model(family, {**CORE, **params}, FACTS)
    assert meta_model.embed.tokens.weight.is_meta
    meta = count_step(meta_model, B, T, "meta", realised=False)
    assert (meta.forward, meta.backward) == (real.forward, real.backward) and real.forward > 0
    assert analytic_flops_per_token(meta_model, B, T) == real.per_token()["flops_per_token"]


# ------------------------------------------------------------------------------------------ mechanisms


def test_loops_scale_the_looped_blocks_flops():
    one, four = count_step(model("looped", loops=1), B, T, "cpu"), count_step(model("looped", loops=4), B, T, "cpu")
    head = 2 * CORE["d_model"] * FACTS.vocab_size * B * T  # the embedding costs no FLOPs, the head runs once
    assert four.forward - head == 4 * (one.forward - head)
    assert four.backward == 2 * four.forward
    assert 3.9 < four.per_token()["flops_per_token"] / one.per_token()["flops_per_token"] < 4.0
    deep = count_step(model("looped", block_layers=4, loops=1), B, T, "cpu")
    assert (deep.forward, deep.backward) == (four.forward, four.backward)  # 4x1 and 1x4: the same compute


def test_memory_tokens_and_memory_banks_add_flops():
    assert per_token("looped", loops=2, memory_slots=4) > per_token("looped", loops=2)
    plain = per_token("adaptive_layers", n_layers=2, loops=2)
    local = per_token("adaptive_layers", n_layers=2, loops=2, memory_slots=8)
    both = per_token("adaptive_layers", n_layers=2, loops=2, memory_slots=8, memory_global_slots=8)
    assert plain < local < both
    # a bank read is a projection of d x d and an attention over the slots per layer: more slots, more FLOPs
    assert per_token("adaptive_layers", n_layers=2, loops=2, memory_slots=64) > local


def test_loopformer_modulators_add_flops_to_the_same_blocks():
    looped = per_token("looped", loops=4)
    base_loop = per_token("loopformer", loops=4, conditioning="none", objective="fixed", norm="layernorm")
    tmlt = per_token("loopformer", loops=4, conditioning="loop_index", objective="fixed", fourier_features=16)
    loopformer = per_token("loopformer", loops=4, conditioning="time_step", objective="fixed", fourier_features=16)
    assert base_loop == looped  # Base-Loop is the looped model of the same blocks
    assert looped < tmlt < loopformer  # AdaLN modulators, then a second (Δ) embedder


def test_a_loopformer_short_run_is_counted_at_its_expected_length():
    """shortcut_consistency runs a separate trajectory of S ~ U{1..L-1} steps: the count is the expectation,
    the mean over every S (what `compute_draws`' two ends give, the FLOPs being linear in S)."""
    m = model("loopformer", loops=5, fourier_features=16)
    x = torch.zeros(B, T, dtype=torch.long)
    expected = count_forward_backward(m, x)
    pinned = []
    for s in range(1, 5):
        with m.drawn(schedule("uniform", s)):  # a short run of s steps (its sizes cost nothing)
            m.compute_draws = lambda: []  # noqa: B023 - count this pin alone
            pinned.append(count_forward_backward(m, x))
            del m.compute_draws
    assert expected == tuple(round(sum(c[i] for c in pinned) / len(pinned)) for i in range(2))
    assert pinned[0] < pinned[-1]  # a longer short run costs more
    fixed = count_forward_backward(model("loopformer", loops=5, fourier_features=16, objective="fixed"), x)
    assert fixed < expected
    # an early exit reuses the full run: its draw costs nothing extra, whatever S
    exit_model = model("loopformer", loops=5, fourier_features=16, objective="early_exit")
    assert exit_model.compute_draws() == []


def test_melt_chunks_and_gates_are_counted():
    parallel = per_token("melt", loops=2, chunk_size=16)
    serial = per_token("melt", loops=2, chunk_size=1)
    assert parallel > per_token("looplm", loops=2)  # the gates' projections
    assert serial < parallel  # token by token, each attends to fewer keys: dense attention over a chunk
    assert per_token("melt", loops=2, chunk_size=4, gate="last") < per_token("melt", loops=2, chunk_size=4)


def test_a_distilling_students_teacher_is_not_counted():
    teacher = model("looplm", loops=2)
    student = model("melt", loops=2, chunk_size=16)
    alone = count_step(student, B, T, "cpu")
    student.convert_from(teacher)
    with_teacher = count_step(student, B, T, "cpu")
    # the student's own part of the distillation is counted: its head on every loop's state (the last loop's
    # being a second application); the teacher's forward (a whole LoopLM) is not
    heads = 2 * (2 * CORE["d_model"] * FACTS.vocab_size * B * T)
    assert with_teacher.forward == alone.forward + heads
    assert with_teacher.backward == alone.backward + 2 * heads
    teacher_forward = count_step(teacher, B, T, "cpu").forward
    assert with_teacher.forward < alone.forward + teacher_forward / 2


# ------------------------------------------------------------------------------------------ halting


def test_a_model_that_halts_earlier_counts_fewer_flops():
    deep = model("ut_act", loops=4, memory_slots=2, norm="layernorm", halt_bias_init=-3.0)  # runs every step
    shallow = model("ut_act", loops=4, memory_slots=2, norm="layernorm", halt_bias_init=5.0)  # halts at step 1
    x = tokens()
    assert realised_loops(deep, x) == 4.0
    assert realised_loops(shallow, x) == 1.0
    count = count_step(deep, B, T, "cpu")
    assert count.halting and count.loops == 4 and count.loop_forward > 0
    # the executed count is the same (the block runs on halted tokens); the realised one is not
    assert count_step(shallow, B, T, "cpu").forward == count.forward
    at_four, at_one = count.per_token(4.0), count.per_token(1.0)
    assert at_four["flops_per_token"] == count.per_token()["flops_per_token"]
    assert at_one["flops_per_token"] < at_four["flops_per_token"]
    # one realised step is the count of a 1-step run of the same model
    one_step = count_forward_backward(deep, torch.zeros(B, T, dtype=torch.long), loops=1)
    assert count.at(1.0) == (float(one_step[0]), float(one_step[1]))
    assert not hasattr(model("looped", loops=3), "realised_loops")
    no_act = model("ut_act", loops=3, act=False, norm="layernorm")
    assert realised_loops(no_act, x) is None and not count_step(no_act, B, T, "cpu").halting


def test_the_realised_depth_is_averaged_over_training():
    assert mean_loops([]) is None
    assert mean_loops([[0, 3.0]]) == 3.0
    assert mean_loops([[0, 4.0], [10, 2.0]]) == 3.0
    assert mean_loops([[0, 4.0], [2, 4.0], [10, 2.0]]) == pytest.approx((2 * 4 + 8 * 3) / 10)


# ------------------------------------------------------------------------------------------ trials

STUDY = """\
name: flops
task: {{name: phop, params: {{alphabet: 4, seq_len: 12, hops: 1}}}}
model: {{family: {family}, params: {{d_model: 16, n_heads: 2, {model}}}}}
train: {{steps: {steps}, batch_size: 8, warmup_steps: 2, log_every: 2, {train}}}
eval: {{every: {every}, examples: 16}}
seeds: [0, 1]
"""


def config(family="looped", model="loops: 2", train="", steps=4, every=2):
    text = STUDY.format(family=family, model=model, train=train, steps=steps, every=every)
    return compile_study(loads(text)).cells[0].config


def without_counting(monkeypatch):
    monkeypatch.setattr("studyrunner.train.trainer.count_trial", lambda trial: None)


def test_run_trial_records_the_three_metrics():
    cfg = config(steps=4)
    reporter = MemoryReporter()
    final = run_trial(cfg, seed=0, reporter=reporter)
    assert set(FLOP_METRICS) <= set(final) and set(FLOP_METRICS) <= TRAINER_METRICS
    m = build_model("looped", cfg["model"]["params"], TaskFacts(vocab_size=4, seq_len=12, causal=True))
    expected = count_step(m, 8, 12, "cpu").per_token()
    assert final["flops_per_token"] == expected["flops_per_token"]
    assert final["flops_per_token_forward"] == expected["flops_per_token_forward"]
    assert final["train_flops"] == final["flops_per_token"] * 4 * 8 * 12  # 4 steps of 8 x 12 tokens
    assert final["flops_per_token"] == pytest.approx(3 * final["flops_per_token_forward"], rel=1e-9)
    assert not any(name in row for row in reporter.rows for name in FLOP_METRICS)  # final metrics, not records


@pytest.mark.parametrize(
    ("family", "model", "train"),
    [
        ("looped", "loops: 2, dropout: 0.1", ""),
        ("ut_act", "loops: 3, memory_slots: 2, norm: layernorm, dropout: 0.1", "ponder_lambda: 0.01"),
        ("loopformer", "loops: 3, fourier_features: 16", ""),
    ],
    ids=["looped", "ut_act", "loopformer"],
)
def test_counting_does_not_change_training(monkeypatch, family, model, train):
    """The same final metrics and records, bit for bit, with and without counting: dropout, ACT and a
    LoopFormer's random short run draw from the same streams either way."""
    timing = {"tokens_per_sec", "step_time_ms", "train_time_s"}
    cfg = config(family, model, train, steps=4)
    counted_reporter, plain_reporter = MemoryReporter(), MemoryReporter()
    counted = run_trial(cfg, seed=0, reporter=counted_reporter)
    with monkeypatch.context() as patch:
        without_counting(patch)
        plain = run_trial(cfg, seed=0, reporter=plain_reporter)
    assert set(FLOP_METRICS) <= set(counted) and not set(FLOP_METRICS) & set(plain)
    strip = lambda m: {k: v for k, v in m.items() if k not in timing and k not in FLOP_METRICS}  # noqa: E731
    assert strip(counted) == strip(plain)
    rows = lambda r: [strip(row) for row in r.rows]  # noqa: E731
    assert rows(counted_reporter) == rows(plain_reporter)


def test_counting_leaves_no_gradient_and_no_random_draw():
    m = model("loopformer", loops=3, fourier_features=16, dropout=0.1)
    m(tokens()).logits.sum().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    state = torch.random.get_rng_state()
    count_step(m, B, T, "cpu")
    assert torch.equal(torch.random.get_rng_state(), state)
    assert {n for n, p in m.named_parameters() if p.grad is not None} == set(grads)
    assert all(torch.equal(p.grad, grads[n]) for n, p in m.named_parameters() if n in grads)


def test_a_halting_trial_counts_its_realised_depth():
    deep = run_trial(config("ut_act", "loops: 3, memory_slots: 2, norm: layernorm, halt_bias_init: -3.0"), 0)
    shallow = run_trial(config("ut_act", "loops: 3, memory_slots: 2, norm: layernorm, halt_bias_init: 5.0"), 0)
    assert shallow["flops_per_token"] < deep["flops_per_token"]
    assert shallow["train_flops"] < deep["train_flops"]
    # the realised depth is the sampled one: every step for the deep start, one for the shallow
    cfg = config("ut_act", "loops: 3, memory_slots: 2, norm: layernorm, halt_bias_init: 5.0")
    m = build_model("ut_act", cfg["model"]["params"], TaskFacts(vocab_size=4, seq_len=12, causal=True))
    count = count_step(m, 8, 12, "cpu")
    assert shallow["flops_per_token"] == count.per_token(1.0)["flops_per_token"]
    assert deep["flops_per_token"] == count.per_token(3.0)["flops_per_token"]


class Interrupted(Exception):
    pass


class CrashAt(MemoryReporter):
    def __init__(self, at):
        super().__init__()
        self.at = at

    def log(self, step, metrics):
        if step == self.at:
            raise Interrupted(step)
        super().log(step, metrics)


def test_a_resumed_halting_trial_records_the_same_flops(tmp_path):
    """The realised-depth samples travel in the checkpoint: a resumed trial's FLOPs are the whole run's."""
    cfg = config("ut_act", "loops: 3, memory_slots: 2, norm: layernorm, halt_bias_init: 1.0", steps=6)
    cfg["train"]["checkpoint_every"] = 2
    whole = run_trial(cfg, 0)
    with pytest.raises(Interrupted):
        run_trial(cfg, 0, CrashAt(4), checkpoints=tmp_path)
    resumed = run_trial(cfg, 0, checkpoints=tmp_path)
    for name in FLOP_METRICS:
        assert resumed[name] == whole[name], name


@pytest.mark.parametrize(
    ("family", "params"), [("looped", "loops: 2"), ("ut_act", "loops: 3, memory_slots: 2, halt_bias_init: 1.0")]
)
def test_packed_trials_record_each_members_own_flops(family, params):
    # a halting member's realised depth is sampled on its own model, as alone
    cfg = config(family, params, steps=4)
    cfg["train"]["pack"] = "seeds"
    together = run_trials_together(cfg, [0, 1], [MemoryReporter(), MemoryReporter()])
    for seed, final in enumerate(together):
        alone = run_trial(cfg, seed)
        for name in FLOP_METRICS:
            assert final[name] == pytest.approx(alone[name], rel=1e-6), name


def test_a_failed_count_leaves_the_trial_training(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("no counter here")

    monkeypatch.setattr(flops_module, "count_step", broken)
    final = run_trial(config(steps=3), 0)
    assert not set(FLOP_METRICS) & set(final) and math.isfinite(final["train_loss"])
    assert "FLOPs not counted" in caplog.text


# ------------------------------------------------------------------------------------------ plan


PLAN_STUDY = """\
name: tiny_flops
task: {name: phop, params: {alphabet: 4, seq_len: 12, hops: 1}}
model: {family: looped, params: {d_model: 16, n_heads: 2, block_layers: 1, loops: 1}}
train: {steps: 4, batch_size: 8}
eval: {every: 2, examples: 16}
grid:
  model.params.loops: [1, 4]
seeds: [0]
"""


def test_plan_shows_flops_per_token(write_study):
    result = CliRunner().invoke(app, ["plan", str(write_study(PLAN_STUDY))], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "FLOPs/token" in result.output
    facts = TaskFacts(vocab_size=4, seq_len=12, causal=True)
    for loops in (1, 4):
        m = build_model("looped", {"d_model": 16, "n_heads": 2, "loops": loops}, facts)
        assert format_flops(count_step(m, 8, 12, "cpu").per_token()["flops_per_token"]) in result.output
    assert "* a halting cell" not in result.output


def test_plan_marks_halting_cells_counted_at_their_most_steps(write_study):
    text = PLAN_STUDY.replace("family: looped", "family: ut_act").replace("block_layers: 1, ", "norm: layernorm, ")
    result = CliRunner().invoke(app, ["plan", str(write_study(text))], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "* a halting cell, at its most loop steps" in result.output
    assert len(re.findall(r"\d[kMG]?\*", result.output)) == 1  # loops 4; one step (loops 1) has none unused
    no_act = text.replace("norm: layernorm, ", "norm: layernorm, act: false, ")
    result = CliRunner().invoke(app, ["plan", str(write_study(no_act, "no_act.yaml"))], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "* a halting cell" not in result.output


def test_format_flops():
    assert [format_flops(x) for x in (0, 12, 999.7, 321_024, 1_279_488, 2.5e9, 999_700)] == [
        "0", "12", "1k", "321k", "1.28M", "2.5G", "1M"
    ]  # fmt: skip
