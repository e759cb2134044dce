"""Packed trials (`train.pack`, train/vectorized.py): each member's records, checkpoints and final metrics
equal its separate `run_trial` run up to float rounding, for every family, for members that differ in their
learning rate, warmup or init bias, and across a kill and resume; what cannot be packed is refused.

Tolerance. The batched step sums in another order than a separate run's kernels (batched matmuls, and
attention written out as matmuls under vmap instead of the fused kernel), so values agree to float
rounding (~1e-7 relative after 30 steps here), not bit for bit: losses and every other value are held
to rtol 1e-4. Eval accuracy and exact match are fractions of examples; a near-tie between two logits
could flip one example, so they are held to one example (they came out equal here)."""

import copy
import json
import math

import pytest
import torch
import yaml
from conftest import TINY_STUDY

from studyrunner.errors import SpecError
from studyrunner.models.looped import LoopedTransformer
from studyrunner.study import compile_study, loads
from studyrunner.train import Diverged, MemoryReporter, run_trial
from studyrunner.train.packing import shape_key
from studyrunner.train.vectorized import run_trials_together

TIMING = {"tokens_per_sec", "step_time_ms", "train_time_s"}
COUNTS = ("eval_accuracy", "eval_exact_match")  # fractions of examples (see the module docstring)


def tiny_config(**train):
    config = compile_study(loads(TINY_STUDY)).cells[1].config  # looped 1x2
    config["train"].update({"steps": 30, "log_every": 5, **train})
    config["eval"].update(every=10)
    return config


def compile_config(config):
    """`config` as the compiler resolves it (a family's defaults filled in)."""
    study = {**yaml.safe_load(TINY_STUDY), **{k: config[k] for k in ("task", "model", "train", "eval")}}
    study.pop("grid")
    text = yaml.safe_dump(study)
    return compile_study(loads(text)).cells[0].config


def separately(config, seeds):
    runs = []
    for seed in seeds:
        reporter = MemoryReporter()
        runs.append((reporter, run_trial(config, seed, reporter)))
    return runs


def together(config, seeds, **kw):
    reporters = [MemoryReporter() for _ in seeds]
    return reporters, run_trials_together(config, seeds, reporters, **kw)


def assert_close(name, a, b, examples):
    if name.startswith(COUNTS):
        assert a == pytest.approx(b, abs=1.01 / examples), name
    else:
        assert a == pytest.approx(b, rel=1e-4, abs=1e-7), name


def assert_same_trial(separate, final, reporter, final_together, examples):
    assert set(final_together) == set(final)
    for name, value in final.items():
        if name not in TIMING:
            assert_close(name, value, final_together[name], examples)
    assert [r["step"] for r in reporter.rows] == [r["step"] for r in separate.rows]
    for row, row_together in zip(separate.rows, reporter.rows, strict=True):
        assert set(row) == set(row_together), row["step"]
        for name, value in row.items():
            if name not in TIMING:
                assert_close(name, value, row_together[name], examples)
    assert reporter.starts == [0]
    assert set(reporter.run_facts) == set(separate.run_facts) | {"seeds_together", "pack_graph"}


def test_each_seed_matches_its_separate_run():
    config, seeds = tiny_config(), [0, 1, 2]
    reporters, finals = together(config, seeds)
    for (separate, final), reporter, final_together in zip(separately(config, seeds), reporters, finals, strict=True):
        assert_same_trial(separate, final, reporter, final_together, config["eval"]["examples"])
        assert reporter.run_facts["seeds_together"] == "3"
        # the shared step's throughput: every seed reports the same figures
        assert reporter.series("step_time_ms") == reporters[0].series("step_time_ms")
    assert finals[0]["train_loss"] != finals[1]["train_loss"]  # the seeds really are different trials


