"""Evaluation on the held-out splits, and the eval part of a step's record."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from ..tasks import Batch, Task
from .decoding import decodes, decoding_eval

EVAL_CHUNK = 256  # examples per eval forward: bounds memory for long sequences


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, task: Task, splits: dict[str, Batch], loops: int | None = None
) -> dict[str, float]:
    """Loss, accuracy, exact match (and model diagnostics) per split; unsuffixed names are split means.

    `loops` evaluates at another depth than trained (test-time depth); diagnostics are then skipped."""
    was_training = model.training
    model.eval()
    out: dict[str, float] = {}
    totals: dict[str, list[float]] = defaultdict(list)
    diagnostics: dict[str, list[float]] = defaultdict(list)
    for split, data in splits.items():
        sums: dict[str, float] = defaultdict(float)
        for start in range(0, len(data), EVAL_CHUNK):
            chunk = data.slice(start, start + EVAL_CHUNK)
            result = model(chunk.inputs, loops=loops, diagnose=loops is None)
            n = len(chunk)
            sums["loss"] += task.loss(result.logits, chunk).item() * n
            for name, value in task.metrics(result.logits, chunk).items():
                sums[name] += value * n
            for name, value in result.diagnostics.items():
                diagnostics[name].append(float(value))
        suffix = f"_{split}" if split else ""
        for name, total in sums.items():
            value = total / len(data)
            out[f"eval_{name}{suffix}"] = value
            totals[name].append(value)
    # The unsuffixed names always exist (the split mean), so a study's metric does not depend on how
    # many splits its task has.
    out.update({f"eval_{name}": sum(v) / len(v) for name, v in totals.items()})
    out.update({name: sum(v) / len(v) for name, v in diagnostics.items()})
    model.train(was_training)
    return out


def evaluate_and_record(
    model: torch.nn.Module, task: Task, splits: dict[str, Batch], done: int, steps: int, ev: dict[str, Any]
) -> dict[str, float]:
    """The eval part of the record after `done` steps: every `eval.every` steps and at the last step;
    at the last step also the test-time depths (`eval.loops`), once, as eval_*_loops_{n}."""
    record: dict[str, float] = {}
    if done % ev["every"] == 0 or done == steps:
        record.update(evaluate(model, task, splits))
    if done == steps:
        for n in ev.get("loops") or []:
            at_depth = evaluate(model, task, splits, loops=n)
            record.update({f"{name}_loops_{n}": value for name, value in at_depth.items()})
        if decodes(model, task):  # tasks that generate, on families with a KV cache (decoding.py)
            record.update(decoding_eval(model, task, splits))
    return record
