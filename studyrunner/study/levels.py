"""A metric's levels (range, chance, heuristic floor) for a cell of a study, as its task declares them
(tasks/levels.py), for the analysis (`analysis/claims/validity.py`, the claims' distribution-free gate) and `plan`.

A metric name maps to the task metric it is a variant of: `eval_accuracy_loops_8` (another depth),
`eval_loss_budget_4_steps_1_2_2_3` and `eval_loss_budget_4_min` (a trajectory, the best of them),
`eval_decode_accuracy` (decoded), `teacher_eval_bpc` (the teacher's) all read on `eval_accuracy`'s,
`eval_loss`'s or `eval_bpc`'s scale. Summaries on another scale (`_spread`, `_front_rho`, `_best_front`,
`_top_front`) and metrics no task declares (`ponder_steps_mean`, `params`) have none.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from ..tasks import build_task
from ..tasks.levels import MetricLevels

_OTHER_SCALE = re.compile(r"_(spread|front_rho|best_front|top_front)$")
_VARIANT = re.compile(r"(_steps(_\d+)+|_(min|max)|_(loops|budget)_\d+)$")


def task_metric(metric: str) -> str | None:
    """The task metric `metric` is a variant of (see the module docstring), or None for another scale."""
    if _OTHER_SCALE.search(metric):
        return None
    name = metric.removeprefix("teacher_").replace("eval_decode_", "eval_", 1)
    while True:
        stripped = _VARIANT.sub("", name)
        if stripped == name:
            return name
        name = stripped


@lru_cache(maxsize=256)
def _task_levels(task: str, params_json: str, examples: int) -> dict[str, MetricLevels]:
    return build_task(task, json.loads(params_json), seed=0).metric_levels(examples)


def task_levels(config: dict[str, Any]) -> dict[str, MetricLevels]:
    """{eval metric: levels} of a cell's task on the cell's eval set (cached per task, params and size)."""
    task = config["task"]
    examples = int((config.get("eval") or {}).get("examples") or 512)
    return _task_levels(task["name"], json.dumps(task.get("params") or {}, sort_keys=True), examples)


def metric_levels(config: dict[str, Any], metric: str) -> MetricLevels | None:
    """The levels of `metric` in a cell with this resolved config; None where the task declares none."""
    name = task_metric(metric)
    if name is None:
        return None
    return task_levels(config).get(name)


def metric_range(configs, metric: str | None) -> tuple[float, float] | None:
    """(lo, hi) that `metric` cannot leave in any of these cells (resolved configs), as their tasks declare it
    (either end may be infinite: a loss lies in [0, inf)); None where a cell's task declares no levels for it
    (a summary on another scale, a metric no task knows), or there are no cells. The one place the study layer
    and the analysis (`analysis.claims.bounded.range_of`) read a metric's range."""
    if not metric:
        return None
    spans = []
    for config in configs:
        try:
            levels = metric_levels(config, metric)
        except Exception:  # noqa: BLE001 - a config whose task cannot be built (an old ledger): no range known
            return None
        if levels is None:
            return None
        spans.append((levels.low, levels.high))
    if not spans:
        return None
    return min(lo for lo, _ in spans), max(hi for _, hi in spans)