# Every family packed, with its mechanisms on: halting (ACT, PonderNet-style loops with a memory bank), LoopLM's
# weighted exits, MELT's shared KV cache and interpolation, LoopFormer's drawn short runs (each member draws
# from its own generator: the members run in groups of equal draws).
FAMILIES = {
    "looped": ("looped", {"block_layers": 2, "loops": 2, "memory_slots": 2}),
    "ut_act": ("ut_act", {"loops": 3, "memory_slots": 2}),
    "adaptive_layers": ("adaptive_layers", {"n_layers": 2, "loops": 3, "memory_slots": 2, "memory_global_slots": 1}),
    "looplm": ("looplm", {"block_layers": 1, "loops": 3}),
    "melt": ("melt", {"block_layers": 1, "loops": 2, "interpolate_steps": 4}),
    "loopformer_shortcut": (
        "loopformer",
        {"loops": 4, "conditioning": "time_step", "objective": "shortcut_consistency"},
    ),
    "loopformer_early_exit": ("loopformer", {"loops": 4, "conditioning": "none", "objective": "early_exit"}),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_packed_matches_its_separate_runs(name):
    family, params = FAMILIES[name]
    config = tiny_config(steps=10, log_every=5)
    config["model"] = {"family": family, "params": {"d_model": 16, "n_heads": 2, **params}}
    config["eval"].update(every=5)
    config = compile_config(config)
    reporters, finals = together(config, [0, 1, 2])
    runs = separately(config, [0, 1, 2])
    for (separate, final), reporter, final_together in zip(runs, reporters, finals, strict=True):
        assert_same_trial(separate, final, reporter, final_together, config["eval"]["examples"])
    assert finals[0]["train_loss"] != finals[1]["train_loss"]


def test_members_of_different_cells_match_their_separate_runs():
    # one shape, three cells: learning rate, warmup, weight decay, clip and a halting bias init differ
    base = tiny_config(steps=10, log_every=5)
    base["model"] = {"family": "ut_act", "params": {"d_model": 16, "n_heads": 2, "loops": 3}}
    base["eval"].update(every=5)
    changes = [
        {},
        {"train": {"lr": 3e-3, "warmup_steps": 4, "weight_decay": 0.0, "grad_clip": 0.5}},
        {"train": {"lr": 5e-4, "ponder_lambda": 0.05}, "params": {"halt_bias_init": 2.0}},
    ]
    configs = []
    for change in changes:
        config = copy.deepcopy(base)
        config["train"].update(change.get("train", {}))
        config["model"]["params"].update(change.get("params", {}))
        configs.append(compile_config(config))
    assert len({shape_key(c) for c in configs}) == 1 and len({json.dumps(c, sort_keys=True) for c in configs}) == 3
    seeds = [0, 0, 1]
    reporters = [MemoryReporter() for _ in seeds]
    finals = run_trials_together(configs, seeds, reporters)
    for config, seed, reporter, final_together in zip(configs, seeds, reporters, finals, strict=True):
        ((separate, final),) = separately(config, [seed])
        assert_same_trial(separate, final, reporter, final_together, config["eval"]["examples"])
    assert finals[0]["train_loss"] != finals[1]["train_loss"]  # same seed, another cell: another trial


def test_a_pack_killed_midway_resumes_to_its_separate_runs(tmp_path):
    # A kill after the step-4 checkpoints: the pack resumes from them; one member's checkpoint is rolled back
    # a step (a kill between two members' saves), so the pack holds the other until it catches up. A member
    # also resumes alone from its packed checkpoint.
    class Killed(Exception):
        pass

    class KillAfter(MemoryReporter):
        def tick(self, step):
            if step == 6:
                raise Killed

    config = tiny_config(steps=10, log_every=2, checkpoint_every=2)
    config["model"] = {
        "family": "loopformer",
        "params": {
            "d_model": 16,
            "n_heads": 2,
            "loops": 4,
            "conditioning": "time_step",
            "objective": "shortcut_consistency",
        },
    }
    config["eval"].update(every=5)
    config = compile_config(config)
    seeds = [0, 1, 2]
    where = [tmp_path / f"m{s}" for s in seeds]
    with pytest.raises(Killed):
        run_trials_together(config, seeds, [MemoryReporter(), MemoryReporter(), KillAfter()], checkpoints=where)
    assert all(any(w.iterdir()) for w in where), "the pack wrote each member's checkpoints where its own run would"
    _drop_newest_checkpoint(where[1])
    reporters = [MemoryReporter() for _ in seeds]
    finals = run_trials_together(config, seeds, reporters, checkpoints=where)
    for (_, final), reporter, final_together in zip(separately(config, seeds), reporters, finals, strict=True):
        assert {k: v for k, v in final.items() if k not in TIMING} == pytest.approx(
            {k: v for k, v in final_together.items() if k not in TIMING}, rel=1e-4, abs=1e-7
        )
        assert reporter.starts and reporter.starts[-1] in (4, 6)
    alone = MemoryReporter()
    final_alone = run_trial(config, 2, alone, tmp_path / "m2")  # already finished: resumes at its last step
    assert final_alone["train_loss"] == pytest.approx(finals[2]["train_loss"], rel=1e-6)


def _drop_newest_checkpoint(folder):
    from studyrunner.train.checkpoint import open_storage, step_of

    storage = open_storage(folder)
    newest = max((n for n in storage.names() if step_of(n) is not None), key=step_of)
    storage.delete(newest)


def test_aux_terms_memory_rope_and_watched_gradients_match(monkeypatch):
    # The regulariser's aux term and block cosines, memory tokens (attention-mass diagnostics), RoPE,
    # two distinct layers, test-time depth, and a watched gradient group (as a halting family's router).
    monkeypatch.setattr(
        LoopedTransformer, "grad_norm_groups", lambda self: {"head": list(self.head.parameters())}, raising=False
    )
    config = tiny_config(steps=12, log_every=4, regulariser_lambda=0.5)
    config["model"]["params"].update(block_layers=2, regulariser_k=1, memory_slots=2, pos="rope")
    config["eval"].update(every=6, loops=[1, 3])
    reporters, finals = together(config, [0, 1])
    for (separate, final), reporter, final_together in zip(separately(config, [0, 1]), reporters, finals, strict=True):
        assert_same_trial(separate, final, reporter, final_together, config["eval"]["examples"])
    names = {k for row in reporters[0].rows for k in row}
    assert {"train_regulariser", "regulariser_weight", "block_cos_mean", "head_grad_norm"} <= names
    assert {"attn_seq_to_mem", "eval_accuracy_loops_3"} <= names


def test_seeds_whose_batches_differ_in_shape_still_match():
    # addition with two operand counts: each seed draws the count of a step from its own seed
    config = tiny_config(steps=8, log_every=4)
    config["task"] = {
        "name": "addition",
        "params": {"digits": 2, "train_operands": [2, 3], "eval_operands": [2], "reverse_answer": True},
    }
    config["model"]["params"]["pos"] = "rope"
    config["eval"].update(every=4, examples=16)
    from studyrunner.tasks import build_task

    tasks = [build_task("addition", config["task"]["params"], seed) for seed in (0, 1)]
    shapes = [[t.train_batch(step, 16).inputs.shape for t in tasks] for step in range(8)]
    assert any(a != b for a, b in shapes)  # the case under test happens
    reporters, finals = together(config, [0, 1])
    for (separate, final), reporter, final_together in zip(separately(config, [0, 1]), reporters, finals, strict=True):
        assert_same_trial(separate, final, reporter, final_together, 16)


def test_a_diverging_seed_ends_alone():
    config = tiny_config(steps=12, log_every=4)
    config["eval"].update(every=6)
    reporters, finals = together(config, [0, 1], nan_at={1: 7})
    ((sep0, final0),) = separately(config, [0])
    assert_same_trial(sep0, final0, reporters[0], finals[0], config["eval"]["examples"])
    assert isinstance(finals[1], Diverged) and finals[1].step == 7
    with pytest.raises(Diverged) as alone:
        run_trial(config, 1, MemoryReporter(), nan_at=7)
    assert alone.value.step == 7 and set(finals[1].metrics) == set(alone.value.metrics)
    assert finals[1].metrics["train_loss"] == pytest.approx(alone.value.metrics["train_loss"], rel=1e-4)
    assert max(r["step"] for r in reporters[1].rows) == 6  # nothing after the diverged step
    assert all(math.isfinite(v) for v in finals[0].values())


def test_a_reporter_raising_diverged_ends_its_seed_only():
    class Rule(MemoryReporter):
        def log(self, step, metrics):
            super().log(step, metrics)
            if step == 4:
                raise Diverged(step, "rule")

    config = tiny_config(steps=8, log_every=4)
    reporters = [MemoryReporter(), Rule()]
    finals = run_trials_together(config, [0, 1], reporters)
    assert isinstance(finals[1], Diverged) and finals[1].metrics["train_loss"] > 0
    assert [r["step"] for r in reporters[1].rows] == [0, 4]
    assert isinstance(finals[0], dict) and [r["step"] for r in reporters[0].rows] == [0, 4, 8]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"compile": "default"}, "train.compile"),
        ({"dropout": 0.1}, "dropout"),
        ({"lr_groups": {"rest": 1e-3}}, "train.lr_groups"),
        ({"other_shape": True}, "differ in more than the member fields"),
    ],
)
def test_what_cannot_be_packed_is_refused(change, message):
    config = tiny_config(steps=4)
    configs = [config, copy.deepcopy(config)]
    if "compile" in change:
        config["train"]["compile"] = change["compile"]
    if "dropout" in change:
        config["model"]["params"]["dropout"] = change["dropout"]
    if "lr_groups" in change:
        config["train"]["lr_groups"] = change["lr_groups"]
    if "other_shape" in change:
        configs[1]["model"]["params"]["loops"] = 3
    reporters = [MemoryReporter(), MemoryReporter()]
    with pytest.raises(ValueError, match="train.pack") as refused:
        run_trials_together(configs if "other_shape" in change else config, [0, 1], reporters)
    assert message in str(refused.value)
    assert all(r.rows == [] for r in reporters)  # refused before any work


