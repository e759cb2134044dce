"""Seed aggregates of a cell while its study runs: logged on the cell's MLflow parent run as seeds finish,
so the MLflow runs table compares cells directly. Standard library only (it runs inside the driver)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from ..store.status import FINISHED, UNSUCCESSFUL
from ..study.claims_grammar import Rule, parse_rule


def rule_from(text: str | None) -> Rule | None:
    return parse_rule(text) if text else None


def seed_aggregates(trials: Iterable[tuple[str, dict[str, Any] | None]], metric: str, rule: Rule | None) -> dict:
    """(status, final metrics) of a cell's trials -> {metric}_mean, {metric}_sd, {metric}_n, seeds_done,
    seeds_failed and failure_rate over the finished ones (a failed status, or the `failure:` rule)."""
    done, failed, values = 0, 0, []
    for status, metrics in trials:
        if status not in FINISHED:
            continue
        done += 1
        metrics = metrics or {}
        if status in UNSUCCESSFUL or (rule is not None and rule(metrics)):
            failed += 1
        value = metrics.get(metric)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            values.append(float(value))
    out: dict[str, float] = {"seeds_done": done, "seeds_failed": failed, f"{metric}_n": len(values)}
    if done:
        out["failure_rate"] = failed / done
    if values:
        out[f"{metric}_mean"] = statistics.fmean(values)
    if len(values) > 1:
        out[f"{metric}_sd"] = statistics.stdev(values)
    return out
