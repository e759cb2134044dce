"""`studyrunner verify`: each declared claim evaluated with a suitable test and a 95% interval.

A claim compares two sides (see `studyrunner.study.claims_grammar` for the grammar). The verdict comes
from an interval of the difference lhs − rhs (or of the one quantity against a number), except for
failure rates, which are decided by exact one-sided tests (below):

- **supported**: the whole interval lies on the claimed side of 0;
- **contradicted**: the whole interval lies on the other side;
- **inconclusive**: the interval straddles 0, or there are too few seeds for an interval.

Tests per quantity:

| quantity | against a number | against the same quantity |
|---|---|---|
| metric mean | t-interval of the mean | paired t over shared seeds (one cell a side, 2+ shared), else Welch |
| iqm | Yuen's trimmed-mean t-interval | Yuen's two-sample trimmed t |
| median | order-statistic interval (infinite below 6 seeds) | stratified bootstrap, from 10 seeds a side |
| failure_rate | exact binomial test (Wilson interval shown) | exact McNemar, else Fisher's exact (Newcombe shown) |
| slope | the fit's CR2 t-interval by seed (`fits`; two x values: the pairwise one) | CR2 t of the interaction |

Failure-rate tests are one-sided. McNemar (a binomial test on the seeds where exactly one side failed) is
used when each side is one cell and both have the same seeds (same seed = same init and data); Fisher's
exact test otherwise.

A failure-rate claim is **supported** when the one-sided p in the claimed direction is < 0.05,
**contradicted** when the one-sided p in the opposite direction is < 0.05, else inconclusive; `p` is the
one-sided p in the direction the verdict took (the claimed one when inconclusive). Every other claim's `p`
is its test's two-sided p where it has one (a t-test, < 0.05 exactly when its interval excludes 0), NaN for
bootstrap intervals. `verify(..., holm=True)` adds Holm-adjusted p-values over the claims that have one:
a supported or contradicted claim whose adjusted p is >= 0.05 is inconclusive after adjustment.

Slope claims fit every finished seed with a value (failed seeds at their recorded metric); seeds without a
finite value (diverged) are dropped and counted in the detail. A claim whose evidence rests on fewer than
3 seeds a side says so in its detail.

**pending** (a study still running): a claim one of whose sides selects a trial that has not finished
(pending or running) is `pending`, whatever its finished seeds say so far, and never fails `verify`.
Where the finished seeds already allow it, the claim is still evaluated on them and the detail reads
"pending: N trials unfinished; supported on the finished seeds so far" (the interval is shown); where
they do not (no finished trial selected yet), the detail is "pending: N trials unfinished". The reading
chosen: a verdict is only final once every seed it rests on is in, so an early contradiction does not
fail a CI run mid-study, and an early support is not taken as final.

A claim that names a field the study does not have, or selects no trial at all, is `invalid`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats as sps

from ..errors import StudyrunnerError
from ..study.claims_grammar import Claim, GrammarError, Number, Quantity, parse_claim
from . import fits, robust
from .data import StudyData
from .stats import (
    CONFIDENCE,
    MIN_BOOTSTRAP_SEEDS,
    N_RESAMPLES,
    SEED,
    bootstrap_draws,
    iqm,
    median_interval,
    t_interval,
    wilson,
    yuen_difference,
    yuen_interval,
)

SUPPORTED, CONTRADICTED, INCONCLUSIVE, INVALID = "supported", "contradicted", "inconclusive", "invalid"
PENDING = "pending"
ALPHA = 1 - CONFIDENCE  # a test's p below this decides a claim (0.05)
FEW_SEEDS = 3  # fewer seeds a side than this: the detail says so


@dataclass
class Verdict:
    claim: str
    verdict: str
    estimate: float = math.nan  # lhs - rhs (or lhs when rhs is a number: lhs - number)
    lo: float = math.nan
    hi: float = math.nan
    lhs: float = math.nan
    rhs: float = math.nan
    test: str = ""
    detail: str = ""
    extra: dict = field(default_factory=dict)
    # The test's p-value: two-sided for a t-interval (it is < 0.05 exactly when the interval excludes 0),
    # one-sided in the direction the verdict took for failure rates; NaN where the test gives none.
    p: float = math.nan
    # Seeds (values) each side's evidence rests on (paired: the shared seeds); () until counted.
    seeds: tuple[int, ...] = ()
    unfinished: int = 0  # trials the claim's sides select that have not finished
    # Holm's step-down adjustment over the study's claims (`verify(..., holm=True)`); NaN / "" otherwise.
    p_holm: float = math.nan
    verdict_holm: str = ""

    def row(self, holm: bool = False) -> dict:
        row = {
            "claim": self.claim,
            "verdict": self.verdict,
            "lhs": self.lhs,
            "rhs": self.rhs,
            "difference": self.estimate,
            "lo": self.lo,
            "hi": self.hi,
            "p": self.p,
            "test": self.test,
            "detail": self.detail,
        }
        if holm:
            row["p_holm"], row["verdict_holm"] = self.p_holm, self.verdict_holm
        return row


class _Invalid(Exception):
    pass


class _Malformed(_Invalid):
    """A claim no further trial can make answerable (invalid even while trials are unfinished)."""


def _decide(op: str, lo: float, hi: float) -> str:
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return INCONCLUSIVE
    greater = op in (">", ">=")
    if (lo > 0) if greater else (hi < 0):
        return SUPPORTED
    if (hi < 0) if greater else (lo > 0):
        return CONTRADICTED
    return INCONCLUSIVE


def _rows(data: StudyData, q: Quantity) -> pd.DataFrame:
    try:
        rows = data.select(q.selector)
    except StudyrunnerError as exc:
        raise _Invalid(str(exc)) from None
    if rows.empty:
        what = ", ".join(f"{k}={v}" for k, v in q.selector) or "the study"
        raise _Invalid(f"no finished trial matches [{what}]")
    if q.metric and q.kind != "slope" and q.metric not in rows:
        raise _Invalid(f"no trial reported {q.metric!r}")
    return rows


def _values_by_cell(rows: pd.DataFrame, metric: str) -> list[np.ndarray]:
    return [g[metric].dropna().to_numpy(float) for _, g in rows.groupby("cell_hash", sort=False)]


def _point(kind: str, values: np.ndarray) -> float:
    if not len(values):
        return math.nan
    return float(_STATISTICS[kind](values))


_STATISTICS = {"mean": np.mean, "median": np.median, "iqm": iqm}


def _boot_draws(groups: list[np.ndarray], kind: str, rng: np.random.Generator, n: int = N_RESAMPLES) -> np.ndarray:
    return bootstrap_draws(groups, _STATISTICS[kind], n, rng)


def _percentile(draws: np.ndarray) -> tuple[float, float]:
    a = (1 - CONFIDENCE) / 2
    return float(np.quantile(draws, a)), float(np.quantile(draws, 1 - a))


def _slope_fit(data: StudyData, q: Quantity, rows: pd.DataFrame):
    if q.x in ("effective_depth", "depth", "D"):
        x = rows["depth"]
    else:
        try:
            column = data.column_for(q.x)
        except StudyrunnerError as exc:
            raise _Invalid(str(exc)) from None
        x = pd.to_numeric(rows[column], errors="coerce")
    if q.metric not in rows:
        raise _Invalid(f"no trial reported {q.metric!r}")
    # every finished seed with a value, failed ones included (a failed seed's metric is its outcome);
    # a seed without a finite value (diverged: NaN) has nothing to fit and is dropped (the detail counts it)
    ok = rows[np.isfinite(pd.to_numeric(rows[q.metric], errors="coerce").astype(float))]
    x, y = x.loc[ok.index].to_numpy(float), ok[q.metric].to_numpy(float)
    if not q.log_x:
        x = x - np.nanmin(x) + 1.0 if len(x) else x  # positive, as fits take it; the slope is unchanged
    elif np.any(x <= 0):
        raise _Invalid(f"ln {q.x} needs positive values")
    seeds = ok["seed"].to_numpy()
    f = fits.fit(x, y, "loglinear" if q.log_x else "linear", extrapolate=False, clusters=seeds)
    if f is None:
        raise _Invalid(f"slope needs seeds with a value at 2+ distinct values of {q.x}")
    return f


def evaluate(data: StudyData, claim: Claim | str) -> Verdict:
    """Evaluate one claim on a study's finished trials (`pending` while a trial it selects is unfinished)."""
    text = claim if isinstance(claim, str) else claim.text
    try:
        claim = parse_claim(claim) if isinstance(claim, str) else claim
        unfinished = sum(_unfinished(data, q) for q in claim.quantities)
    except GrammarError as exc:
        return Verdict(text, INVALID, detail=str(exc))
    except _Invalid as exc:
        return Verdict(text, INVALID, detail=str(exc))
    try:
        v = _evaluate(data, claim)
    except _Invalid as exc:
        if not unfinished or isinstance(exc, _Malformed):
            return Verdict(text, INVALID, detail=str(exc))
        # nothing to evaluate yet (no finished trial, or none reported the metric): wait for the rest
        return Verdict(
            text, PENDING, detail=f"pending: {unfinished} trials unfinished ({exc} so far)", unfinished=unfinished
        )
    if not v.seeds:
        v.seeds = tuple(_seeds_used(data, q) for q in claim.quantities)
    notes = [v.detail] if v.detail else []
    dropped = sum(_seeds_dropped(data, q) for q in claim.quantities if q.kind == "slope")
    if dropped:
        notes.append(f"{dropped} seeds dropped: no value (diverged)")
    if v.seeds and min(v.seeds) < FEW_SEEDS:
        few = min(v.seeds)
        if any(q.kind == "failure_rate" for q in claim.quantities):
            notes.append(f"{few} seeds per side: an exact test on so few seeds can hardly reach p < {ALPHA:g}")
        else:
            notes.append(
                f"{few} seeds per side: an interval from fewer than {FEW_SEEDS} seeds is wide and rests on normality"
            )
    if unfinished:
        v.extra["interim"] = v.verdict
        notes.insert(0, f"pending: {unfinished} trials unfinished; {v.verdict} on the finished seeds so far")
        v.verdict, v.unfinished = PENDING, unfinished
    v.detail = "; ".join(notes)
    return v


