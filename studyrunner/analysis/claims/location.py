"""Claims on means, IQMs and medians, over one value per seed (`evidence.by_seed`).

Against a number: the one-sample t (mean), Yuen's one-sample trimmed t (IQM), the exact sign test (median).
Against the same quantity: over shared seeds the paired t, or Yuen's trimmed t of the per-seed differences;
over disjoint seeds Welch's t or Yuen's two-sample t; medians or mixed statistics by a stratified bootstrap,
from MIN_BOOTSTRAP_SEEDS seeds a side. Seeds no t-test describes go to an exact randomisation test (`exact`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats as sps

from ...study.claims_grammar import Quantity
from ..stats import MIN_BOOTSTRAP_SEEDS, N_RESAMPLES, SEED, bootstrap_draws, one_sided_t, yuen_one, yuen_two
from . import bounded, exact
from .evidence import STATISTICS, by_seed, deterministic, no_spread, statistic, tied, values_by_cell
from .verdict import (
    ALPHA,
    Verdict,
    cannot_decide,
    cannot_shift,
    conclude,
    exact_difference,
    randomised,
    shifted,
)


def location_vs_number(
    v: Verdict, rows: pd.DataFrame, q: Quantity, greater: bool, c: float, irregular: str, span=None
) -> Verdict:
    """A mean, IQM or median of one side against the number c. `span`: the metric's range (`bounded.range_of`);
    a mean or IQM of a metric of no known range is not decided (`no_range`), a mean of one with a range also
    needs the distribution-free gate (`_gate`)."""
    values = by_seed(rows, q.metric)
    x = values.to_numpy(float)
    cells = rows.cell_hash.nunique()
    v.lhs = statistic(q.kind, x)
    v.estimate = v.lhs - c
    v.seeds = (len(x),)
    per = "per-seed means over cells" if cells > 1 else "seeds"
    v.detail = f"n={len(x)} seeds in {cells} cell(s)"
    if q.kind == "median":  # the sign test holds on any seeds
        return _median_vs_number(v, x, greater, c)
    if q.kind == "mean":
        n = len(x)
        centre, se, df = (v.lhs, x.std(ddof=1) / math.sqrt(n), n - 1) if n >= 2 else (v.lhs, math.nan, math.nan)
        v.test = f"one-sample t over {per}"
    else:
        centre, se, df = yuen_one(x)
        v.test = f"one-sample Yuen trimmed t of the IQM over {per}"
    if deterministic([(rows, q.metric)]):
        return exact_difference(v, greater, v.lhs - c)
    irregular = irregular or tied(x) or ("the seeds have no spread" if no_spread(se, x) else "")
    if irregular:
        return cannot_decide(v, q, irregular, against_number=True)
    if span is None:
        return no_range(v, q)
    res = one_sided_t(centre, se, df, v.alpha, c)
    v.extra["design"] = {"test": "t1" if q.kind == "mean" else "yuen1", "x": x, "null": c, "greater": greater}
    gate_up, gate_down = _gate(v, res, x, span, c, greater) if q.kind == "mean" else (0.0, 0.0)
    shifted(v, res, c)
    return conclude(v, greater, max(res["p_up"], gate_up), max(res["p_down"], gate_down))


def no_range(v: Verdict, q: Quantity) -> Verdict:
    """Inconclusive: a mean or IQM against a number on a metric of no known range. No test of a mean holds its
    level over every distribution without a bound (Bahadur & Savage 1956): on skewed seeds (exponential,
    lognormal) the one-sample t called 19-28% of true nulls supported under the looks. The median's sign test
    holds on any seeds, a comparison of two cells holds without a range, and a declared range brings the
    distribution-free gate (`bounded`)."""
    where = f"[{', '.join(f'{k}={val}' for k, val in q.selector)}]" if q.selector else ""
    v.lo = v.hi = math.nan
    v.test = "no test holds its level here"
    v.detail = (
        f"cannot decide: {q.metric} has no known range, and no test of a {q.kind} against a number holds its level "
        f"on skewed seeds without one; claim the median (median({q.metric}){where}: the exact sign test, from 5 "
        "seeds), compare with another cell, or declare the metric's range"
    )
    return v


def _gate(v: Verdict, res: dict, x: np.ndarray, span, c: float, greater: bool) -> tuple[float, float]:
    """The distribution-free gate (`bounded`) on a mean of a metric with a known range: its p-values ("greater",
    "less"; 0 where there is no gate). A verdict needs both the t-test and the gate, so its p is the larger of the
    two and its interval (set here in `res`) the union of theirs. A sequential look reads `extra["gate"]`: it
    compares the t-test's p with its boundary and the gate's with ALPHA; seeds needed read the range."""
    if bounded.out_of_range(x, *span):
        return 0.0, 0.0
    up, down = bounded.betting_p(x, c, True, *span), bounded.betting_p(x, c, False, *span)
    t_claimed, t_opposite = (res["p_up"], res["p_down"]) if greater else (res["p_down"], res["p_up"])
    claimed, opposite = (up, down) if greater else (down, up)
    v.extra["gate"] = {"t_claimed": t_claimed, "t_opposite": t_opposite, "claimed": claimed, "opposite": opposite}
    v.extra["design"]["span"] = span
    # The gate is anytime-valid, so a sequential look holds it at ALPHA itself while the t-test meets the look's
    # smaller nominal level (the level this verdict is evaluated at there): its bounds are at ALPHA or above.
    level = max(v.alpha, ALPHA)
    res["lo"] = min(res["lo"], bounded.betting_bound(x, level, True, *span))
    res["hi"] = max(res["hi"], bounded.betting_bound(x, level, False, *span))
    if t_claimed < v.alpha and claimed > level:
        v.detail += (
            f"; held back by the distribution-free bound on a metric in [{span[0]:g}, {span[1]:g}] (p {claimed:.3g}):"
            " a failure mode no seed has shown yet could still explain these seeds; more seeds, or a failure-rate"
            " claim, decide it"
        )
    return up, down


def _median_vs_number(v: Verdict, x: np.ndarray, greater: bool, c: float) -> Verdict:
    """The exact sign test of the median against c, and the order-statistic bounds that invert it
    (`scipy.stats.quantile_test`): distribution-free, so it holds on bimodal seeds too; its smallest p is
    0.5^n, so it decides nothing below 5 seeds."""
    if not len(x):
        return v
    up = sps.quantile_test(x, q=c, p=0.5, alternative="greater")  # H1: the median is above c
    down = sps.quantile_test(x, q=c, p=0.5, alternative="less")
    lo = up.confidence_interval(1 - v.alpha).low  # one-sided bounds: their own alternatives
    hi = down.confidence_interval(1 - v.alpha).high
    shifted(v, {"lo": float(lo), "hi": float(hi)}, c)
    v.test = "exact sign test of the median (order-statistic bounds; decides nothing below 5 seeds)"
    v.extra["design"] = {"test": "sign", "x": x, "null": c, "greater": greater}
    return conclude(v, greater, up.pvalue, down.pvalue)


def locations(
    v: Verdict, a_rows, b_rows, qa: Quantity, qb: Quantity, greater: bool, irregular: str, null: float = 0.0
) -> Verdict:
    """lhs − rhs against `null` (0; a margin's −δ or +δ for non-inferiority and equivalence), one-sided."""
    a, b = by_seed(a_rows, qa.metric), by_seed(b_rows, qb.metric)
    several = a_rows.cell_hash.nunique() > 1 or b_rows.cell_hash.nunique() > 1
    per = " (per-seed means over cells)" if several else ""
    shared = a.index.intersection(b.index)
    if qa.kind != qb.kind or qa.kind not in ("mean", "iqm"):
        if irregular:
            return cannot_decide(v, qa, irregular)
        return _bootstrap_difference(v, a_rows, b_rows, qa, qb, greater, null)
    paired = len(shared) >= 2
    if paired:
        a, b = a[shared], b[shared]
        d = (a - b).to_numpy(float)
        v.seeds = (len(d), len(d))
        v.detail = f"{len(d)} shared seeds; lhs > rhs in {int((d > 0).sum())}/{len(d)}"
        if qa.kind == "mean":
            n = len(d)
            estimate, se, df = float(d.mean()), d.std(ddof=1) / math.sqrt(n), n - 1
            v.test = f"paired t over shared seeds{per}"
        else:
            estimate, se, df = yuen_one(d)
            v.test = f"paired Yuen: trimmed t of the IQM of per-seed differences{per}"
    else:
        va, vb = a.to_numpy(float), b.to_numpy(float)
        v.seeds = (len(va), len(vb))
        cells = f"{a_rows.cell_hash.nunique()} vs {b_rows.cell_hash.nunique()} cell(s)"
        v.detail = f"n={len(va)} vs {len(vb)} seeds in {cells}"
        if qa.kind == "mean":
            estimate, se, df = _welch(va, vb)
            v.test = f"Welch t over seeds{per}"
        else:
            estimate, se, df = yuen_two(va, vb)
            v.test = f"Yuen two-sample trimmed t of the IQMs{per}"
    v.lhs, v.rhs = statistic(qa.kind, a.to_numpy(float)), statistic(qb.kind, b.to_numpy(float))
    v.hypothesis = _hypothesis(a_rows, b_rows, greater, a.index if paired else None, null)
    units = {"d": d} if paired else {"a": a.to_numpy(float), "b": b.to_numpy(float)}
    if deterministic([(a_rows, qa.metric), (b_rows, qb.metric)]):
        return exact_difference(v, greater, v.lhs - v.rhs, null)
    if irregular and null:
        return cannot_shift(v, qa, irregular)
    irregular = irregular or tied(a, b)
    if irregular or no_spread(se, a.to_numpy(float), b.to_numpy(float)):
        why = irregular or "the seeds' differences have no spread"
        if paired:
            res = exact.sign_flip(d, v.alpha, null)
        else:
            res = exact.two_sample(a.to_numpy(float), b.to_numpy(float), v.alpha, null)
        v.extra["design"] = {"test": "signflip" if paired else "perm2", **units, "greater": greater}
        return randomised(v, res, why, greater)
    v.estimate = estimate
    res = one_sided_t(estimate, se, df, v.alpha, null)
    v.lo, v.hi = res["lo"], res["hi"]
    test = {"mean": ("t1", "welch"), "iqm": ("yuen1", "yuen2")}[qa.kind][0 if paired else 1]
    v.extra["design"] = {
        "test": test,
        **({"x": d, "paired": True} if paired else units),
        "null": null,
        "greater": greater,
    }
    return conclude(v, greater, res["p_up"], res["p_down"])


def _hypothesis(a_rows: pd.DataFrame, b_rows: pd.DataFrame, greater: bool, seeds=None, null: float = 0.0) -> tuple:
    """What Holm counts once: the trials of the side claimed greater, those of the other, the null."""
    if seeds is not None:
        a_rows, b_rows = a_rows[a_rows.seed.isin(seeds)], b_rows[b_rows.seed.isin(seeds)]
    a, b = tuple(sorted(map(str, a_rows.trial_key))), tuple(sorted(map(str, b_rows.trial_key)))
    return (a, b, null) if greater else (b, a, -null)


def _welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """(mean(a) − mean(b), se, Welch-Satterthwaite df); NaN below 2 values a side."""
    if len(a) < 2 or len(b) < 2:
        return (math.nan, math.nan, math.nan)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    denom = va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)
    df = (va + vb) ** 2 / denom if denom > 0 else float(len(a) + len(b) - 2)
    return (float(a.mean() - b.mean()), se, float(df))


