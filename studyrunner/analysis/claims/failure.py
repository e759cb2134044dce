"""Claims on failure rates, decided by exact tests that hold their level on any number of seeds: against a
number the binomial test (Clopper-Pearson bounds); between two sides exact McNemar over shared seeds (one
cell a side), else Fisher's exact test (conditional odds-ratio bounds).
"""

from __future__ import annotations

import math

import pandas as pd
from scipy import stats as sps

from .verdict import MalformedClaim, Verdict, conclude, shifted


def failure_rate_vs_number(v: Verdict, rows: pd.DataFrame, greater: bool, c: float) -> Verdict:
    """failure_rate OP c: exact one-sided binomial tests of k failures in n seeds against rate c."""
    if not 0 <= c <= 1:
        raise MalformedClaim(f"a failure rate is a share in [0, 1]: compare it with a number in [0, 1], not {c:g}")
    k, n = int(rows.failed.sum()), len(rows)
    up, down = sps.binomtest(k, n, c, "greater").pvalue, sps.binomtest(k, n, c, "less").pvalue
    v.lhs = k / n
    lo, hi = _clopper_pearson(k, n, v.alpha)
    shifted(v, {"lo": lo, "hi": hi}, c)
    v.test = "exact binomial test (Clopper-Pearson bounds)"
    v.seeds = (n,)
    cells = rows.cell_hash.nunique()
    v.extra["design"] = {"test": "binomial", "k": k, "n": n, "null": c, "greater": greater, "cells": cells}
    conclude(v, greater, up, down)
    v.detail = f"{k}/{n} seeds failed; one-sided p={v.p:.3g}"
    return v


def _clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """The one-sided (1 − alpha) Clopper-Pearson bounds of k/n: they invert the exact binomial test, so
    the lower bound exceeds c exactly when binomtest(k, n, c, "greater") gives p < alpha."""
    lo = 0.0 if k == 0 else float(sps.beta.ppf(alpha, k, n - k + 1))
    hi = 1.0 if k == n else float(sps.beta.ppf(1 - alpha, k + 1, n - k))
    return lo, hi


def failure_rates(v: Verdict, a_rows: pd.DataFrame, b_rows: pd.DataFrame, greater: bool) -> Verdict:
    """failure_rate[a] OP failure_rate[b]: one-sided exact tests. One cell a side sharing seeds: exact
    McNemar (a binomial test on the discordant seeds); otherwise Fisher's exact test."""
    k1, n1, k2, n2 = int(a_rows.failed.sum()), len(a_rows), int(b_rows.failed.sum()), len(b_rows)
    v.lhs, v.rhs = k1 / n1, k2 / n2
    v.estimate = v.lhs - v.rhs
    pairs = _paired_failures(a_rows, b_rows)
    if pairs is not None:
        only_a, only_b = int((pairs.a & ~pairs.b).sum()), int((~pairs.a & pairs.b).sum())
        m, n = only_a + only_b, len(pairs)
        up = sps.binomtest(only_a, m, 0.5, "greater").pvalue if m else 1.0
        down = sps.binomtest(only_a, m, 0.5, "less").pvalue if m else 1.0
        # the exact conditional interval: only_a ~ Binomial(m, π) given m discordant seeds, and the rate
        # difference is (m/n)·(2π − 1) given m, so π's Clopper-Pearson bounds map onto it (lo > 0 iff π > 1/2)
        p_lo, p_hi = _clopper_pearson(only_a, m, v.alpha) if m else (math.nan, math.nan)
        v.estimate = (only_a - only_b) / n
        v.lo, v.hi = m / n * (2 * p_lo - 1), m / n * (2 * p_hi - 1)
        v.seeds = (n, n)
        v.test = "exact McNemar test over shared seeds (exact conditional bounds given the discordant seeds)"
        v.extra["design"] = {"test": "mcnemar", "only_a": only_a, "only_b": only_b, "n": n, "greater": greater}
        conclude(v, greater, up, down)
        v.detail = (
            f"{k1}/{n1} vs {k2}/{n2} failed; {n} shared seeds, {only_a} fail only a, {only_b} only b; "
            f"one-sided p={v.p:.3g}" + ("; no seed fails on one side only: nothing to test" if not m else "")
        )
        return v
    from scipy.stats.contingency import odds_ratio

    table = [[k1, n1 - k1], [k2, n2 - k2]]
    up, down = sps.fisher_exact(table, "greater").pvalue, sps.fisher_exact(table, "less").pvalue
    ratio = odds_ratio(table, kind="conditional")
    ci = ratio.confidence_interval(1 - 2 * v.alpha)
    v.scale = "odds ratio"
    v.estimate, v.lo, v.hi = float(ratio.statistic), float(ci.low), float(ci.high)
    v.seeds = (n1, n2)
    v.test = "Fisher's exact test (exact conditional odds-ratio bounds)"
    cells = max(a_rows.cell_hash.nunique(), b_rows.cell_hash.nunique())
    v.extra["design"] = {"test": "fisher", "k1": k1, "n1": n1, "k2": k2, "n2": n2, "greater": greater, "cells": cells}
    conclude(v, greater, up, down)
    v.detail = (
        f"{k1}/{n1} vs {k2}/{n2} failed; rate difference {v.lhs - v.rhs:+.3g}; conditional odds ratio "
        f"{v.estimate:.3g}; Fisher exact one-sided p={v.p:.3g}"
    )
    return v


def _paired_failures(a_rows: pd.DataFrame, b_rows: pd.DataFrame) -> pd.DataFrame | None:
    """One cell a side with the same seeds: (a failed, b failed) per seed; else None (unpaired)."""
    if a_rows.cell_hash.nunique() != 1 or b_rows.cell_hash.nunique() != 1:
        return None
    if a_rows.cell_hash.iloc[0] == b_rows.cell_hash.iloc[0] or set(a_rows.seed) != set(b_rows.seed):
        return None
    a = a_rows.set_index("seed").failed.astype(bool).rename("a")
    b = b_rows.set_index("seed").failed.astype(bool).rename("b")
    return pd.concat([a, b], axis=1, join="inner")
