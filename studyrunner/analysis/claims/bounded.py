"""A distribution-free gate on a mean against a number, for metrics with a known range (accuracies in [0, 1]).

The one-sample t-test of `y[cell] > c` assumes the seeds' values are roughly normal. Seeds that fail to chance
or succeed break it in a way the data cannot show: when every seed so far fell into the same mode, the t-test
decides on that mode alone (docs/analysis/sequential.md measured 9% false positives for such a claim under the
looks). For a metric whose range is known, a test exists that holds on *any* distribution in that range: betting
against the null (Waudby-Smith & Ramdas 2024, "Estimating means of bounded random variables by betting", JRSS B
86(1)). Under H0: E[y] <= c with y >= lo, each seed's (y − lo) / (c − lo) has mean at most 1, so their running
product, taken in seed order, is a non-negative supermartingale, and by Ville's inequality

    p = min(1, 1 / max_k prod_{i <= k} (y_i − lo) / (c − lo))

is a p-value valid at every look at once (anytime-valid: no spending needed however many waves look). The other
direction bets (hi − y) / (hi − c). A range known at one end only (a loss in [0, inf)) gives the test in the
direction that end bounds; the other direction has none (p = 1). This is the all-in bet, the most powerful one
when the seeds sit far from c (a model far above chance); near c no bet can help, because a hidden mode could
then explain the seeds.

A claim on such a metric is decided only where both hold: the t-test (at its fixed or sequential level) and this
gate (at ALPHA). Their intersection keeps the gate's level on any distribution and the t-test's power wherever the
gate passes. Its confidence set is the union of the two: the shown interval reaches as far as either.
"""

from __future__ import annotations

import math

import numpy as np

from ...study.levels import metric_range


def range_of(data, metric: str | None) -> tuple[float, float] | None:
    """(lo, hi) the metric cannot leave in every cell of the study, as the cells' tasks declare it; None where
    nothing is known or an end is unbounded (a loss lies in [0, inf): a failure mode could hide at any height, so
    no distribution-free bound exists and a mean against a number is not decided; its median is). The one place
    the analysis reads a metric's range (`study.levels.metric_range`; never guessed from the metric's name)."""
    span = metric_range(list(data.cell_configs.values()), metric)
    return span if span is not None and all(map(math.isfinite, span)) else None


def betting_p(x: np.ndarray, c: float, greater: bool, lo: float, hi: float) -> float:
    """The anytime-valid p-value of "the mean is above c" (`greater`) or below it, over `x` in seed order."""
    x = np.asarray(x, float)
    if not math.isfinite(lo if greater else hi):  # no bound on the side a hidden mode could hide: no test
        return 1.0
    if greater:
        if c <= lo:
            return 0.0 if len(x) else 1.0  # every value is at least lo >= c: the claim holds by construction
        factors = (x - lo) / (c - lo)
    else:
        if c >= hi:
            return 0.0 if len(x) else 1.0
        factors = (hi - x) / (hi - c)
    if not len(factors):
        return 1.0
    with np.errstate(divide="ignore"):
        best = float(np.max(np.cumsum(np.log(np.clip(factors, 0.0, None)))))
    return 1.0 if best <= 0 else min(1.0, math.exp(-best))


def betting_bound(x: np.ndarray, alpha: float, greater: bool, lo: float, hi: float) -> float:
    """The confidence bound the gate gives: the smallest c the gate cannot reject "mean above c" at `alpha`
    (a lower bound, `greater`), or the largest for "below c" (an upper bound)."""
    x = np.asarray(x, float)
    if not len(x) or not math.isfinite(lo if greater else hi):
        return lo if greater else hi
    # the bound lies between the range's end and the data's far side (p is 1 beyond the data's extreme)
    left, right = (lo, max(float(x.max()), lo)) if greater else (min(float(x.min()), hi), hi)
    for _ in range(60):  # bisection: the p-value rises monotonically as c moves toward the data's far side
        mid = (left + right) / 2
        rejected = betting_p(x, mid, greater, lo, hi) <= alpha
        if greater:
            left, right = (mid, right) if rejected else (left, mid)
        else:
            left, right = (left, mid) if rejected else (mid, right)
    return left if greater else right


def out_of_range(x: np.ndarray, lo: float, hi: float) -> bool:
    """Values outside the range said to bind them: the range is wrong for this metric, so no gate."""
    x = np.asarray(x, float)
    return bool(np.any(x < lo - 1e-9) or np.any(x > hi + 1e-9))


def projected_p(x: np.ndarray, c: float, greater: bool, lo: float, hi: float, more: int) -> float:
    """The gate's p were `more` seeds to come at the mean seen so far: a non-binding futility guide (a claim whose
    gate cannot pass by `max` at its current trend gets no more seeds; the level never relies on it)."""
    x = np.asarray(x, float)
    if not len(x) or more <= 0:
        return betting_p(x, c, greater, lo, hi)
    projected = np.concatenate([x, np.full(more, x.mean())])
    return betting_p(projected, c, greater, lo, hi)