def test_the_knob_leaves_cell_hashes_unchanged_when_unset():
    from pathlib import Path

    study = Path(__file__).resolve().parents[1] / "studies" / "quickstart.yaml"
    text = study.read_text()
    unset = compile_study(loads(text))
    assert [c.cell_hash for c in unset.cells] == ["b0798ba908c7", "ef712b8ca8ea", "d7173e55d97a"]
    assert "vectorize_seeds" not in unset.cells[0].config["train"]
    on = compile_study(loads(text.replace("grad_clip: 1.0}", "grad_clip: 1.0, vectorize_seeds: true}")))
    assert on.cells[0].config["train"]["vectorize_seeds"] is True
    assert on.cells[0].cell_hash != unset.cells[0].cell_hash  # set, it is part of the cell


def test_what_cannot_pack_is_refused_at_validate():
    text = TINY_STUDY.replace("grad_clip: 1.0,", "grad_clip: 1.0, pack: seeds,").replace(
        "loops: 1}", "loops: 1, dropout: 0.1}"
    )
    with pytest.raises(SpecError, match=r"train.pack.*dropout"):
        compile_study(loads(text))


def test_a_pack_reads_its_losses_back_only_where_a_member_books(monkeypatch):
    # 10 steps, records and evaluations every 5: two reads from the device, not ten; the records are a
    # separate run's all the same
    from studyrunner.train import vectorized

    bookings = []
    book = vectorized.Pack._book
    monkeypatch.setattr(vectorized.Pack, "_book", lambda self, *a: (bookings.append(self.step), book(self, *a)))
    config = tiny_config(steps=10, log_every=5)
    config["eval"].update(every=5)
    reporters, finals = together(config, [0, 1])
    assert bookings == [5, 10]
    for (separate, final), reporter, final_together in zip(separately(config, [0, 1]), reporters, finals, strict=True):
        assert_same_trial(separate, final, reporter, final_together, config["eval"]["examples"])


