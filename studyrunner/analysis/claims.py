"""`studyrunner verify`: each declared claim decided by one test at one-sided level ALPHA = 0.05.

A claim compares two sides (see `studyrunner.study.claims_grammar` for the grammar; docs/analysis/claims.md
for the user's account). Every directional claim (`<`, `>`, `<=`, `>=`; `>=` reads as `>`) is decided by one
test, which gives two one-sided p-values, `p_up` (lhs is greater) and `p_down` (lhs is less):

- **supported**: the one-sided p in the claimed direction is < alpha;
- **contradicted**: the one-sided p in the opposite direction is < alpha;
- **inconclusive**: neither, or too few seeds for the test.

The interval shown is the one the verdict uses: the two one-sided (1 − alpha) bounds of the same test (at
alpha 0.05 a two-sided 90% interval), so its lower bound lies above 0 exactly when a `>` claim is supported.
`p` is the one-sided p in the verdict's direction (the claimed one when inconclusive); `p_claimed` and
`p_opposite` are both. `verify(..., holm=True)` adjusts over the claims' `p` by Holm's step-down method,
counting identical hypotheses (the same test on the same trials in the same direction) once.

Tests per quantity (the seed is the unit of replication: a side that spans several cells is reduced to
one value per seed, the mean of that seed's cells, before any test of means, IQMs or medians):

| quantity | against a number | against the same quantity |
|---|---|---|
| metric mean | one-sample t over seeds | paired t over shared seeds (2+), else Welch over seeds |
| iqm | one-sample Yuen trimmed t | paired: one-sample Yuen of per-seed differences; else two-sample Yuen |
| median | exact sign (order-statistic) test | stratified bootstrap, from 10 seeds a side |
| failure_rate | exact binomial test (Clopper-Pearson bounds) | exact McNemar over shared seeds, else Fisher |
| slope | the fit's CR2 t by seed | CR2 t of the interaction |

On seeds no t-test describes (`_irregular`, `_tied`: the failure rule splits them, a cell is bimodal,
values tie at an extreme such as an accuracy of 1, or the spread is zero), a comparison is decided by an
exact randomisation test (`exact`: sign flips over shared seeds, permutations over disjoint ones or
within seeds for a slope) whose shift interval agrees with it; a mean or IQM against a number, or a
difference of slopes or medians, cannot be decided there (inconclusive, pointing to the failure-rate
claim that can), nor a mean or IQM against a number in a study whose `failure:` rule says seeds may
fail. A metric that does not depend on the seed (`_deterministic`) is decided by the sign of the
difference. Every test records its inputs in `extra["design"]` for `power.seeds_needed`. The user's
account, with the simulation table: docs/analysis/claims.md.

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
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats as sps

from ..errors import StudyrunnerError
from ..study.claims_grammar import Claim, GrammarError, Number, Quantity, parse_claim
from ..study.schema import ClaimEntry
from . import exact, fits, robust
from .data import StudyData
from .stats import (
    BIMODAL_GAP,
    MIN_BOOTSTRAP_SEEDS,
    N_RESAMPLES,
    SEED,
    VERIFY_SEPARATION,
    bimodality,
    bootstrap_draws,
    iqm,
    metric_scale,
    one_sided_t,
    yuen_one,
    yuen_two,
)

SUPPORTED, CONTRADICTED, INCONCLUSIVE, INVALID = "supported", "contradicted", "inconclusive", "invalid"
PENDING = "pending"
ALPHA = 0.05  # every directional claim is decided at this one-sided level (exactly 0.05, not 1 - 0.95)
FEW_SEEDS = 3  # fewer seeds a side than this: the detail says so


@dataclass
class Verdict:
    claim: str
    verdict: str
    estimate: float = math.nan  # lhs - rhs (or lhs - number); on `scale` where one is named
    lo: float = math.nan
    hi: float = math.nan
    lhs: float = math.nan
    rhs: float = math.nan
    test: str = ""
    detail: str = ""
    extra: dict = field(default_factory=dict)
    # The one-sided p of the deciding test in the verdict's direction (the claimed one when inconclusive);
    # NaN where the claim cannot be decided.
    p: float = math.nan
    # Seeds (values) each side's evidence rests on (paired: the shared seeds); () until counted.
    seeds: tuple[int, ...] = ()
    unfinished: int = 0  # trials the claim's sides select that have not finished
    # Holm's step-down adjustment over the study's claims (`verify(..., holm=True)`); NaN / "" otherwise.
    p_holm: float = math.nan
    verdict_holm: str = ""
    # The one-sided p-values of the test that decides the claim, in the claimed direction and the opposite
    # one (NaN only where the claim cannot be decided, e.g. too few seeds).
    p_claimed: float = math.nan
    p_opposite: float = math.nan
    min_effect: float | None = None  # the claim's smallest effect of interest (study file), on its scale
    seeds_needed: dict | None = None  # for an inconclusive claim: {"observed": ..., "min_effect": ...}
    alpha: float = ALPHA  # the one-sided level it was decided at; [lo, hi] is the 1 − 2·alpha interval
    # The scale of estimate/lo/hi when it is not the difference lhs − rhs: "odds ratio" (Fisher's test,
    # where no effect is 1, not 0).
    scale: str = ""
    # What makes two claims one hypothesis for Holm: the test, the trials of each side, the direction.
    hypothesis: tuple | None = field(default=None, repr=False)

    @property
    def null(self) -> float:
        """The value of estimate/lo/hi that means no difference (1 on the odds-ratio scale, else 0)."""
        return 1.0 if self.scale == "odds ratio" else 0.0

    def row(self, holm: bool = False) -> dict:
        row = {
            "claim": self.claim,
            "verdict": self.verdict,
            "lhs": self.lhs,
            "rhs": self.rhs,
            "difference": self.estimate,
            "lo": self.lo,
            "hi": self.hi,
            "scale": self.scale or "difference",
            "confidence": 1 - 2 * self.alpha,
            "p": self.p,
            "p_claimed": self.p_claimed,
            "p_opposite": self.p_opposite,
            "test": self.test,
            "detail": self.detail,
            "min_effect": self.min_effect,
            "seeds_needed": self.seeds_needed,
        }
        if holm:
            row["p_holm"], row["verdict_holm"] = self.p_holm, self.verdict_holm
        return row


class _Invalid(Exception):
    pass


class _Malformed(_Invalid):
    """A claim no further trial can make answerable (invalid even while trials are unfinished)."""


def _conclude(v: Verdict, greater: bool, p_up: float, p_down: float) -> Verdict:
    """The verdict from the deciding test's one-sided p-values: "lhs is greater" (`p_up`), "lhs is less"
    (`p_down`), for a claim that lhs is greater (`greater`) or less; NaN p-values decide nothing."""
    p_claimed, p_opposite = (float(p_up), float(p_down)) if greater else (float(p_down), float(p_up))
    v.p_claimed, v.p_opposite = p_claimed, p_opposite
    if p_claimed < v.alpha:
        v.verdict, v.p = SUPPORTED, p_claimed
    elif p_opposite < v.alpha:
        v.verdict, v.p = CONTRADICTED, p_opposite
    else:
        v.verdict, v.p = INCONCLUSIVE, p_claimed
    return v


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


def _by_seed(rows: pd.DataFrame, metric: str) -> pd.Series:
    """One value per seed: the seed's value, or over a side of several cells the mean of the seed's cells
    (the same seed is the same initialisation and data stream in every cell, so the seed, not the trial,
    is the unit of replication). Seeds without a finite value are left out."""
    values = pd.to_numeric(rows[metric], errors="coerce").astype(float)
    ok = np.isfinite(values.to_numpy())
    return values[ok].groupby(rows.loc[ok, "seed"].to_numpy()).mean().sort_index()


def _statistic(kind: str, values) -> float:
    values = np.asarray(values, dtype=float)
    if not len(values):
        return math.nan
    return float(_STATISTICS[kind](values))


_STATISTICS = {"mean": np.mean, "median": np.median, "iqm": iqm}


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
    f.trial_keys = ok["trial_key"].to_numpy()  # every point is kept (finite, x > 0): aligned with f.x
    return f


def evaluate(data: StudyData, claim: Claim | ClaimEntry | dict | str, alpha: float = ALPHA) -> Verdict:
    """Decide one claim on a study's finished trials at one-sided level `alpha` (`pending` while a trial it
    selects is unfinished); the interval shown is the test's 1 − 2·alpha one (both one-sided bounds)."""
    claim = ClaimEntry.model_validate(claim) if isinstance(claim, dict) else claim
    min_effect = claim.min_effect if isinstance(claim, ClaimEntry) else None
    claim = claim.claim if isinstance(claim, ClaimEntry) else claim
    text = claim if isinstance(claim, str) else claim.text

    def bare(verdict: str, detail: str, unfinished: int = 0) -> Verdict:
        return Verdict(text, verdict, detail=detail, unfinished=unfinished, min_effect=min_effect, alpha=alpha)

    try:
        claim = parse_claim(claim) if isinstance(claim, str) else claim
        unfinished = sum(_unfinished(data, q) for q in claim.quantities)
    except (GrammarError, _Invalid) as exc:
        return bare(INVALID, str(exc))
    try:
        v = _evaluate(data, claim, Verdict(text, INCONCLUSIVE, min_effect=min_effect, alpha=alpha))
    except _Invalid as exc:
        if not unfinished or isinstance(exc, _Malformed):
            return bare(INVALID, str(exc))
        # nothing to evaluate yet (no finished trial, or none reported the metric): wait for the rest
        return bare(PENDING, f"pending: {unfinished} trials unfinished ({exc} so far)", unfinished)
    if not v.seeds:
        v.seeds = tuple(_seeds_used(data, q) for q in claim.quantities)
    notes = [v.detail] if v.detail else []
    dropped = sum(_seeds_dropped(data, q) for q in claim.quantities if q.kind == "slope")
    if dropped:
        notes.append(f"{dropped} seeds dropped: no value (diverged)")
    if v.seeds and min(v.seeds) < FEW_SEEDS:
        few = min(v.seeds)
        seeds = f"{few} seed{'' if few == 1 else 's'} per side"
        if any(q.kind == "failure_rate" for q in claim.quantities):
            notes.append(f"{seeds}: an exact test on so few seeds can hardly reach p < {alpha:g}")
        else:
            notes.append(f"{seeds}: an interval from fewer than {FEW_SEEDS} seeds is wide and rests on normality")
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
    """How many seeds a side's evidence rests on: finished trials for a failure rate, else the distinct
    seeds with a finite value of the metric."""
    if q.kind == "failure_rate":
        return len(data.select(q.selector))
    values = _metric_values(data, q)
    return int(data.select(q.selector).loc[np.isfinite(values).to_numpy(), "seed"].nunique())


