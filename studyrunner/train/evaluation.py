"""Evaluation on the held-out splits, and the eval part of a step's record.

Other depths than the trained one are one mechanism: `eval.loops: [n]` (names `_loops_{n}`) and
`eval.budgets: [M]` (names `_budget_{M}`) both evaluate `forward(tokens, loops=M)`, M steps, once
after the last step; `eval.trajectory` says which M-step trajectory a family with trajectories runs
(`enumerate_all`: every one on its 1/L grid, each logged, with their spread). At the trained depth
the model's diagnostics are filled in, and the representation diagnostics of its loop steps
(models/representations.py) are measured on a fixed probe batch: the first examples of the first split.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch

from ..models.representations import tracing
from ..models.trajectories import ENUMERATE_ALL, front_loading, grid_label, grid_trajectories, schedule
from ..tasks import Batch, Task
from .config import EvalConfig
from .decoding import decodes, decoding_eval, has_kv_cache, kv_footprint

EVAL_CHUNK = 256  # examples per eval forward: bounds memory for long sequences
PROBE_EXAMPLES = 64  # the probe batch of the representation diagnostics
SCHEDULE_SUMMARIES = ("min", "max", "spread", "front_rho", "best_front", "top_front")
TOP_SHARE = 0.2  # `_top_front`: the best fifth of the trajectories (7 of 35 at L = 8, M = 4)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    task: Task,
    splits: dict[str, Batch],
    loops: int | None = None,
    *,
    trajectory: list[float] | None = None,
    representations: bool = True,
) -> dict[str, float]:
    """Loss, accuracy, exact match (and model diagnostics) per split; unsuffixed names are split means.

    `loops` evaluates at another depth than trained (test-time depth), `trajectory` runs that trajectory
    (families with trajectories); diagnostics are then skipped."""
    was_training = model.training
    model.eval()
    diagnose = loops is None and trajectory is None
    kwargs = {} if trajectory is None else {"trajectory": trajectory}
    out: dict[str, float] = {}
    totals: dict[str, list[float]] = defaultdict(list)
    diagnostics: dict[str, list[float]] = defaultdict(list)
    for split, data in splits.items():
        sums: dict[str, float] = defaultdict(float)
        for start in range(0, len(data), EVAL_CHUNK):
            chunk = data.slice(start, start + EVAL_CHUNK)
            result = model(chunk.inputs, loops=loops, diagnose=diagnose, **kwargs)
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
    if diagnose and representations and splits:
        out.update(probe_representations(model, next(iter(splits.values()))))
    model.train(was_training)
    return out


@torch.no_grad()
def probe_representations(model: torch.nn.Module, data: Batch) -> dict[str, float]:
    """The representation diagnostics of one forward on the first PROBE_EXAMPLES examples of `data`
    (empty for a family that traces no loop steps)."""
    with tracing(model) as trace:
        model(data.inputs[:PROBE_EXAMPLES])
    return trace.result()


def depth_settings(ev: EvalConfig) -> list[tuple[str, int]]:
    """(name suffix, loop steps) of every evaluation at another depth: eval.loops, then eval.budgets."""
    return [(f"_loops_{n}", n) for n in ev.loops or ()] + [(f"_budget_{m}", m) for m in ev.budgets or ()]


def schedule_names(headline: list[str], suffix: str, grid: int, m: int) -> set[str]:
    """Names `enumerate_all` logs at one depth: each grid trajectory's, and their summaries."""
    labels = [grid_label(steps, grid) for steps in grid_trajectories(grid, m)]
    names = {f"{name}{suffix}_steps_{label}" for name in headline for label in labels}
    return names | {f"{name}{suffix}_{summary}" for name in headline for summary in SCHEDULE_SUMMARIES}