def _unfinished(data: StudyData, q: Quantity) -> int:
    """Trials `q` selects that have not finished (pending or running)."""
    try:
        rows = data.select(q.selector, frame=data.trials)
    except StudyrunnerError as exc:
        raise _Invalid(str(exc)) from None
    return int((~rows.index.isin(data.done.index)).sum())


def _metric_values(data: StudyData, q: Quantity) -> pd.Series:
    rows = data.select(q.selector)
    if q.metric is None or q.metric not in rows:
        return pd.Series(dtype=float)
    return pd.to_numeric(rows[q.metric], errors="coerce").astype(float)


def _seeds_used(data: StudyData, q: Quantity) -> int:
    """How many seeds (values) a side's evidence rests on: finished trials for a failure rate, the distinct
    seeds with a finite value for a slope, else the finished trials with a finite value of the metric."""
    if q.kind == "failure_rate":
        return len(data.select(q.selector))
    values = _metric_values(data, q)
    if q.kind == "slope":  # a slope's evidence is its seeds (its clusters), not its points
        return int(data.select(q.selector).loc[np.isfinite(values).to_numpy(), "seed"].nunique())
    return int(np.isfinite(values).sum())


def _seeds_dropped(data: StudyData, q: Quantity) -> int:
    values = _metric_values(data, q)
    return int((~np.isfinite(values)).sum())