def _seeds_dropped(data: StudyData, q: Quantity) -> int:
    values = _metric_values(data, q)
    return int((~np.isfinite(values)).sum())


def _flip(op: str) -> str:
    return {"<": ">", ">": "<", "<=": ">=", ">=": "<="}[op]


def _evaluate(data: StudyData, claim: Claim, v: Verdict) -> Verdict:
    lhs, op, rhs = claim.lhs, claim.op, claim.rhs
    if isinstance(lhs, Number):  # `0.5 < x` is `x > 0.5`
        lhs, op, rhs = rhs, _flip(op), lhs
    greater = op in (">", ">=")
    if isinstance(rhs, Number):
        v.rhs = rhs.value
        rows = _rows(data, lhs)
        if lhs.kind == "failure_rate":
            return _failure_rate_vs_number(v, rows, greater, rhs.value)
        if lhs.kind == "slope":
            f = _slope_fit(data, lhs, rows)
            return _slope_vs_number(v, f, lhs, greater, rhs.value, _irregular(data, [(rows, lhs.metric)]))
        irregular = _irregular(data, [(rows, lhs.metric)])
        if not irregular and data.failure_rule is not None and lhs.kind != "median":
            irregular = (
                f"the study's failure rule ({data.failure_rule.text}) says seeds may fail, and a {lhs.kind} "
                "against a number mixes failed and learned seeds in a share a few seeds cannot pin down"
            )
        return _location_vs_number(v, rows, lhs, greater, rhs.value, irregular)
    if lhs.kind != rhs.kind and not (lhs.kind in _STATISTICS and rhs.kind in _STATISTICS):
        raise _Malformed(f"cannot compare {lhs.kind} with {rhs.kind}")
    a_rows, b_rows = _rows(data, lhs), _rows(data, rhs)
    if lhs.kind == "failure_rate":
        return _failure_rates(v, a_rows, b_rows, greater)
    irregular = _irregular(data, [(a_rows, lhs.metric), (b_rows, rhs.metric)])
    if lhs.kind == "slope":
        fa, fb = _slope_fit(data, lhs, a_rows), _slope_fit(data, rhs, b_rows)
        return _slopes(v, fa, fb, lhs, rhs, greater, irregular)
    return _locations(v, a_rows, b_rows, lhs, rhs, greater, irregular)