def depth_metric_names(
    ev: EvalConfig | Mapping[str, Any], task_metrics: set[str], headline: list[str], grid: int | None
) -> set[str]:
    """Every name `evaluate_depths` reports for this eval section (what `validate` checks metric.name against;
    the resolved section, a mapping, is read as an `EvalConfig`): `task_metrics` are the task's eval names,
    `headline` the unsuffixed ones, `grid` the model's L."""
    ev = EvalConfig.of(ev)
    names: set[str] = set()
    for suffix, m in depth_settings(ev):
        names |= {f"{name}{suffix}" for name in task_metrics}
        if ev.trajectory == ENUMERATE_ALL and grid is not None:
            names |= schedule_names(headline, suffix, grid, m)
    return names


def evaluate_depths(model: torch.nn.Module, task: Task, splits: dict[str, Batch], ev: EvalConfig) -> dict[str, float]:
    """Every evaluation at another depth (eval.loops, eval.budgets), under eval.trajectory."""
    spec = ev.trajectory
    record: dict[str, float] = {}
    for suffix, m in depth_settings(ev):
        trajectory = schedule(spec, m) if spec is not None and spec != ENUMERATE_ALL else None
        at_depth = evaluate(model, task, splits, loops=m, trajectory=trajectory)
        record.update({f"{name}{suffix}": value for name, value in at_depth.items()})
        if spec == ENUMERATE_ALL:
            record.update(evaluate_schedules(model, task, splits, m, suffix))
    return record


def evaluate_schedules(
    model: torch.nn.Module, task: Task, splits: dict[str, Batch], m: int, suffix: str
) -> dict[str, float]:
    """Every M-step trajectory on the model's 1/L grid (LoopFormer §4.4): each one's headline metrics as
    `{name}{suffix}_steps_{units}` (step sizes in grid units, e.g. _steps_4_2_1_1), and across them:

    - `_min`, `_max`: the test-half score of the trajectory that is lowest (highest) on the validation half,
      and `_spread` (max - min); the trajectories are ranked on one half of the eval examples and the chosen
      one is scored on the other (`held_out_halves`), so the best of 35 is not inflated by the noise it was
      chosen for (`selection_heldout` = 1 says a trial did this: analysis/claims/validity.py's `selection` threat);
    - `_front_rho`: the Spearman correlation of the metric with how front-loaded the trajectory is
      (`trajectories.front_loading`; omitted when either is constant), over every trajectory (no selection);
    - the paper's own statement ("the best schedules are front-loaded"): `_best_front`, the front-loading of
      the best trajectory on the validation half (the mean over those tied for best), and `_top_front`, the
      mean front-loading of its best fifth (above 0.5, the uniform trajectory's: the best are front-loaded).

    Best: the lowest loss, the highest accuracy or exact match. The `_steps_` scores are over every example.
    Ranking on one half and scoring on the other costs a second pass over the examples per trajectory."""
    grid = model.trajectory_grid
    headline = ["eval_loss", *(f"eval_{kind}" for kind in task.metric_kinds)]
    trajectories = grid_trajectories(grid, m)
    validation, test = held_out_halves(splits)
    values: dict[str, list[float]] = defaultdict(list)
    ranked: dict[str, list[float]] = defaultdict(list)
    scored: dict[str, list[float]] = defaultdict(list)
    record: dict[str, float] = {}
    for steps in trajectories:
        at = evaluate(model, task, splits, trajectory=steps)
        on_validation = evaluate(model, task, validation, trajectory=steps, representations=False)
        on_test = evaluate(model, task, test, trajectory=steps, representations=False)
        for name in headline:
            record[f"{name}{suffix}_steps_{grid_label(steps, grid)}"] = at[name]
            values[name].append(at[name])
            ranked[name].append(on_validation[name])
            scored[name].append(on_test[name])
    fronts = [front_loading(steps) for steps in trajectories]
    for name, series in values.items():
        low = min(range(len(series)), key=ranked[name].__getitem__)
        high = max(range(len(series)), key=ranked[name].__getitem__)
        record[f"{name}{suffix}_min"], record[f"{name}{suffix}_max"] = scored[name][low], scored[name][high]
        record[f"{name}{suffix}_spread"] = scored[name][high] - scored[name][low]
        rho = spearman(fronts, series)
        if rho is not None:
            record[f"{name}{suffix}_front_rho"] = rho
        best, top = best_fronts(fronts, ranked[name], lower_is_better=name == "eval_loss")
        record[f"{name}{suffix}_best_front"], record[f"{name}{suffix}_top_front"] = best, top
    record["selection_heldout"] = 1.0
    return record