# ------------------------------------------------------------------------------ the step as a CUDA graph


def build_pack(config, seeds=(0, 1), nan_at=None):
    from studyrunner.train.config import TrialConfig
    from studyrunner.train.trainer import build_trial
    from studyrunner.train.trial_progress import Progress
    from studyrunner.train.vectorized import Pack

    trials = [build_trial(TrialConfig.of(config), s) for s in seeds]
    rng = [torch.get_rng_state() for _ in seeds]
    return Pack(trials, [Progress() for _ in seeds], rng, nan_at or [None] * len(seeds))


@pytest.mark.parametrize(
    ("family", "params", "train", "reason"),
    [
        ("looped", {"loops": 2}, {}, "not on a CUDA device"),
        ("loopformer", {"loops": 4, "objective": "shortcut_consistency"}, {}, "draws its training computation"),
        ("loopformer", {"loops": 4, "objective": "fixed"}, {}, "not on a CUDA device"),
        ("melt", {"loops": 2, "interpolate_steps": 4}, {}, "changes with the step"),
        ("ut_act", {"loops": 3}, {"ponder_lambda": 0.01, "ponder_lambda_warmup_steps": 5}, "ponder_lambda_warmup"),
    ],
)
def test_which_packs_can_be_one_cuda_graph(family, params, train, reason):
    from studyrunner.train.packed_graph import graph_problem

    config = tiny_config(steps=10)
    config["model"] = {"family": family, "params": {"d_model": 16, "n_heads": 2, **params}}
    config["train"].update(train)
    pack = build_pack(compile_config(config))
    assert reason in graph_problem(pack)
    assert pack.graph is None  # on the CPU a pack never has one
    assert "fault is injected" in graph_problem(build_pack(tiny_config(steps=10), nan_at=[None, 3]))