def _irregular(data: StudyData, parts: list[tuple[pd.DataFrame, str]]) -> str:
    """Why no t-test describes the seeds a claim rests on ("" when one does): the trials of its cells are
    split by failure (status or the `failure:` rule: some failed, some did not), or a cell's seeds are
    bimodal (`stats.bimodality`: two clusters far apart for their spread, seen from 3 seeds). The split is
    read off all the claim's trials together, which the randomisation tests leave unchanged, so those tests
    stay exact given that they were chosen. Ties at a bound are `_tied`'s."""
    rows = pd.concat([r for r, _ in parts])
    failed = rows.failed.astype(bool)
    if failed.any() and not failed.all():
        return f"the failure rule splits these seeds ({int(failed.sum())} of {len(rows)} trials failed)"
    for r, metric in parts:
        if metric is None or metric not in r:
            continue
        scale = metric_scale(data, metric) or 0.0
        for _, cell in r.groupby("cell_hash", sort=False):
            if bimodality(cell[metric], scale, BIMODAL_GAP * scale, VERIFY_SEPARATION)[0]:
                return f"cell {cell.cell.iloc[0]} is bimodal (its seeds form two clusters)"
    return ""


def _deterministic(parts: list[tuple[pd.DataFrame, str]]) -> bool:
    """Every cell of the claim has 2+ seeds and they all give the same value, not 0 or 1: the metric does
    not depend on the seed (a cache size, a parameter count), so the difference is exact, not estimated.
    Seeds tied at 0 or 1 are a share at its floor or ceiling (accuracies), not a fact: `_tied`'s."""
    for rows, metric in parts:
        if metric is None or metric not in rows:
            return False
        for _, cell in rows.groupby("cell_hash", sort=False):
            x = pd.to_numeric(cell[metric], errors="coerce").to_numpy(float)
            if len(x) < 2 or not np.all(np.isfinite(x)) or np.ptp(x) != 0 or x[0] in (0.0, 1.0):
                return False
    return True