def _flip(op: str) -> str:
    return {"<": ">", ">": "<", "<=": ">=", ">=": "<="}[op]


def _evaluate(data: StudyData, claim: Claim) -> Verdict:
    lhs, op, rhs = claim.lhs, claim.op, claim.rhs
    if isinstance(lhs, Number):  # `0.5 < x` is `x > 0.5`
        lhs, op, rhs = rhs, _flip(op), lhs
    v = Verdict(claim.text, INCONCLUSIVE)
    rng = np.random.default_rng(SEED)
    if isinstance(rhs, Number):
        c = rhs.value
        v.rhs = c
        if lhs.kind == "failure_rate":
            return _failure_rate_vs_number(v, _rows(data, lhs), op, c)
        if lhs.kind == "slope":
            f = _slope_fit(data, lhs, _rows(data, lhs))
            v.lhs = f.params["alpha"]
            lo, hi = f.param_ci.get("alpha", (math.nan, math.nan))
            v.p = robust.param_test(f, "alpha", c)["p"]
            v.test = f"{'log-' if lhs.log_x else ''}linear fit, {f.ci_method or 'no interval'}"
            v.detail = f"alpha={f.params['alpha']:.4g}, R2={f.r2:.3f}, n={f.n}"
        else:
            rows = _rows(data, lhs)
            groups = _values_by_cell(rows, lhs.metric)
            values = np.concatenate(groups) if groups else np.empty(0)
            v.lhs = _point(lhs.kind, values)
            if lhs.kind == "mean":
                lo, hi = t_interval(values)
                v.test = "t-interval of the mean"
                v.p = _ttest_p(values, c)
            elif lhs.kind == "iqm":
                lo, hi = yuen_interval(values)
                v.test = "Yuen trimmed-mean t-interval of the IQM"
            else:
                lo, hi = median_interval(values)
                v.test = "order-statistic interval of the median (distribution-free; infinite below 6 seeds)"
            v.detail = f"n={len(values)} seeds in {len(groups)} cell(s)"
        v.estimate, v.lo, v.hi = v.lhs - c, lo - c, hi - c
        v.verdict = _decide(op, v.lo, v.hi)
        return v

    # quantity vs quantity
    if lhs.kind != rhs.kind and not (lhs.kind in ("mean", "median", "iqm") and rhs.kind in ("mean", "median", "iqm")):
        raise _Malformed(f"cannot compare {lhs.kind} with {rhs.kind}")
    a_rows, b_rows = _rows(data, lhs), _rows(data, rhs)
    if lhs.kind == "failure_rate":
        return _failure_rates(v, a_rows, b_rows, op)
    if lhs.kind == "slope":
        fa, fb = _slope_fit(data, lhs, a_rows), _slope_fit(data, rhs, b_rows)
        v.lhs, v.rhs = fa.params["alpha"], fb.params["alpha"]
        v.estimate = v.lhs - v.rhs
        diff = robust.slope_difference(
            (fa.x, fa.y, fa.clusters), (fb.x, fb.y, fb.clusters), log_x=lhs.log_x and rhs.log_x
        )
        if diff is not None:
            v.lo, v.hi, v.p = diff["lo"], diff["hi"], diff["p"]
            v.test = f"slope difference (interaction), {diff['method']}"
        else:
            v.test = "slope difference: no interval"
        v.detail = f"alpha {v.lhs:.4g} vs {v.rhs:.4g}; ratio {v.lhs / v.rhs:.3g}" if v.rhs else ""
    else:
        ga, gb = _values_by_cell(a_rows, lhs.metric), _values_by_cell(b_rows, rhs.metric)
        va = np.concatenate(ga) if ga else np.empty(0)
        vb = np.concatenate(gb) if gb else np.empty(0)
        v.lhs, v.rhs = _point(lhs.kind, va), _point(rhs.kind, vb)
        v.estimate = v.lhs - v.rhs
        shared = _paired(a_rows, b_rows, lhs.metric, rhs.metric)
        if lhs.kind == rhs.kind == "mean" and shared is not None and len(shared) >= 2:
            d = (shared.a - shared.b).to_numpy(float)
            v.lo, v.hi = t_interval(d)
            v.estimate = float(d.mean())
            v.p = _ttest_p(d)
            v.seeds = (len(d), len(d))
            v.test = "paired t-interval over shared seeds"
            pi = float(sps.mannwhitneyu(shared.a, shared.b).statistic / len(shared) ** 2)
            v.detail = f"{len(d)} shared seeds; a > b in {(d > 0).sum()}/{len(d)}; P(improvement)={pi:.2f}"
        elif lhs.kind == rhs.kind == "mean":
            if len(va) >= 2 and len(vb) >= 2 and (np.ptp(va) > 0 or np.ptp(vb) > 0):
                res = sps.ttest_ind(va, vb, equal_var=False)
                ci = res.confidence_interval(CONFIDENCE)
                v.lo, v.hi = float(ci.low), float(ci.high)
                v.p = float(res.pvalue)
            v.test = "Welch t-interval of the difference"
            v.detail = f"n={len(va)} vs {len(vb)} seeds in {len(ga)} vs {len(gb)} cell(s)"
        elif lhs.kind == rhs.kind == "iqm":
            v.lo, v.hi, v.p = yuen_difference(va, vb)
            v.test = "Yuen trimmed t-interval of the IQM difference"
            v.detail = f"n={len(va)} vs {len(vb)} seeds"
        else:  # medians, or mixed statistics: a stratified bootstrap, only where it holds its level
            if min(len(va), len(vb)) >= MIN_BOOTSTRAP_SEEDS:
                da, db = _boot_draws(ga, lhs.kind, rng), _boot_draws(gb, rhs.kind, rng)
                if da is not None and db is not None:
                    v.lo, v.hi = _percentile(da - db)
            v.test = "bootstrap of the difference (stratified by cell)"
            v.detail = f"n={len(va)} vs {len(vb)} seeds" + (
                ""
                if min(len(va), len(vb)) >= MIN_BOOTSTRAP_SEEDS
                else f"; no interval below {MIN_BOOTSTRAP_SEEDS} seeds a side (compare means or IQMs)"
            )
    v.verdict = _decide(op, v.lo, v.hi)
    return v


