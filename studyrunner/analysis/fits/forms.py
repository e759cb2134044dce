"""The curves a scaling fit can take, and the least-squares solve of one (docstring of `scaling`: which form, why).

A `Form` holds a curve's prediction in ln D, its starting points, its parameter bounds and whether it is fitted
on ln y; `get_form` picks one by name (the logistic's ceiling fitted or fixed by the y scale); `solve` fits it
(closed form for ordinary least squares on a straight line, else `scipy.optimize.least_squares` from every
start); `named_params` gives the parameters by name on their reported scale; `bound_flags` says which rest on
a bound.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pandas as pd
from scipy.optimize import least_squares
from scipy.special import expit, logsumexp


@dataclass(frozen=True)
class Form:
    name: str
    params: tuple[str, ...]
    formula: str
    # (theta, lnD) -> y;   starts: (lnD, y) -> list of starting thetas
    predict: Callable[[np.ndarray, np.ndarray], np.ndarray]
    starts: Callable[[np.ndarray, np.ndarray], list[np.ndarray]]
    log_space: bool = False  # fitted on ln y (power law)
    # (lnD, y) -> (lower, upper) bounds on theta; None = unbounded
    bounds: Callable[[np.ndarray, np.ndarray], tuple[list[float], list[float]]] | None = None
    # parameters that may rest at a bound without the fit being flagged (the logistic's floor c at 0)
    free_at_bound: tuple[str, ...] = ()


def _loglinear_starts(lx, y):
    slope, intercept = np.polyfit(lx, y, 1) if np.ptp(lx) > 0 else (0.0, float(np.mean(y)))
    return [np.array([slope, intercept])]


def _logistic(top: float) -> Form:
    """The logistic with its ceiling fixed at `top`."""

    def predict(theta, lx):
        c, k, m = theta
        return c + (top - c) * expit(k * (lx - m))

    def starts(lx, y):
        c0 = float(min(np.min(y), top * 0.999))
        return [
            np.array([c, k, m]) for c in (c0, 0.0) for k in (0.5, 2.0, 5.0) for m in np.quantile(lx, [0.25, 0.5, 0.75])
        ]

    def bounds(lx, y):  # c between min(0, y) and top; a finite steepness; the midpoint near the data
        span = max(float(np.ptp(lx)), 1.0)
        return (
            [min(0.0, float(np.min(y))), -50.0, float(lx.min()) - 2 * span],
            [top, 50.0, float(lx.max()) + 2 * span],
        )

    return Form(
        "logistic",
        ("c", "k", "m"),
        f"y = c + ({top:g} − c)·σ(k·(ln D − m))",
        predict,
        starts,
        bounds=bounds,
        free_at_bound=("c",),
    )


def _top_floor(lx, y) -> float:
    """The lowest ceiling a fitted logistic may take: the largest mean of y at one D."""
    return float(pd.Series(y).groupby(np.round(lx, 9)).mean().max())


def _logistic_fitted_top(cap: float) -> Form:
    """The logistic with its ceiling `top` fitted, bounded to [max over D of the mean y, cap]
    (accuracies that plateau below 1, e.g. at 0.44)."""

    def predict(theta, lx):
        c, k, m, top = theta
        return c + (top - c) * expit(k * (lx - m))

    def starts(lx, y):
        lo = _top_floor(lx, y)
        c0 = float(np.min(y))
        return [
            np.array([c, k, m, t])
            for c in (c0, 0.0)
            for k in (0.5, 2.0, 5.0)
            for m in np.quantile(lx, [0.25, 0.5, 0.75])
            for t in (lo + 0.05 * (cap - lo), cap)
        ]

    def bounds(lx, y):
        span = max(float(np.ptp(lx)), 1.0)
        return (
            [min(0.0, float(np.min(y))), -50.0, float(lx.min()) - 2 * span, _top_floor(lx, y)],
            [cap, 50.0, float(lx.max()) + 2 * span, cap],
        )

    return Form(
        "logistic",
        ("c", "k", "m", "top"),
        f"y = c + (top − c)·σ(k·(ln D − m)), top ≤ {cap:g}",
        predict,
        starts,
        bounds=bounds,
        free_at_bound=("c",),
    )


def _power_predict(theta, lx):
    e, a, g = theta
    return np.exp(logsumexp(np.stack([np.full_like(lx, e), a - g * lx]), axis=0))


def _power_starts(lx, y):
    ly = np.log(y)
    return [
        np.array([e, a, g])
        for e in (np.log(np.min(y) * 0.5), np.log(np.min(y) * 0.9))
        for a in (float(np.max(ly)), float(np.max(ly)) + 1.0)
        for g in (0.25, 0.5, 1.0, 2.0)
    ]


LOGLINEAR = Form("loglinear", ("alpha", "beta"), "y = α·ln D + β", lambda t, lx: t[0] * lx + t[1], _loglinear_starts)


POWER_FLOOR = Form(
    "power_floor",
    ("E", "A", "gamma"),
    "y = E + A·D^(−γ)",
    _power_predict,
    _power_starts,
    True,
    lambda lx, y: ([-np.inf, -np.inf, 0.0], [np.inf, np.inf, 10.0]),  # a decreasing curve with a floor
)

# y = α·x + β, for claims on a plain regressor (`slope(y ~ memory_slots)`); x enters as exp(ln x), so
# callers shift x to be positive (the slope does not change).
LINEAR = Form("linear", ("alpha", "beta"), "y = α·x + β", lambda t, lx: t[0] * np.exp(lx) + t[1], lambda lx, y: [])
FORMS = ("loglinear", "logistic", "power_floor")


def get_form(name: str, y: np.ndarray | None = None, top: float | None = None) -> Form | None:
    if name == "loglinear":
        return LOGLINEAR
    if name == "linear":
        return LINEAR
    if name == "power_floor":
        return POWER_FLOOR if y is None or np.all(np.asarray(y) > 0) else None
    if name == "logistic":
        # top: a number fixes the ceiling; None fits it, bounded to [max mean y, 1 or 100 by the y scale]
        ymax = float(np.max(y)) if y is not None and len(y) else 1.0
        cap = 1.0 if ymax <= 1.0 else 100.0 if ymax <= 100.0 else None
        if top is not None:
            return _logistic(float(top))
        if cap is None:
            return None
        if y is not None and len(y) and ymax >= cap:  # the data reach the cap: nothing to fit
            return _logistic(cap)
        return _logistic_fitted_top(cap)
    raise ValueError(f"unknown form {name!r}; forms: {', '.join(FORMS)}")


def solve(form: Form, lx: np.ndarray, y: np.ndarray, loss: str, f_scale: float, starts=None):
    """The least-squares optimum of `form` on (ln D, y): x (theta), cost (half the sum of squares) and jac;
    None when no start gives a finite one."""
    if form.name in ("loglinear", "linear") and loss == "linear":  # ordinary least squares: the closed form
        X = np.column_stack([lx if form.name == "loglinear" else np.exp(lx), np.ones_like(lx)])
        theta, *_ = np.linalg.lstsq(X, y, rcond=None)
        r = X @ theta - y
        return SimpleNamespace(x=theta, cost=0.5 * float(r @ r), jac=X)
    target = np.log(y) if form.log_space else y

    def residual(theta):
        pred = form.predict(theta, lx)
        return (np.log(pred) if form.log_space else pred) - target

    best = None
    lower, upper = form.bounds(lx, y) if form.bounds else ([-np.inf] * len(form.params), [np.inf] * len(form.params))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for start in starts if starts is not None else form.starts(lx, y):
            start = np.clip(start, np.nextafter(lower, np.inf), np.nextafter(upper, -np.inf))
            try:
                res = least_squares(residual, start, loss=loss, f_scale=f_scale, method="trf", bounds=(lower, upper))
            except (ValueError, np.linalg.LinAlgError):
                continue
            if np.all(np.isfinite(res.x)) and (best is None or res.cost < best.cost):
                best = res
    return best


def named_params(form: Form, theta: np.ndarray) -> dict[str, float]:
    """The parameters by name, on the scale they are reported on (the power law's E and A out of ln)."""
    if form.name == "power_floor":
        e, a, g = theta
        return {"E": float(np.exp(e)), "A": float(np.exp(a)), "gamma": float(g)}
    return {name: float(v) for name, v in zip(form.params, theta, strict=True)}


def bound_flags(form: Form, theta: np.ndarray, lx: np.ndarray, y: np.ndarray) -> list[str]:
    """["at bound: m, k"] when a fitted parameter rests on one of its bounds (not one in free_at_bound)."""
    if form.bounds is None:
        return []
    lower, upper = form.bounds(lx, y)
    at = []
    for name, value, lo, hi in zip(form.params, theta, lower, upper, strict=True):
        if name in form.free_at_bound:
            continue
        width = hi - lo if np.isfinite(lo) and np.isfinite(hi) else max(1.0, abs(value))
        tol = 1e-4 * max(width, 1e-12)
        if (np.isfinite(lo) and value - lo <= tol) or (np.isfinite(hi) and hi - value <= tol):
            at.append(name)
    return [f"at bound: {', '.join(at)}"] if at else []