def _exactly(v: Verdict, greater: bool, difference: float) -> Verdict:
    """The verdict of a difference known exactly (`_deterministic`): its sign decides it."""
    v.estimate = v.lo = v.hi = difference
    v.test = "exact: every seed gives the same value in each cell (the metric does not depend on the seed)"
    return _conclude(v, greater, 0.0 if difference > 0 else 1.0, 0.0 if difference < 0 else 1.0)


def _tied(*values) -> str:
    """Two or more of the test's values (one per seed and side, pooled) tie at the largest or the smallest,
    as accuracies at a ceiling of 1 do: a t-test on such values degenerates (a zero spread gives p = 0), so
    a randomisation test decides (`_irregular`'s reasons come first)."""
    pooled = np.concatenate([np.asarray(v, dtype=float) for v in values]) if values else np.empty(0)
    pooled = pooled[np.isfinite(pooled)]
    for end in (pooled.max(), pooled.min()) if len(pooled) > 1 else ():
        ties = int((pooled == end).sum())
        if ties >= 2:
            return f"{ties} values tie at {end:g} (a bound, such as an accuracy of 1)"
    return ""


def _no_spread(se: float, *values) -> bool:
    """The t-test's standard error is zero, or float noise next to the values' scale."""
    scale = max([float(np.max(np.abs(v))) for v in values if len(v)] + [1e-300])
    return bool(np.isfinite(se) and se <= 1e-12 * scale)


