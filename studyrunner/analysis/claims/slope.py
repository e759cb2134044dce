"""Claims on slopes: the fit of a side's seeds against x (`slope_fit`), a slope against a number (the fit's
CR2 t by seed, `robust.coefficient`), and a difference of slopes (the CR2 t of the interaction,
`robust.slope_difference`). A slope over seeds no t-test describes against a number takes the exact
permutation test within seeds (`exact.slope`); a difference of slopes there is inconclusive.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...errors import StudyrunnerError
from ...study.claims_grammar import Quantity
from ..data import StudyData
from ..fits import robust, scaling
from ..stats import one_sided_t
from . import exact
from .evidence import deterministic, no_spread, tied
from .verdict import InvalidClaim, Verdict, cannot_decide, conclude, exact_difference, randomised, shifted


def slope_fit(data: StudyData, q: Quantity, rows: pd.DataFrame):
    """The straight-line fit of side `q`'s seeds against its x (ln x with `ln`), CR2 by seed."""
    if q.x in ("effective_depth", "depth", "D"):
        x = rows["depth"]
    else:
        try:
            column = data.column_for(q.x)
        except StudyrunnerError as exc:
            raise InvalidClaim(str(exc)) from None
        x = pd.to_numeric(rows[column], errors="coerce")
    if q.metric not in rows:
        raise InvalidClaim(f"no trial reported {q.metric!r}")
    # every finished seed with a value, failed ones included (a failed seed's metric is its outcome);
    # a seed without a finite value (diverged: NaN) has nothing to fit and is dropped (the detail counts it)
    ok = rows[np.isfinite(pd.to_numeric(rows[q.metric], errors="coerce").astype(float))]
    x, y = x.loc[ok.index].to_numpy(float), ok[q.metric].to_numpy(float)
    if not q.log_x:
        x = x - np.nanmin(x) + 1.0 if len(x) else x  # positive, as fits take it; the slope is unchanged
    elif np.any(x <= 0):
        raise InvalidClaim(f"ln {q.x} needs positive values")
    seeds = ok["seed"].to_numpy()
    f = scaling.fit(x, y, "loglinear" if q.log_x else "linear", extrapolate=False, clusters=seeds)
    if f is None:
        raise InvalidClaim(f"slope needs seeds with a value at 2+ distinct values of {q.x}")
    f.trial_keys = ok["trial_key"].to_numpy()  # every point is kept (finite, x > 0): aligned with f.x
    return f


def slope_vs_number(v: Verdict, f, q: Quantity, greater: bool, c: float, irregular: str) -> Verdict:
    coef = robust.coefficient(f, "alpha")
    v.lhs = coef["estimate"]
    v.estimate = v.lhs - c
    v.detail = f"alpha={v.lhs:.4g}, R2={f.r2:.3f}, n={f.n}"
    v.hypothesis = _slope_hypothesis(f, greater, c)
    if deterministic([(pd.DataFrame({"cell_hash": f.x, "y": f.y}), "y")]):  # a cell per x value
        return exact_difference(v, greater, v.lhs - c)
    irregular = irregular or tied(f.y)
    x = np.log(f.x) if q.log_x else f.x
    seeds = f.clusters if f.clusters is not None else np.arange(len(x))
    v.extra["design"] = {"test": "slope", "x": x, "y": f.y, "seeds": seeds, "null": c, "greater": greater}
    if irregular or no_spread(coef["se"], f.y):
        v.extra["design"]["test"] = "slope_perm"
        res = exact.slope(x, f.y, seeds, v.alpha, c)
        v.lhs = res.estimate if res is not None else v.lhs
        randomised(v, res, irregular or "the fit has no residual spread", greater)
        v.estimate, v.lo, v.hi = v.estimate - c, v.lo - c, v.hi - c
        return v
    res = one_sided_t(coef["estimate"], coef["se"], coef["df"], v.alpha, c)
    shifted(v, res, c)
    v.test = f"{'log-' if q.log_x else ''}linear fit, {coef['method'] or 'no interval'}"
    return conclude(v, greater, res["p_up"], res["p_down"])


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


def slopes(v: Verdict, fa, fb, qa: Quantity, qb: Quantity, greater: bool, irregular: str, null: float = 0.0) -> Verdict:
    """slope(lhs) − slope(rhs) against `null` (a margin's −δ or +δ; else 0), one-sided."""
    v.lhs, v.rhs = fa.params["alpha"], fb.params["alpha"]
    v.estimate = v.lhs - v.rhs
    if irregular:  # no randomisation test of an interaction is exact
        return cannot_decide(v, qa, irregular)
    v.detail = f"alpha {v.lhs:.4g} vs {v.rhs:.4g}; ratio {v.lhs / v.rhs:.3g}" if v.rhs else ""
    diff = robust.slope_difference((fa.x, fa.y, fa.clusters), (fb.x, fb.y, fb.clusters), log_x=qa.log_x and qb.log_x)
    if diff is None:
        v.test = "slope difference: no interval"
        return v
    res = one_sided_t(diff["estimate"], diff["se"], diff["df"], v.alpha, null)
    v.estimate, v.lo, v.hi = diff["estimate"], res["lo"], res["hi"]  # one fit: estimate and interval
    v.extra["design"] = {
        "test": "slope_diff",
        "a": (np.log(fa.x) if qa.log_x else fa.x, fa.y, fa.clusters),
        "b": (np.log(fb.x) if qb.log_x else fb.x, fb.y, fb.clusters),
        "greater": greater,
        "null": null,
    }
    v.test = f"slope difference (interaction), {diff['method']}"
    return conclude(v, greater, res["p_up"], res["p_down"])