@pytest.mark.parametrize("weighted", [False, True])
def test_the_dense_loss_a_graph_captures_equals_the_masked_one(weighted):
    from studyrunner.tasks import build_task

    task = build_task("addition", {"digits": 3}, 0)
    batch = task.train_batch(0, 8)
    torch.manual_seed(0)
    logits = torch.randn(*batch.inputs.shape, task.facts.vocab_size)
    weights = torch.rand(batch.inputs.shape) if weighted else None
    masked = task.loss(logits, batch, weights)
    assert batch.loss_mask.sum() < batch.loss_mask.numel()  # some positions are not scored
    assert task.loss(logits, batch, weights, dense=True) == pytest.approx(masked.item(), rel=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a CUDA device (benchmarks/gpu_suite.py)")
def test_a_pack_replayed_as_a_cuda_graph_trains_as_the_eager_pack():
    config = tiny_config(steps=40, log_every=10, device="cuda")
    config["eval"].update(every=20)
    graphed = [MemoryReporter(), MemoryReporter()]
    finals = run_trials_together(config, [0, 1], graphed)
    eager = separately({**config, "train": {**config["train"], "device": "cuda"}}, [0, 1])
    for (_, final), final_graphed in zip(eager, finals, strict=True):
        assert final_graphed["train_loss"] == pytest.approx(final["train_loss"], rel=1e-3)


def test_a_packs_batches_come_stacked_where_their_shapes_agree():
    # one (S, B, T) tensor per field: one copy to the device per field and step, whatever the pack's size
    from studyrunner.tasks import build_task
    from studyrunner.train.vectorized import PackBatch

    same = [build_task("phop", {"alphabet": 4, "seq_len": 12, "hops": 1}, s).train_batch(0, 4) for s in (0, 1, 2)]
    made = PackBatch.of(same)
    assert made.members is None and made.inputs.shape == (3, *same[0].inputs.shape)
    for own, view in zip(same, made.split(), strict=True):
        assert torch.equal(own.inputs, view.inputs) and torch.equal(own.loss_mask, view.loss_mask)
    params = {"digits": 2, "train_operands": [2, 3], "eval_operands": [2], "reverse_answer": True}
    tasks = [build_task("addition", params, s) for s in (0, 1)]
    step = next(
        s for s in range(20) if tasks[0].train_batch(s, 4).inputs.shape != tasks[1].train_batch(s, 4).inputs.shape
    )
    mixed = PackBatch.of([t.train_batch(step, 4) for t in tasks])
    assert mixed.inputs is None and len(mixed.split()) == 2


def test_plan_says_how_the_trials_pack(tmp_path):
    from typer.testing import CliRunner

    from studyrunner.cli import app

    path = tmp_path / "study.yaml"
    path.write_text(TINY_STUDY.replace("grad_clip: 1.0,", "grad_clip: 1.0, pack: cells,").replace(
        "model.params.loops: [1, 2]", "train.lr: [1.0e-3, 3.0e-3]"))  # fmt: skip
    shown = CliRunner().invoke(app, ["plan", str(path)])
    assert shown.exit_code == 0, shown.output
    assert "packed (train.pack): 4 trials in 1 pack of 4 members, each one Ray trial with 1 CPU" in shown.output
    path.write_text(TINY_STUDY)
    assert "packed" not in CliRunner().invoke(app, ["plan", str(path)]).output