def _cannot_decide(v: Verdict, q: Quantity, reason: str, against_number: bool = False) -> Verdict:
    """Inconclusive, saying why no test of this quantity holds its level here and what would decide it."""
    where = f"[{', '.join(f'{k}={val}' for k, val in q.selector)}]" if q.selector else ""
    v.lo = v.hi = math.nan
    v.test = "no test holds its level here"
    what = f"a {q.kind} against a number" if against_number else f"a difference of {q.kind}s"
    v.detail = (
        f"cannot decide: {reason}, and no test of {what} holds its level on such seeds; a failure-rate claim "
        f"decides it, e.g. failure_rate{where} < 0.5 with a `failure:` rule (its exact binomial test holds)"
    )
    return v


def _shifted(v: Verdict, res: dict, c: float) -> None:
    """Set v's interval from a test of lhs against c (bounds on the lhs scale) as lhs − c."""
    v.estimate, v.lo, v.hi = v.lhs - c, res["lo"] - c, res["hi"] - c


# --- means, IQMs, medians ----------------------------------------------------------------------------


def _location_vs_number(v: Verdict, rows: pd.DataFrame, q: Quantity, greater: bool, c: float, irregular: str):
    values = _by_seed(rows, q.metric)
    x = values.to_numpy(float)
    cells = rows.cell_hash.nunique()
    v.lhs = _statistic(q.kind, x)
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
    if _deterministic([(rows, q.metric)]):
        return _exactly(v, greater, v.lhs - c)
    irregular = irregular or _tied(x) or ("the seeds have no spread" if _no_spread(se, x) else "")
    if irregular:
        return _cannot_decide(v, q, irregular, against_number=True)
    res = one_sided_t(centre, se, df, v.alpha, c)
    _shifted(v, res, c)
    v.extra["design"] = {"test": "t1" if q.kind == "mean" else "yuen1", "x": x, "null": c, "greater": greater}
    return _conclude(v, greater, res["p_up"], res["p_down"])


_NO_TEST = {"lo": math.nan, "hi": math.nan, "p_up": math.nan, "p_down": math.nan}


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
    _shifted(v, {"lo": float(lo), "hi": float(hi)}, c)
    v.test = "exact sign test of the median (order-statistic bounds; decides nothing below 5 seeds)"
    v.extra["design"] = {"test": "sign", "x": x, "null": c, "greater": greater}
    return _conclude(v, greater, up.pvalue, down.pvalue)


def _locations(v: Verdict, a_rows, b_rows, qa: Quantity, qb: Quantity, greater: bool, irregular: str) -> Verdict:
    a, b = _by_seed(a_rows, qa.metric), _by_seed(b_rows, qb.metric)
    several = a_rows.cell_hash.nunique() > 1 or b_rows.cell_hash.nunique() > 1
    per = " (per-seed means over cells)" if several else ""
    shared = a.index.intersection(b.index)
    if qa.kind != qb.kind or qa.kind not in ("mean", "iqm"):
        if irregular:
            return _cannot_decide(v, qa, irregular)
        return _bootstrap_difference(v, a_rows, b_rows, qa, qb, greater)
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
    v.lhs, v.rhs = _statistic(qa.kind, a.to_numpy(float)), _statistic(qb.kind, b.to_numpy(float))
    v.hypothesis = _hypothesis(a_rows, b_rows, greater, a.index if paired else None)
    units = {"d": d} if paired else {"a": a.to_numpy(float), "b": b.to_numpy(float)}
    if _deterministic([(a_rows, qa.metric), (b_rows, qb.metric)]):
        return _exactly(v, greater, v.lhs - v.rhs)
    irregular = irregular or _tied(a, b)
    if irregular or _no_spread(se, a.to_numpy(float), b.to_numpy(float)):
        why = irregular or "the seeds' differences have no spread"
        res = exact.sign_flip(d, v.alpha) if paired else exact.two_sample(a.to_numpy(float), b.to_numpy(float), v.alpha)
        v.extra["design"] = {"test": "signflip" if paired else "perm2", **units, "greater": greater}
        return _randomised(v, res, why, greater)
    v.estimate = estimate
    res = one_sided_t(estimate, se, df, v.alpha)
    v.lo, v.hi = res["lo"], res["hi"]
    test = {"mean": ("t1", "welch"), "iqm": ("yuen1", "yuen2")}[qa.kind][0 if paired else 1]
    v.extra["design"] = {
        "test": test,
        **({"x": d, "paired": True} if paired else units),
        "null": 0.0,
        "greater": greater,
    }
    return _conclude(v, greater, res["p_up"], res["p_down"])


