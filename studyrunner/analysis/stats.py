"""Seed statistics: per-cell summaries, failure rates, bimodality, paired comparisons, time to solve.

Following shared/reference/anchors_platforms.md §4: mean ± sd (ddof=1) with n, a 95% t-interval, the
median, the IQM (`scipy.stats.trim_mean(x, 0.25)`) with Yuen's trimmed-mean t-interval, the failure rate
with a Wilson interval (statsmodels), and the success-conditional mean beside (never instead of) the
unconditional one.

Bootstrap intervals (BCa of the mean, the paired bootstrap) are given only from MIN_BOOTSTRAP_SEEDS seeds:
with 2 seeds a resample can only return the two values, so the "interval" is [min, max] and covered the
true mean 48% of the time, and BCa at 3-5 seeds undercovers too (`python -m benchmarks coverage`). The
t-based intervals hold their level at 2-5 seeds when the seeds' spread is roughly normal.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from ..store.status import FINISHED
from .data import StudyData

CONFIDENCE = 0.95
N_RESAMPLES = 2000
SEED = 0  # bootstrap RNG seed: the same ledger gives the same intervals
MIN_BOOTSTRAP_SEEDS = 10  # fewer seeds: bootstrap intervals are not reported (see the module docstring)
IQM_TRIM = 0.25
BIMODAL_SEPARATION = 4.0  # gap between seed clusters, in units of their spread, that counts as bimodal
BIMODAL_FLOOR = 0.05  # spread is at least this fraction of the metric's scale (max |value|, range)
BIMODAL_GAP = 0.3  # verify: the clusters' gap is at least this fraction of the metric's scale
VERIFY_SEPARATION = 6.0  # verify: and at least this many times their spread


def _clean(values) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    return x[np.isfinite(x)]


def one_sided_t(estimate: float, se: float, df: float, alpha: float, null: float = 0.0) -> dict[str, float]:
    """The t-test of `estimate` (standard error `se`, `df` degrees of freedom) against `null`, both ways:
    {lo, hi, p_up, p_down}: p_up is the one-sided p of "greater than null", p_down of "less", and [lo, hi]
    the two one-sided (1 − alpha) bounds (a two-sided 1 − 2·alpha interval), so lo > null exactly when
    p_up < alpha. NaN without a finite se and df; a zero se gives a point (p 0 or 1)."""
    nan = {"lo": math.nan, "hi": math.nan, "p_up": math.nan, "p_down": math.nan}
    if not (np.isfinite(estimate) and np.isfinite(se) and np.isfinite(df)) or df <= 0:
        return nan
    if se <= 0:
        above, below = estimate > null, estimate < null
        return {"lo": estimate, "hi": estimate, "p_up": 0.0 if above else 1.0, "p_down": 0.0 if below else 1.0}
    half = stats.t.ppf(1 - alpha, df) * se
    t = (estimate - null) / se
    return {
        "lo": estimate - half,
        "hi": estimate + half,
        "p_up": float(stats.t.sf(t, df)),
        "p_down": float(stats.t.cdf(t, df)),
    }


def t_interval(values, confidence: float = CONFIDENCE) -> tuple[float, float]:
    x = _clean(values)
    if len(x) < 2:
        return (math.nan, math.nan)
    half = stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return (float(x.mean() - half), float(x.mean() + half))


def _trimmed(x: np.ndarray) -> tuple[float, float, int, int]:
    """(trimmed mean, winsorised variance, n, h) of sorted values, trimming floor(n/4) a side as
    `trim_mean` does (scipy's `mstats.trimmed_mean_ci` rounds instead)."""
    n = len(x)
    g = int(IQM_TRIM * n)
    winsorised = np.clip(x, x[g], x[n - g - 1])
    return float(stats.trim_mean(x, IQM_TRIM)), float(winsorised.var(ddof=1)), n, n - 2 * g


def yuen_one(values) -> tuple[float, float, float]:
    """(IQM, se, df) of one sample: Yuen's trimmed t with the winsorised variance, se² = (n − 1)·s_w² /
    (h·(h − 1)) for the h values kept, on h − 1 degrees of freedom (the one-sample form of Yuen's
    two-sample d_j, as `yuen_two` and `scipy.stats.ttest_ind(trim=)` use; Wilcox, "Introduction to Robust
    Estimation and Hypothesis Testing", 4.4 and 5.3). Trimming is floor(n/4) a side, as `trim_mean` does;
    below 4 values nothing is trimmed and it is the t-test.

    Why not Tukey-McLaughlin's s_w / ((1 − 2γ)·√n), Wilcox's `trimci` (narrower by a factor
    √(h(n − 1) / (n(h − 1))), 1.22 at n = 4): by simulation (20,000 normal samples, one-sided 0.05) it
    rejects a true null 7.2% of the time at n = 4, 6.7% at 5, 6.5-6.7% at 6-12 (t with 3 df: 6.8% at 4),
    where this form rejects 5.9%, 5.8%, 5.5-5.9% (t3: 5.6%): neither is exact at these n, this one is
    nearer its level, which is what a claim's verdict rests on."""
    x = np.sort(_clean(values))
    if len(x) < 2:
        return (math.nan, math.nan, math.nan)
    centre, var_w, n, h = _trimmed(x)
    if h < 2:
        return (centre, math.nan, math.nan)
    se = math.sqrt((n - 1) * var_w / (h * (h - 1)))
    return (centre, se, float(h - 1))


def yuen_two(a, b) -> tuple[float, float, float]:
    """(IQM(a) − IQM(b), se, df) of Yuen's two-sample trimmed t (Wilcox 5.3; `scipy.stats.ttest_ind(
    trim=0.25, equal_var=False)` gives the same t and df): d_j = (n_j − 1)·s_wj² / (h_j·(h_j − 1)),
    se = √(d_a + d_b), Welch-Satterthwaite df on h_j − 1."""
    a, b = np.sort(_clean(a)), np.sort(_clean(b))
    if len(a) < 2 or len(b) < 2:
        return (math.nan, math.nan, math.nan)
    (ca, va, na, ha), (cb, vb, nb, hb) = _trimmed(a), _trimmed(b)
    if ha < 2 or hb < 2:
        return (ca - cb, math.nan, math.nan)
    da, db = (na - 1) * va / (ha * (ha - 1)), (nb - 1) * vb / (hb * (hb - 1))
    se = math.sqrt(da + db)
    denom = da**2 / (ha - 1) + db**2 / (hb - 1)
    df = (da + db) ** 2 / denom if denom > 0 else float(ha + hb - 2)
    return (ca - cb, se, float(df))


def yuen_interval(values, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Yuen's t-interval of the interquartile (25%-trimmed) mean (`yuen_one`). Below 4 values nothing is
    trimmed and it is the t-interval of the mean."""
    centre, se, df = yuen_one(values)
    if not (np.isfinite(se) and np.isfinite(df)):
        return (math.nan, math.nan)
    half = stats.t.ppf(0.5 + confidence / 2, df) * se
    return (float(centre - half), float(centre + half))


def median_interval(values, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Distribution-free interval of the median from order statistics (`scipy.stats.quantile_test`);
    below 6 values no pair of order statistics reaches 95%, and the interval is infinite."""
    x = _clean(values)
    if not len(x):
        return (math.nan, math.nan)
    ci = stats.quantile_test(x, q=float(np.median(x)), p=0.5).confidence_interval(confidence)
    return (float(ci.low) if np.isfinite(ci.low) else -math.inf, float(ci.high) if np.isfinite(ci.high) else math.inf)


def bca_interval(
    values, statistic: Callable = np.mean, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES
) -> tuple[float, float]:
    """BCa bootstrap interval (scipy); NaN below MIN_BOOTSTRAP_SEEDS values or without spread."""
    x = _clean(values)
    if len(x) < MIN_BOOTSTRAP_SEEDS or np.ptp(x) == 0:
        return (math.nan, math.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.bootstrap(
            (x,),
            statistic,
            confidence_level=confidence,
            n_resamples=n_resamples,
            method="BCa",
            vectorized=True,
            rng=np.random.default_rng(SEED),
        )
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


def iqm(values, axis=None) -> float | np.ndarray:
    """Interquartile mean: `scipy.stats.trim_mean(x, 0.25)` (rliable's IQM); along `axis` for 2-D input."""
    if axis is not None:
        return stats.trim_mean(values, 0.25, axis=axis)
    x = _clean(values)
    return float(stats.trim_mean(x, 0.25)) if len(x) else math.nan


def stratified_bootstrap(
    groups: Sequence[Sequence[float]],
    statistic: Callable = np.mean,
    confidence: float = CONFIDENCE,
    n_resamples: int = N_RESAMPLES,
) -> tuple[float, float]:
    """Percentile interval of `statistic` over the pooled values, resampling within each group (stratum),
    as rliable does across tasks. `statistic(matrix, axis=-1)` is applied to all resamples at once.
    NaN when no group has two values."""
    draws = bootstrap_draws(groups, statistic, n_resamples)
    if draws is None:
        return (math.nan, math.nan)
    alpha = (1 - confidence) / 2
    return (float(np.quantile(draws, alpha)), float(np.quantile(draws, 1 - alpha)))


def bootstrap_draws(groups, statistic: Callable = np.mean, n_resamples: int = N_RESAMPLES, rng=None):
    """`n_resamples` values of `statistic` over stratified resamples of `groups` (None if nothing varies)."""
    groups = [_clean(g) for g in groups]
    groups = [g for g in groups if len(g)]
    if not groups or all(len(g) < 2 for g in groups):
        return None
    rng = rng if rng is not None else np.random.default_rng(SEED)
    matrix = np.concatenate([g[rng.integers(0, len(g), (n_resamples, len(g)))] for g in groups], axis=1)
    return np.asarray(statistic(matrix, axis=-1), dtype=float)


def wilson(failures: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of failures/n (statsmodels)."""
    from statsmodels.stats.proportion import proportion_confint

    if n == 0:
        return (math.nan, math.nan)
    lo, hi = proportion_confint(failures, n, alpha=1 - confidence, method="wilson")
    # exact ends where the interval touches them (statsmodels leaves float noise such as 5.6e-17)
    return (0.0 if failures == 0 else float(lo), 1.0 if failures == n else float(hi))


def bimodality(
    values, scale: float | None = None, min_gap: float = 0.0, separation: float | None = None
) -> tuple[bool, float]:
    """(flag, separation): seeds split into two clusters whose gap is at least BIMODAL_SEPARATION times
    their spread (and at least `min_gap`). The spread is the pooled within-cluster sd, floored at
    BIMODAL_FLOOR x `scale` (default: the largest |value| or range of these values), so three seeds at
    57.4, 57.4, 54.4 are one mode while 55.5, 55.8, 5.4 are two. Needs 3 seeds. Normal seeds pass the
    separation alone often at 3-5 seeds (half the time at 3 when the floor is below their sd), so `verify`
    asks for more (VERIFY_SEPARATION, and a gap of BIMODAL_GAP x the metric's scale, as between seeds at
    chance and seeds that learned): normal seeds with an sd of a sixth of the scale are flagged at most 10%
    of the time at 3 seeds (1% at a twentieth), seeds at chance beside seeds at 0.9 99% of the time."""
    x = np.sort(_clean(values))
    if len(x) < 3:
        return (False, math.nan)
    scale = scale if scale is not None else max(np.abs(x).max(), np.ptp(x))
    floor = BIMODAL_FLOOR * scale if scale > 0 else 0.0
    best = 0.0
    for i in range(1, len(x)):
        lo, hi = x[:i], x[i:]
        ss = ((lo - lo.mean()) ** 2).sum() + ((hi - hi.mean()) ** 2).sum()
        spread = max(math.sqrt(ss / max(len(x) - 2, 1)), floor)
        if spread == 0 or hi[0] - lo[-1] < min_gap:
            continue
        best = max(best, (hi[0] - lo[-1]) / spread)
    return (bool(best >= (separation or BIMODAL_SEPARATION)), float(best))


def describe(values, scale: float | None = None) -> dict[str, float]:
    """Seed summary of one cell's values (NaN for what needs more seeds)."""
    x = _clean(values)
    n = len(x)
    t_lo, t_hi = t_interval(x)
    bca_lo, bca_hi = bca_interval(x)
    iqm_lo, iqm_hi = yuen_interval(x)
    flag, separation = bimodality(x, scale)
    return {
        "n": n,
        "mean": float(x.mean()) if n else math.nan,
        "sd": float(x.std(ddof=1)) if n > 1 else math.nan,
        "t_lo": t_lo,
        "t_hi": t_hi,
        "bca_lo": bca_lo,
        "bca_hi": bca_hi,
        "median": float(np.median(x)) if n else math.nan,
        "iqm": iqm(x),
        "iqm_lo": iqm_lo,
        "iqm_hi": iqm_hi,
        "min": float(x.min()) if n else math.nan,
        "max": float(x.max()) if n else math.nan,
        "bimodal": flag,
        "separation": separation,
    }


def metric_scale(data: StudyData, metric: str) -> float | None:
    """The metric's scale over the whole study (for the bimodality floor)."""
    if metric not in data.trials:
        return None
    x = _clean(data.done[metric])
    return float(max(np.abs(x).max(), np.ptp(x))) if len(x) else None


def cell_stats(data: StudyData, metric: str | None = None) -> pd.DataFrame:
    """One row per cell: seed statistics of `metric` (default: the study metric), failures and missing.

    `mean` is over every finished seed that reported the metric (failures included); `mean_success` over
    the seeds that did not fail. Trials still pending or running count in `missing`."""
    metric = metric or data.metric
    scale = metric_scale(data, metric)
    rows = []
    for cell_hash in data.cells_order:
        trials = data.trials[data.trials.cell_hash == cell_hash]
        if trials.empty:
            continue
        done = trials[trials.status.isin(FINISHED)]
        values = done[metric] if metric in done else pd.Series(dtype=float)
        failures, n_done = int(done.failed.sum()), len(done)
        lo, hi = wilson(failures, n_done)
        success = values[~done.failed] if len(values) else values
        row = {
            "cell": trials.cell.iloc[0],
            "cell_hash": cell_hash,
            "baseline": trials.baseline.iloc[0],
            "depth": float(trials.depth.median()) if trials.depth.notna().any() else math.nan,
            **describe(values, scale),
            "seeds_done": n_done,
            "failures": failures,
            "failure_rate": failures / n_done if n_done else math.nan,
            "failure_lo": lo,
            "failure_hi": hi,
            "mean_success": float(_clean(success).mean()) if len(_clean(success)) else math.nan,
            "n_success": len(_clean(success)),
            "missing": int((~trials.status.isin(FINISHED)).sum()),
        }
        rows.append(row)
    return pd.DataFrame(rows)


# --- paired comparisons ---------------------------------------------------------------------------


def probability_of_improvement(a, b) -> float:
    """P(a > b) + P(a = b)/2 over all pairs of seeds (rliable's definition, via Mann-Whitney U)."""
    a, b = _clean(a), _clean(b)
    if not len(a) or not len(b):
        return math.nan
    u = stats.mannwhitneyu(a, b, alternative="two-sided").statistic
    return float(u / (len(a) * len(b)))


def paired_difference(a: pd.Series, b: pd.Series, confidence: float = CONFIDENCE) -> dict[str, float]:
    """a, b indexed by seed: the difference a - b over shared seeds, with a paired t-interval and, from
    MIN_BOOTSTRAP_SEEDS pairs, a paired BCa bootstrap interval (NaN below: it would not hold its level)."""
    both = pd.concat([a.rename("a"), b.rename("b")], axis=1, join="inner").dropna()
    d = (both.a - both.b).to_numpy(float)
    n = len(d)
    out = {
        "pairs": n,
        "diff": float(d.mean()) if n else math.nan,
        "p_improve": probability_of_improvement(both.a, both.b),
    }
    out["wins"] = float((d > 0).mean()) if n else math.nan
    out["t_lo"], out["t_hi"] = t_interval(d, confidence)
    out["boot_lo"], out["boot_hi"] = bca_interval(d, confidence=confidence)
    return out


def seed_difference(a: pd.Series, b: pd.Series, confidence: float = CONFIDENCE) -> dict | None:
    """mean(a) − mean(b) for values indexed by seed, by the rule every two-sample comparison here follows
    (a two-depth slope, looped vs stacked, a pairwise claim): the paired t over the seeds both share when
    2+ are shared (same seed, same initialisation and data), else Welch's t over all seeds of each.
    {diff, df, lo, hi, method}; None when neither gives an interval (Welch: 2+ values a side, some spread)."""
    a, b = a.dropna(), b.dropna()
    shared = a.index.intersection(b.index)
    if a.index.is_unique and b.index.is_unique and len(shared) >= 2:
        d = (a[shared] - b[shared]).to_numpy(float)
        diff, df = float(d.mean()), float(len(d) - 1)
        half = stats.t.ppf(0.5 + confidence / 2, df) * float(d.std(ddof=1)) / math.sqrt(len(d))
        lo, hi, method = diff - half, diff + half, f"paired t ({len(d)} seeds)"
    else:
        va, vb = _clean(a), _clean(b)
        if len(va) < 2 or len(vb) < 2 or (np.ptp(va) == 0 and np.ptp(vb) == 0):
            return None
        res = stats.ttest_ind(va, vb, equal_var=False)
        ci = res.confidence_interval(confidence)
        diff, df, lo, hi = float(va.mean() - vb.mean()), float(res.df), float(ci.low), float(ci.high)
        method = f"Welch t ({len(a)} vs {len(b)} seeds)"
    return {"diff": diff, "df": df, "lo": lo, "hi": hi, "method": method}


def paired_comparisons(data: StudyData, metric: str | None = None, limit: int = 200) -> pd.DataFrame:
    """Cells that differ in one axis (or a baseline and its looped cell), compared over shared seeds."""
    metric = metric or data.metric
    done = data.done
    if metric not in done or done.empty:
        return pd.DataFrame()
    cells = done.drop_duplicates("cell_hash").set_index("cell_hash")
    axes = data.varied_columns
    baseline_of = {h: str(cells.loc[h, "baseline_of"] or "") for h in cells.index}
    rows = []
    order = [h for h in data.cells_order if h in cells.index]
    for h1, h2 in itertools.combinations(order, 2):
        differ = [c for c in axes if str(cells.loc[h1, c]) != str(cells.loc[h2, c])]
        linked = h1 in baseline_of[h2] or h2 in baseline_of[h1]
        if len(differ) != 1 and not linked:
            continue
        a = done[done.cell_hash == h1].set_index("seed")[metric]
        b = done[done.cell_hash == h2].set_index("seed")[metric]
        res = paired_difference(b, a)  # second cell minus first, over shared seeds, in metric units
        if data.mode == "min":  # "better" follows the study's direction
            res["p_improve"] = paired_difference(-b, -a)["p_improve"]
        rows.append(
            {
                "cell_a": cells.loc[h1, "cell"],
                "cell_b": cells.loc[h2, "cell"],
                "differs_in": ", ".join(c.rsplit(".", 1)[-1] for c in differ) or "baseline",
                "pairs": res["pairs"],
                "diff_b_minus_a": res["diff"],
                "t_lo": res["t_lo"],
                "t_hi": res["t_hi"],
                "boot_lo": res["boot_lo"],
                "boot_hi": res["boot_hi"],
                "p_b_better": res["p_improve"],
            }
        )
        if len(rows) >= limit:
            break
    return pd.DataFrame(rows)


def performance_profile(data: StudyData, metric: str | None = None, taus: np.ndarray | None = None) -> pd.DataFrame:
    """Fraction of each cell's seeds whose metric is above tau (below, for mode min), over a tau grid."""
    metric = metric or data.metric
    done = data.done
    if metric not in done or done[metric].dropna().empty:
        return pd.DataFrame()
    x = done[metric].dropna()
    taus = taus if taus is not None else np.linspace(x.min(), x.max(), 101)
    out = {"tau": taus}
    for cell_hash in data.cells_order:
        values = _clean(done.loc[done.cell_hash == cell_hash, metric])
        if not len(values):
            continue
        label = done.loc[done.cell_hash == cell_hash, "cell"].iloc[0]
        out[label] = [(values > t).mean() if data.mode == "max" else (values < t).mean() for t in taus]
    return pd.DataFrame(out)