def _ttest_p(values: np.ndarray, c: float = 0.0) -> float:
    """The two-sided p of the one-sample t-test of mean(values) = c, matching `t_interval`: NaN for fewer
    than 2 values; with no spread the interval is a point, so p is 0 unless the point is c (then 1)."""
    values = np.asarray(values, float)
    values = values[np.isfinite(values)]
    if len(values) < 2:
        return math.nan
    if np.ptp(values) == 0:
        return 1.0 if values[0] == c else 0.0
    with warnings.catch_warnings():  # near-identical seeds: scipy warns of precision loss, p is still ~0
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(sps.ttest_1samp(values, c).pvalue)


def _one_sided(greater: bool, p_up: float, p_down: float) -> tuple[str, float]:
    """The verdict, and its p, from the one-sided p-values of "lhs is greater" (`p_up`) and "lhs is less"
    (`p_down`), for a claim that lhs is greater (`greater`) or less."""
    p_claimed, p_opposite = (float(p_up), float(p_down)) if greater else (float(p_down), float(p_up))
    if p_claimed < ALPHA:
        return SUPPORTED, p_claimed
    if p_opposite < ALPHA:
        return CONTRADICTED, p_opposite
    return INCONCLUSIVE, p_claimed


def _failure_rate_vs_number(v: Verdict, rows: pd.DataFrame, op: str, c: float) -> Verdict:
    """failure_rate OP c: exact one-sided binomial tests of k failures in n seeds against rate c."""
    if not 0 <= c <= 1:
        raise _Malformed(f"a failure rate is a share in [0, 1]: compare it with a number in [0, 1], not {c:g}")
    k, n = int(rows.failed.sum()), len(rows)
    greater = op in (">", ">=")
    up, down = float(sps.binomtest(k, n, c, "greater").pvalue), float(sps.binomtest(k, n, c, "less").pvalue)
    v.verdict, v.p = _one_sided(greater, up, down)
    lo, hi = wilson(k, n)
    v.lhs, v.estimate, v.lo, v.hi = k / n, k / n - c, lo - c, hi - c
    v.test = "exact binomial test, one-sided (Wilson interval)"
    v.detail = f"{k}/{n} seeds failed; one-sided p={v.p:.3g}"
    v.seeds = (n,)
    return v