def _randomised(v: Verdict, res: exact.Randomisation | None, why: str, greater: bool) -> Verdict:
    """The verdict of an exact randomisation test (`exact`), said to be one, and what it can reach."""
    if res is None:
        v.detail = "; ".join(filter(None, [v.detail, f"{why}: too few seeds for a test"]))
        return v
    v.estimate, v.lo, v.hi = res.estimate, res.lo, res.hi
    v.test = f"exact {res.method}, interval by inverting it under a shift"
    note = f"{why}: a randomisation test, exact on any seeds (smallest p {res.smallest_p:.3g})"
    if res.smallest_p >= v.alpha:
        note += f"; it cannot reach p < {v.alpha:g} with these seeds"
    v.detail = "; ".join(filter(None, [v.detail, note]))
    return _conclude(v, greater, res.p_up, res.p_down)


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


def _bootstrap_difference(v: Verdict, a_rows, b_rows, qa: Quantity, qb: Quantity, greater: bool) -> Verdict:
    """Medians, or mixed statistics: a stratified bootstrap of the difference (by cell), only from
    MIN_BOOTSTRAP_SEEDS seeds a side (below, it does not hold its level). p_up is the share of draws at or
    below 0, so the percentile bound lo (the alpha quantile) is above 0 exactly when p_up < alpha."""
    ga, gb = _values_by_cell(a_rows, qa.metric), _values_by_cell(b_rows, qb.metric)
    va = np.concatenate(ga) if ga else np.empty(0)
    vb = np.concatenate(gb) if gb else np.empty(0)
    v.lhs, v.rhs = _statistic(qa.kind, va), _statistic(qb.kind, vb)
    v.estimate = v.lhs - v.rhs
    v.seeds = (len(va), len(vb))
    v.test = "bootstrap of the difference (stratified by cell)"
    v.detail = f"n={len(va)} vs {len(vb)} seeds"
    if min(len(va), len(vb)) < MIN_BOOTSTRAP_SEEDS:
        v.detail += f"; no interval below {MIN_BOOTSTRAP_SEEDS} seeds a side (compare means or IQMs)"
        return v
    rng = np.random.default_rng(SEED)
    da = bootstrap_draws(ga, _STATISTICS[qa.kind], N_RESAMPLES, rng)
    db = bootstrap_draws(gb, _STATISTICS[qb.kind], N_RESAMPLES, rng)
    if da is None or db is None:
        return v
    draws = da - db
    v.lo = float(np.quantile(draws, v.alpha, method="inverted_cdf"))
    v.hi = float(-np.quantile(-draws, v.alpha, method="inverted_cdf"))
    return _conclude(v, greater, float(np.mean(draws <= 0)), float(np.mean(draws >= 0)))


# --- slopes --------------------------------------------------------------------------------------------


