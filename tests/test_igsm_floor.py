"""The i-GSM copy-and-guess floor, fitted and scored: the strategy that answers a copy chain by copying and
everything else with the most common answer of the training stream (fitted on training batches), applied to
the eval inputs alone and scored against the eval targets. On the shipped study's setting (nodes 4) it scores
the declared floor (`Igsm.heuristic_floors`), far above chance; with `min_ops >= 1` no question is a copy chain
and it scores chance, where the declared levels put it (no floor)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from studyrunner.tasks import build_task
from studyrunner.tasks.igsm import copy_chain_answer

SHIPPED = yaml.safe_load((Path(__file__).parents[1] / "studies" / "looped_depth_igsm.yaml").read_text())["task"]
EXAMPLES = 2048
TOLERANCE = 0.04  # > 3 binomial standard deviations at 2048 examples (sqrt(0.25 / 2048) = 0.011)


def fit_copy_and_guess(task, batches: int = 40, batch_size: int = 64):
    """Fit the strategy on the training stream: the most common answer among the questions copying does not
    answer. Returns `predict(inputs row) -> answer token`."""
    counts: Counter[int] = Counter()
    for step in range(batches):
        batch = task.train_batch(step, batch_size)
        for row, target in zip(batch.inputs.tolist(), batch.targets[:, -1].tolist(), strict=True):
            if copy_chain_answer(row, task.vocab) is None:
                counts[target] += 1
    fallback = counts.most_common(1)[0][0]

    def predict(row: list[int]) -> int:
        copied = copy_chain_answer(row, task.vocab)
        return fallback if copied is None else copied

    return predict


def score(task, predict) -> tuple[float, float]:
    """(accuracy, share of copy chains) of `predict` on the eval set: it reads the inputs only."""
    batch = task.eval_sets(EXAMPLES)[""]
    rows, targets = batch.inputs.tolist(), batch.targets[:, -1].tolist()
    hits = [predict(row) == target for row, target in zip(rows, targets, strict=True)]
    copies = [copy_chain_answer(row, task.vocab) is not None for row in rows]
    return float(np.mean(hits)), float(np.mean(copies))


def test_on_the_shipped_setting_the_fitted_strategy_scores_the_declared_floor():
    assert SHIPPED["name"] == "igsm" and SHIPPED["params"].get("min_ops", 0) == 0
    task = build_task("igsm", SHIPPED["params"], seed=0)
    levels = task.metric_levels(EXAMPLES)
    accuracy, copies = score(task, fit_copy_and_guess(task))
    for metric in ("eval_accuracy", "eval_exact_match"):  # one scored token: both are the same number
        declared = levels[metric]
        assert declared.floor is not None and declared.floor > declared.chance + 0.2
        assert "copy" in declared.floor_strategy
        assert abs(accuracy - declared.floor) < TOLERANCE, (accuracy, declared.floor)
    assert 0.25 < copies < 0.5  # the reviewer's 34.5% of copy chains


@pytest.mark.parametrize(
    "extra",
    [
        {"min_ops": 1},  # the shipped setting without its copy chains
        {"min_ops": 2},
        {"nodes": 6, "min_ops": 3},
    ],
)
def test_with_min_ops_the_fitted_strategy_scores_chance_and_no_floor_is_declared(extra):
    task = build_task("igsm", {**SHIPPED["params"], **extra}, seed=0)
    levels = task.metric_levels(EXAMPLES)
    accuracy, copies = score(task, fit_copy_and_guess(task))
    assert copies == 0.0  # copying answers nothing
    for metric in ("eval_accuracy", "eval_exact_match"):
        declared = levels[metric]
        assert declared.floor is None and declared.floor_strategy == ""
        assert declared.chance == pytest.approx(1 / task.p.modulus)
        assert declared.uninformative == declared.chance
        assert abs(accuracy - declared.chance) < TOLERANCE, (accuracy, declared.chance)