def _failure_rates(v: Verdict, a_rows: pd.DataFrame, b_rows: pd.DataFrame, op: str) -> Verdict:
    """failure_rate[a] OP failure_rate[b]: one-sided exact tests. One cell a side sharing seeds: exact
    McNemar (a binomial test on the discordant seeds); otherwise Fisher's exact test."""
    from statsmodels.stats.proportion import confint_proportions_2indep

    k1, n1, k2, n2 = int(a_rows.failed.sum()), len(a_rows), int(b_rows.failed.sum()), len(b_rows)
    lo, hi = confint_proportions_2indep(k1, n1, k2, n2, method="newcomb", alpha=1 - CONFIDENCE)
    v.lhs, v.rhs = k1 / n1, k2 / n2
    v.estimate, v.lo, v.hi = v.lhs - v.rhs, float(lo), float(hi)
    greater = op in (">", ">=")
    pairs = _paired_failures(a_rows, b_rows)
    if pairs is not None:
        only_a, only_b = int((pairs.a & ~pairs.b).sum()), int((~pairs.a & pairs.b).sum())
        m = only_a + only_b
        up = float(sps.binomtest(only_a, m, 0.5, "greater").pvalue) if m else 1.0
        down = float(sps.binomtest(only_a, m, 0.5, "less").pvalue) if m else 1.0
        v.verdict, v.p = _one_sided(greater, up, down)
        v.seeds = (len(pairs), len(pairs))
        v.test = "exact McNemar test over shared seeds, one-sided (Newcombe interval)"
        v.detail = (
            f"{k1}/{n1} vs {k2}/{n2} failed; {len(pairs)} shared seeds, {only_a} fail only a, {only_b} only b; "
            f"one-sided p={v.p:.3g}"
        )
        return v
    table = [[k1, n1 - k1], [k2, n2 - k2]]
    up, down = sps.fisher_exact(table, "greater").pvalue, sps.fisher_exact(table, "less").pvalue
    v.verdict, v.p = _one_sided(greater, up, down)
    v.seeds = (n1, n2)
    v.test = "Fisher's exact test, one-sided (Newcombe interval)"
    v.detail = f"{k1}/{n1} vs {k2}/{n2} failed; Fisher exact one-sided p={v.p:.3g}"
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