def _slope_vs_number(v: Verdict, f, q: Quantity, greater: bool, c: float, irregular: str) -> Verdict:
    coef = robust.coefficient(f, "alpha")
    v.lhs = coef["estimate"]
    v.estimate = v.lhs - c
    v.detail = f"alpha={v.lhs:.4g}, R2={f.r2:.3f}, n={f.n}"
    v.hypothesis = _slope_hypothesis(f, greater, c)
    if _deterministic([(pd.DataFrame({"cell_hash": f.x, "y": f.y}), "y")]):  # a cell per x value
        return _exactly(v, greater, v.lhs - c)
    irregular = irregular or _tied(f.y)
    x = np.log(f.x) if q.log_x else f.x
    seeds = f.clusters if f.clusters is not None else np.arange(len(x))
    v.extra["design"] = {"test": "slope", "x": x, "y": f.y, "seeds": seeds, "null": c, "greater": greater}
    if irregular or _no_spread(coef["se"], f.y):
        v.extra["design"]["test"] = "slope_perm"
        res = exact.slope(x, f.y, seeds, v.alpha, c)
        v.lhs = res.estimate if res is not None else v.lhs
        _randomised(v, res, irregular or "the fit has no residual spread", greater)
        v.estimate, v.lo, v.hi = v.estimate - c, v.lo - c, v.hi - c
        return v
    res = one_sided_t(coef["estimate"], coef["se"], coef["df"], v.alpha, c)
    _shifted(v, res, c)
    v.test = f"{'log-' if q.log_x else ''}linear fit, {coef['method'] or 'no interval'}"
    return _conclude(v, greater, res["p_up"], res["p_down"])


def _slope_hypothesis(f, greater: bool, c: float) -> tuple | None:
    """A slope over exactly two x values is the difference of their means over Δx: the same hypothesis as
    the pairwise claim on those trials (Holm counts it once)."""
    x = np.unique(f.x)
    if len(x) != 2 or f.trial_keys is None:
        return None
    dx = float(np.log(x[1] / x[0]) if f.form == "loglinear" else x[1] - x[0])
    high = tuple(sorted(map(str, f.trial_keys[f.x == x[1]])))
    low = tuple(sorted(map(str, f.trial_keys[f.x == x[0]])))
    return (high, low, c * dx) if greater else (low, high, -c * dx)


def _slopes(v: Verdict, fa, fb, qa: Quantity, qb: Quantity, greater: bool, irregular: str) -> Verdict:
    v.lhs, v.rhs = fa.params["alpha"], fb.params["alpha"]
    v.estimate = v.lhs - v.rhs
    if irregular:  # no randomisation test of an interaction is exact
        return _cannot_decide(v, qa, irregular)
    v.detail = f"alpha {v.lhs:.4g} vs {v.rhs:.4g}; ratio {v.lhs / v.rhs:.3g}" if v.rhs else ""
    diff = robust.slope_difference((fa.x, fa.y, fa.clusters), (fb.x, fb.y, fb.clusters), log_x=qa.log_x and qb.log_x)
    if diff is None:
        v.test = "slope difference: no interval"
        return v
    res = one_sided_t(diff["estimate"], diff["se"], diff["df"], v.alpha)
    v.estimate, v.lo, v.hi = diff["estimate"], res["lo"], res["hi"]  # one fit: estimate and interval
    v.extra["design"] = {
        "test": "slope_diff",
        "a": (np.log(fa.x) if qa.log_x else fa.x, fa.y, fa.clusters),
        "b": (np.log(fb.x) if qb.log_x else fb.x, fb.y, fb.clusters),
        "greater": greater,
    }
    v.test = f"slope difference (interaction), {diff['method']}"
    return _conclude(v, greater, res["p_up"], res["p_down"])


# --- failure rates -------------------------------------------------------------------------------------