def held_out_halves(splits: dict[str, Batch]) -> tuple[dict[str, Batch], dict[str, Batch]]:
    """Each split's eval examples in two disjoint halves, interleaved (even examples: validation, odd: test),
    so that a choice made on one is scored on the other."""
    validation, test = {}, {}
    for split, data in splits.items():
        index = torch.arange(len(data))
        validation[split], test[split] = _take(data, index[0::2]), _take(data, index[1::2])
    return validation, test


def _take(data: Batch, index: torch.Tensor) -> Batch:
    return Batch(data.inputs[index], data.targets[index], data.loss_mask[index])


def best_fronts(fronts: list[float], series: list[float], *, lower_is_better: bool) -> tuple[float, float]:
    """Front-loading of the best trajectory (mean over ties) and mean front-loading of the best TOP_SHARE
    (at least one; every trajectory tied with the last one taken counts)."""
    sign = 1.0 if lower_is_better else -1.0
    scores = [sign * v for v in series]
    best = min(scores)
    tied = [f for f, s in zip(fronts, scores, strict=True) if s == best]
    cutoff = sorted(scores)[max(1, round(TOP_SHARE * len(scores))) - 1]
    top = [f for f, s in zip(fronts, scores, strict=True) if s <= cutoff]
    return sum(tied) / len(tied), sum(top) / len(top)


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):  # ties share their average rank
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rank correlation (ties averaged); None when either side is constant."""
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


TEACHER_PREFIX = "teacher_"
UNREPRODUCIBLE = ("eval_peak_memory_bytes", "decode_tokens_per_sec")  # of the machine, not the model


def teacher_metric_names(task: Task) -> set[str]:
    """What `teacher_scores` reports for this task (what `validate` checks claims against)."""
    names = task.reported_metrics() | (task.decode_metric_names() - set(UNREPRODUCIBLE))
    return {TEACHER_PREFIX + name for name in names}


def teacher_scores(teacher: torch.nn.Module, task: Task, splits: dict[str, Batch]) -> dict[str, float]:
    """A conversion's teacher scored once on the trial's own eval sets (it is frozen): `teacher_eval_*`, and
    where the task decodes, its decoding and KV-cache metrics (`teacher_eval_decode_bpc`,
    `teacher_kv_cache_bytes_per_token`), so a claim can compare each student with its teacher trial by
    trial. Wall-clock and peak memory are left out; no random stream is drawn from."""
    with torch.random.fork_rng(devices=[]):
        record = evaluate(teacher, task, splits, representations=False)
        if decodes(teacher, task):
            record.update(decoding_eval(teacher, task, splits))
    wanted = teacher_metric_names(task)
    return {TEACHER_PREFIX + k: v for k, v in record.items() if TEACHER_PREFIX + k in wanted}


def evaluate_and_record(
    model: torch.nn.Module, task: Task, splits: dict[str, Batch], done: int, steps: int, ev: EvalConfig
) -> dict[str, float]:
    """The eval part of the record after `done` steps: every `eval.every` steps and at the last step;
    at the last step also the other depths (`eval.loops`, `eval.budgets`), once, as eval_*_loops_{n}
    and eval_*_budget_{M}."""
    record: dict[str, float] = {}
    if done % ev.every == 0 or done == steps:
        record.update(evaluate(model, task, splits, representations=ev.representations is not False))
    if done == steps:
        record.update(evaluate_depths(model, task, splits, ev))
        if decodes(model, task):  # tasks that generate, on families with a KV cache (decoding.py)
            record.update(decoding_eval(model, task, splits))
        elif has_kv_cache(model, task):  # the cache such a model would keep, from its shape
            record.update(kv_footprint(model))
    return record