def _bootstrap_difference(
    v: Verdict, a_rows, b_rows, qa: Quantity, qb: Quantity, greater: bool, null: float = 0.0
) -> Verdict:
    """Medians, or mixed statistics: a stratified bootstrap of the difference (by cell), only from
    MIN_BOOTSTRAP_SEEDS seeds a side (below, it does not hold its level). p_up is the share of draws at or
    below 0, so the percentile bound lo (the alpha quantile) is above 0 exactly when p_up < alpha."""
    ga, gb = values_by_cell(a_rows, qa.metric), values_by_cell(b_rows, qb.metric)
    va = np.concatenate(ga) if ga else np.empty(0)
    vb = np.concatenate(gb) if gb else np.empty(0)
    v.lhs, v.rhs = statistic(qa.kind, va), statistic(qb.kind, vb)
    v.estimate = v.lhs - v.rhs
    v.seeds = (len(va), len(vb))
    v.test = "bootstrap of the difference (stratified by cell)"
    v.detail = f"n={len(va)} vs {len(vb)} seeds"
    if min(len(va), len(vb)) < MIN_BOOTSTRAP_SEEDS:
        v.detail += f"; no interval below {MIN_BOOTSTRAP_SEEDS} seeds a side (compare means or IQMs)"
        return v
    rng = np.random.default_rng(SEED)
    da = bootstrap_draws(ga, STATISTICS[qa.kind], N_RESAMPLES, rng)
    db = bootstrap_draws(gb, STATISTICS[qb.kind], N_RESAMPLES, rng)
    if da is None or db is None:
        return v
    draws = da - db
    v.lo = float(np.quantile(draws, v.alpha, method="inverted_cdf"))
    v.hi = float(-np.quantile(-draws, v.alpha, method="inverted_cdf"))
    return conclude(v, greater, float(np.mean(draws <= null)), float(np.mean(draws >= null)))