def _failure_rate_vs_number(v: Verdict, rows: pd.DataFrame, greater: bool, c: float) -> Verdict:
    """failure_rate OP c: exact one-sided binomial tests of k failures in n seeds against rate c."""
    if not 0 <= c <= 1:
        raise _Malformed(f"a failure rate is a share in [0, 1]: compare it with a number in [0, 1], not {c:g}")
    k, n = int(rows.failed.sum()), len(rows)
    up, down = sps.binomtest(k, n, c, "greater").pvalue, sps.binomtest(k, n, c, "less").pvalue
    v.lhs = k / n
    lo, hi = _clopper_pearson(k, n, v.alpha)
    _shifted(v, {"lo": lo, "hi": hi}, c)
    v.test = "exact binomial test (Clopper-Pearson bounds)"
    v.seeds = (n,)
    cells = rows.cell_hash.nunique()
    v.extra["design"] = {"test": "binomial", "k": k, "n": n, "null": c, "greater": greater, "cells": cells}
    _conclude(v, greater, up, down)
    v.detail = f"{k}/{n} seeds failed; one-sided p={v.p:.3g}"
    return v


def _clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """The one-sided (1 − alpha) Clopper-Pearson bounds of k/n: they invert the exact binomial test, so
    the lower bound exceeds c exactly when binomtest(k, n, c, "greater") gives p < alpha."""
    lo = 0.0 if k == 0 else float(sps.beta.ppf(alpha, k, n - k + 1))
    hi = 1.0 if k == n else float(sps.beta.ppf(1 - alpha, k + 1, n - k))
    return lo, hi


def _failure_rates(v: Verdict, a_rows: pd.DataFrame, b_rows: pd.DataFrame, greater: bool) -> Verdict:
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
        _conclude(v, greater, up, down)
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
    _conclude(v, greater, up, down)
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


# --- the study's claims -----------------------------------------------------------------------------


def verify(data: StudyData, claims: list | None = None, holm: bool = False, alpha: float = ALPHA) -> list[Verdict]:
    """Every claim of the study (or `claims`: texts or ClaimEntry), in order, decided at one-sided `alpha`;
    `holm`: with Holm-adjusted p-values beside."""
    verdicts = [evaluate(data, c, alpha) for c in (data.claims if claims is None else claims)]
    return adjust_holm(verdicts, alpha) if holm else verdicts


def adjust_holm(verdicts: list[Verdict], alpha: float = ALPHA) -> list[Verdict]:
    """Holm's step-down control of the family-wise error over the claims that were decided (supported,
    contradicted or inconclusive) and have a p-value; each gets `p_holm` and `verdict_holm` (a supported or
    contradicted claim whose adjusted p is >= alpha becomes inconclusive). Identical hypotheses (the same
    test on the same trials in the same direction, e.g. a slope over two depths and the pairwise claim on
    those cells: the same trials a side, the same p) count once. Claims without a p-value, pending or
    invalid keep their verdict and a NaN `p_holm`."""
    from statsmodels.stats.multitest import multipletests

    tested = [v for v in verdicts if v.verdict in (SUPPORTED, CONTRADICTED, INCONCLUSIVE) and np.isfinite(v.p)]
    for v in verdicts:
        v.p_holm, v.verdict_holm = math.nan, v.verdict
    groups: dict[object, list[Verdict]] = {}
    for i, v in enumerate(tested):
        same = (v.hypothesis, v.verdict, round(v.p, 12)) if v.hypothesis is not None else i
        groups.setdefault(same, []).append(v)
    if groups:
        members = list(groups.values())
        adjusted = multipletests([group[0].p for group in members], alpha=alpha, method="holm")[1]
        for group, p in zip(members, adjusted, strict=True):
            for v in group:
                v.p_holm = float(p)
                if v.verdict in (SUPPORTED, CONTRADICTED) and p >= alpha:
                    v.verdict_holm = INCONCLUSIVE
    return verdicts


def verdict_table(verdicts: list[Verdict], holm: bool = False) -> pd.DataFrame:
    """One row per verdict; `seeds_needed` holds a dict (JSON output) or None: `flat` it for CSV."""
    return pd.DataFrame([v.row(holm) for v in verdicts], columns=list(Verdict("", "").row(holm)))


def flat(table: pd.DataFrame) -> pd.DataFrame:
    """The verdict table for CSV: `seeds_needed` as a JSON string (empty where none)."""
    import json

    if "seeds_needed" not in table:
        return table
    return table.assign(seeds_needed=table.seeds_needed.map(lambda d: json.dumps(d) if d else ""))
