"""`studyrunner verify`: each declared claim evaluated with a suitable test and a 95% interval.

A claim compares two sides (see `studyrunner.spec.claims_grammar` for the grammar). The verdict comes
from an interval of the difference lhs − rhs (or of the one quantity against a number):

- **supported**: the whole interval lies on the claimed side of 0;
- **contradicted**: the whole interval lies on the other side;
- **inconclusive**: the interval straddles 0, or there are too few seeds for an interval.

Tests per quantity:

| quantity | against a number | against the same quantity |
|---|---|---|
| metric mean | t-interval of the mean | paired t over shared seeds (one cell a side, 2+ shared), else Welch |
| iqm | Yuen's trimmed-mean t-interval | Yuen's two-sample trimmed t |
| median | order-statistic interval (infinite below 6 seeds) | stratified bootstrap, from 10 seeds a side |
| failure_rate | Wilson interval | Newcombe's interval of the difference (statsmodels), Fisher's exact p beside it |
| slope | the fit's CR2 t-interval by seed (`fits`; two x values: the pairwise one) | CR2 t of the interaction |

A claim that names a field the study does not have, or selects no finished trial, is `invalid`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats as sps

from ..errors import StudyrunnerError
from ..spec.claims_grammar import Claim, GrammarError, Number, Quantity, parse_claim
from . import fits
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

    def row(self) -> dict:
        return {
            "claim": self.claim,
            "verdict": self.verdict,
            "lhs": self.lhs,
            "rhs": self.rhs,
            "difference": self.estimate,
            "lo": self.lo,
            "hi": self.hi,
            "test": self.test,
            "detail": self.detail,
        }


class _Invalid(Exception):
    pass


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
    ok = rows[~rows.failed]  # the curve is fitted to successful seeds (failures are their own statistic)
    x, y = x.loc[ok.index].to_numpy(float), ok[q.metric].to_numpy(float)
    if not q.log_x:
        x = x - np.nanmin(x) + 1.0 if len(x) else x  # positive, as fits take it; the slope is unchanged
    elif np.any(x <= 0):
        raise _Invalid(f"ln {q.x} needs positive values")
    seeds = ok["seed"].to_numpy()
    f = fits.fit(x, y, "loglinear" if q.log_x else "linear", extrapolate=False, clusters=seeds)
    if f is None:
        raise _Invalid(f"slope needs successful seeds at 2+ distinct values of {q.x}")
    return f


def evaluate(data: StudyData, claim: Claim | str) -> Verdict:
    """Evaluate one claim on a study's finished trials."""
    text = claim if isinstance(claim, str) else claim.text
    try:
        claim = parse_claim(claim) if isinstance(claim, str) else claim
        return _evaluate(data, claim)
    except GrammarError as exc:
        return Verdict(text, INVALID, detail=str(exc))
    except _Invalid as exc:
        return Verdict(text, INVALID, detail=str(exc))


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
            rows = _rows(data, lhs)
            k, n = int(rows.failed.sum()), len(rows)
            lo, hi = wilson(k, n)
            v.lhs, v.test, v.detail = k / n, "Wilson interval", f"{k}/{n} seeds failed"
        elif lhs.kind == "slope":
            f = _slope_fit(data, lhs, _rows(data, lhs))
            v.lhs = f.params["alpha"]
            lo, hi = f.param_ci.get("alpha", (math.nan, math.nan))
            v.p = fits.param_test(f, "alpha", c)["p"]
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
        raise _Invalid(f"cannot compare {lhs.kind} with {rhs.kind}")
    a_rows, b_rows = _rows(data, lhs), _rows(data, rhs)
    if lhs.kind == "failure_rate":
        from statsmodels.stats.proportion import confint_proportions_2indep

        k1, n1, k2, n2 = int(a_rows.failed.sum()), len(a_rows), int(b_rows.failed.sum()), len(b_rows)
        lo, hi = confint_proportions_2indep(k1, n1, k2, n2, method="newcomb", alpha=1 - CONFIDENCE)
        p = sps.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]]).pvalue
        v.lhs, v.rhs = k1 / n1, k2 / n2
        v.estimate, v.lo, v.hi = v.lhs - v.rhs, float(lo), float(hi)
        v.test = "Newcombe interval of the difference"
        v.detail = f"{k1}/{n1} vs {k2}/{n2} failed; Fisher exact p={p:.3g}"
    elif lhs.kind == "slope":
        fa, fb = _slope_fit(data, lhs, a_rows), _slope_fit(data, rhs, b_rows)
        v.lhs, v.rhs = fa.params["alpha"], fb.params["alpha"]
        v.estimate = v.lhs - v.rhs
        diff = fits.slope_difference(
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
            v.test = "paired t-interval over shared seeds"
            pi = float(sps.mannwhitneyu(shared.a, shared.b).statistic / len(shared) ** 2)
            v.detail = f"{len(d)} shared seeds; a > b in {(d > 0).sum()}/{len(d)}; P(improvement)={pi:.2f}"
        elif lhs.kind == rhs.kind == "mean":
            if len(va) >= 2 and len(vb) >= 2 and (np.ptp(va) > 0 or np.ptp(vb) > 0):
                res = sps.ttest_ind(va, vb, equal_var=False)
                ci = res.confidence_interval(CONFIDENCE)
                v.lo, v.hi = float(ci.low), float(ci.high)
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


def _paired(a_rows: pd.DataFrame, b_rows: pd.DataFrame, ma: str, mb: str) -> pd.DataFrame | None:
    """Both sides one cell each, sharing seeds: the per-seed pairs (same seed = same init and data)."""
    if a_rows.cell_hash.nunique() != 1 or b_rows.cell_hash.nunique() != 1:
        return None
    a = a_rows.set_index("seed")[ma].rename("a")
    b = b_rows.set_index("seed")[mb].rename("b")
    both = pd.concat([a, b], axis=1, join="inner").dropna()
    return both if len(both) else None


def verify(data: StudyData, claims: list[str] | None = None) -> list[Verdict]:
    """Every claim of the study (or `claims`), in order."""
    return [evaluate(data, c) for c in (data.claims if claims is None else claims)]


def verdict_table(verdicts: list[Verdict]) -> pd.DataFrame:
    return pd.DataFrame([v.row() for v in verdicts], columns=list(Verdict("", "").row()))
