"""The trainer on its own (no Ray, no MLflow): metrics, determinism, learning."""

import math

import pytest
from conftest import TINY_STUDY

from studyrunner.study import compile_study, loads
from studyrunner.train import MemoryReporter, run_trial
from studyrunner.train.optim import lr_at

METRICS = [
    "train_loss",
    "eval_loss",
    "eval_accuracy",
    "eval_exact_match",
    "params",
    "effective_depth",
    "tokens_per_sec",
    "step_time_ms",
]


def tiny_config(**train):
    config = compile_study(loads(TINY_STUDY)).cells[1].config
    config["train"].update(train)
    return config


def test_final_metrics_use_the_stable_names():
    reporter = MemoryReporter()
    final = run_trial(tiny_config(), seed=0, reporter=reporter)
    for name in METRICS:
        assert name in final and math.isfinite(final[name]), name
    assert final["effective_depth"] == 2
    assert [s for s, _ in reporter.series("eval_accuracy")] == [6, 12]
    assert [s for s, _ in reporter.series("train_loss")] == [4, 8, 12]
    static = {"params": final["params"], "effective_depth": 2.0, "weights_bytes": 4 * final["params"]}
    assert reporter.rows[0] == {"step": 0, **static}


def test_same_seed_same_final_metrics_other_seed_differs():
    timing = {"tokens_per_sec", "step_time_ms", "train_time_s"}
    a, b, c = (run_trial(tiny_config(), seed=s) for s in (0, 0, 1))
    strip = lambda m: {k: v for k, v in m.items() if k not in timing}  # noqa: E731
    assert strip(a) == strip(b)
    assert strip(a)["train_loss"] != strip(c)["train_loss"]


def test_per_split_metrics_for_addition():
    config = tiny_config(steps=4, log_every=2)
    config["task"] = {
        "name": "addition",
        "params": {"digits": 2, "train_operands": [2], "eval_operands": [2, 3], "reverse_answer": True},
    }
    config["model"]["params"]["pos"] = "rope"
    final = run_trial(config, seed=0)
    for split in ("n2", "n3"):
        for name in ("eval_loss", "eval_accuracy", "eval_exact_match"):
            assert f"{name}_{split}" in final
    assert final["eval_accuracy"] == pytest.approx((final["eval_accuracy_n2"] + final["eval_accuracy_n3"]) / 2)


def test_training_lowers_the_loss():
    config = tiny_config(steps=150, lr=3e-3, log_every=50)
    config["task"]["params"].update(hops=1)
    reporter = MemoryReporter()
    run_trial(config, seed=0, reporter=reporter)
    losses = [v for _, v in reporter.series("train_loss")]
    assert losses[-1] < losses[0] - 0.1, losses


def test_schedule_warms_up_then_decays_to_the_floor():
    kw = {"lr": 1.0, "steps": 100, "warmup_steps": 10, "min_lr_ratio": 0.1}
    assert lr_at(0, **kw) == pytest.approx(0.1)
    assert lr_at(9, **kw) == pytest.approx(1.0)
    assert lr_at(10, **kw) == pytest.approx(1.0)
    assert lr_at(99, **kw) == pytest.approx(0.1)
    assert all(lr_at(s, **kw) >= lr_at(s + 1, **kw) for s in range(10, 99))


def test_a_corpus_task_names_its_text_in_the_trials_facts_and_a_generated_task_does_not():
    """Each trial's provenance names the corpus it trained and was scored on (SHA-256 of the exact documents,
    sources with versions); the facts go into the ledger's attempt provenance and MLflow's runtime.* params."""
    from studyrunner.tasks import build_task

    config = tiny_config(steps=2)
    config["task"] = {"name": "charlm", "params": {"seq_len": 16}}
    reporter = MemoryReporter()
    run_trial(config, seed=0, reporter=reporter)
    expected = build_task("charlm", {"seq_len": 16}, 0).fingerprint()
    assert reporter.run_facts["data.sha256"] == expected["sha256"] and len(expected["sha256"]) == 64
    assert "pydoc" in reporter.run_facts["data.sources"]
    generated = MemoryReporter()
    run_trial(tiny_config(steps=2), seed=0, reporter=generated)
    assert not any(k.startswith("data.") for k in generated.run_facts)