def _paired(a_rows: pd.DataFrame, b_rows: pd.DataFrame, ma: str, mb: str) -> pd.DataFrame | None:
    """Both sides one cell each, sharing seeds: the per-seed pairs (same seed = same init and data)."""
    if a_rows.cell_hash.nunique() != 1 or b_rows.cell_hash.nunique() != 1:
        return None
    a = a_rows.set_index("seed")[ma].rename("a")
    b = b_rows.set_index("seed")[mb].rename("b")
    both = pd.concat([a, b], axis=1, join="inner").dropna()
    return both if len(both) else None


def verify(data: StudyData, claims: list[str] | None = None, holm: bool = False) -> list[Verdict]:
    """Every claim of the study (or `claims`), in order; `holm`: with Holm-adjusted p-values beside."""
    verdicts = [evaluate(data, c) for c in (data.claims if claims is None else claims)]
    return adjust_holm(verdicts) if holm else verdicts


def adjust_holm(verdicts: list[Verdict]) -> list[Verdict]:
    """Holm's step-down control of the family-wise error over the claims that were decided (supported,
    contradicted or inconclusive) and have a p-value; each gets `p_holm` and `verdict_holm` (a supported or
    contradicted claim whose adjusted p is >= 0.05 becomes inconclusive). Claims without a p-value, pending
    or invalid keep their verdict and a NaN `p_holm`."""
    from statsmodels.stats.multitest import multipletests

    tested = [v for v in verdicts if v.verdict in (SUPPORTED, CONTRADICTED, INCONCLUSIVE) and np.isfinite(v.p)]
    for v in verdicts:
        v.p_holm, v.verdict_holm = math.nan, v.verdict
    if tested:
        adjusted = multipletests([v.p for v in tested], alpha=ALPHA, method="holm")[1]
        for v, p in zip(tested, adjusted, strict=True):
            v.p_holm = float(p)
            if v.verdict in (SUPPORTED, CONTRADICTED) and p >= ALPHA:
                v.verdict_holm = INCONCLUSIVE
    return verdicts


def verdict_table(verdicts: list[Verdict], holm: bool = False) -> pd.DataFrame:
    return pd.DataFrame([v.row(holm) for v in verdicts], columns=list(Verdict("", "").row(holm)))
