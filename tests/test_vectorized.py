"""Seeds trained together (`train.vectorize_seeds`): each seed's records and final
metrics equal its separate `run_trial` run up to float rounding; what cannot be batched is refused.

Tolerance. The batched step sums in another order than a separate run's kernels (batched matmuls, and
attention written out as matmuls under vmap instead of the fused kernel), so values agree to float
rounding (~1e-7 relative after 30 steps here), not bit for bit: losses and every other value are held
to rtol 1e-4. Eval accuracy and exact match are fractions of examples; a near-tie between two logits
could flip one example, so they are held to one example (they came out equal here)."""

import math

import pytest
from conftest import TINY_STUDY

from studyrunner.models.looped import LoopedTransformer
from studyrunner.study import compile_study, loads
from studyrunner.train import Diverged, MemoryReporter, run_trial
from studyrunner.train.vectorized import run_trials_together

TIMING = {"tokens_per_sec", "step_time_ms", "train_time_s"}
COUNTS = ("eval_accuracy", "eval_exact_match")  # fractions of examples (see the module docstring)


def tiny_config(**train):
    config = compile_study(loads(TINY_STUDY)).cells[1].config  # looped 1x2
    config["train"].update({"steps": 30, "log_every": 5, **train})
    config["eval"].update(every=10)
    return config


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
    assert set(reporter.run_facts) == set(separate.run_facts) | {"seeds_together"}


def test_each_seed_matches_its_separate_run():
    config, seeds = tiny_config(), [0, 1, 2]
    reporters, finals = together(config, seeds)
    for (separate, final), reporter, final_together in zip(separately(config, seeds), reporters, finals, strict=True):
        assert_same_trial(separate, final, reporter, final_together, config["eval"]["examples"])
        assert reporter.run_facts["seeds_together"] == "3"
        # the shared step's throughput: every seed reports the same figures
        assert reporter.series("step_time_ms") == reporters[0].series("step_time_ms")
    assert finals[0]["train_loss"] != finals[1]["train_loss"]  # the seeds really are different trials


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
        ({"family": "ut_act"}, "halting family"),
        ({"family": "adaptive_layers"}, "halting family"),
        ({"compile": "default"}, "train.compile"),
        ({"dropout": 0.1}, "dropout"),
        ({"checkpoints": "somewhere"}, "checkpoints are not supported"),
    ],
)
def test_what_cannot_be_batched_is_refused(change, message, tmp_path):
    config = tiny_config(steps=4)
    kw = {}
    if "family" in change:
        config["model"] = {"family": change["family"], "params": {"d_model": 16, "n_heads": 2, "loops": 2}}
    if "compile" in change:
        config["train"]["compile"] = change["compile"]
    if "dropout" in change:
        config["model"]["params"]["dropout"] = change["dropout"]
    if "checkpoints" in change:
        kw["checkpoints"] = tmp_path
    reporters = [MemoryReporter(), MemoryReporter()]
    with pytest.raises(ValueError, match="train.vectorize_seeds") as refused:
        run_trials_together(config, [0, 1], reporters, **kw)
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
