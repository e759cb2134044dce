"""Intervals of a fit's parameters and of its curve, by the fit's `ci` method (docstring of `scaling`: which holds
its level, and why): CR2 t by seed (`cr2_intervals`, the sandwich from `robust`), the percentile bootstrap of
seeds within strata (`bootstrap_intervals`), and the classical OLS t-interval when there is one seed
(`ols_intervals`); `band` carries the same method to the fitted curve at each depth.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from ..stats import CONFIDENCE, SEED
from . import robust
from .forms import Form, named_params, solve

N_BOOT = 1000  # bootstrap refits (closed-form log-linear fits); nonlinear forms use NONLINEAR_BOOT
NONLINEAR_BOOT = 200


def bootstrap_intervals(out, f: Form, res, lx, strata, loss, f_scale, n_boot, confidence) -> None:
    """Percentile intervals from refits on seeds resampled within strata (the `bootstrap` option), set on the
    fit `out` (a `fits.Fit`: its boot, param_ci and ci_method)."""
    x, y, k = out.x, out.y, len(f.params)
    groups = [np.flatnonzero(strata == s) for s in pd.unique(strata)]
    if n_boot is None:
        n_boot = N_BOOT if f.name in ("loglinear", "linear") and loss == "linear" else NONLINEAR_BOOT
    if not any(len(g) > 1 for g in groups) or n_boot <= 0:
        return
    rng = np.random.default_rng(SEED)
    boot = []
    for _ in range(n_boot):
        idx = np.concatenate([g[rng.integers(0, len(g), len(g))] for g in groups])
        if len(np.unique(x[idx])) < max(2, k):
            continue
        r = solve(f, lx[idx], y[idx], loss, f_scale, starts=[res.x])  # refit from the full-data optimum
        if r is not None:
            boot.append(r.x)
    if boot:
        out.boot = np.array(boot)
        a = (1 - confidence) / 2
        named = [named_params(f, t) for t in out.boot]
        for name in f.params:
            vals = np.array([d[name] for d in named])
            out.param_ci[name] = (float(np.quantile(vals, a)), float(np.quantile(vals, 1 - a)))
        out.ci_method = f"bootstrap ({len(boot)} refits, stratified)"


def cr2_intervals(out, f: Form, res, lx, clusters, confidence) -> None:
    """CR2 t-intervals clustered by seed (the docstring of `scaling`), set on the fit `out` (a `fits.Fit`: its
    sandwich, cov, param_ci, df and ci_method); nothing with fewer than two seeds."""
    sandwich = robust.cr2(res.jac, out.y - out._form.predict(res.x, lx) if not f.log_space else -res.fun, clusters)
    if sandwich is None:
        return
    out._sandwich, out.cov = sandwich, sandwich.cov
    lo, hi, df = {}, {}, {}
    for i, name in enumerate(f.params):
        c = np.eye(len(res.x))[i]
        df[name] = sandwich.df(c)
        lo[name], hi[name] = sandwich.interval(c, float(res.x[i]), confidence)
    out.ci_method = f"CR2 t by seed ({sandwich.clusters} seeds)"
    lo_n = named_params(f, np.array([lo[p] for p in f.params]))
    hi_n = named_params(f, np.array([hi[p] for p in f.params]))
    out.param_ci = {p: (min(lo_n[p], hi_n[p]), max(lo_n[p], hi_n[p])) for p in lo_n}
    out.df = {p: df[p] for p in lo_n}


def ols_intervals(form: Form, res, n: int, confidence: float):
    """(intervals, covariance, degrees of freedom) of the classical OLS t-interval (Jacobian, n − p df)."""
    k = len(res.x)
    if n <= k:
        return {}, None, {}
    s2 = 2 * res.cost / (n - k)
    try:
        cov = s2 * np.linalg.inv(res.jac.T @ res.jac)
    except np.linalg.LinAlgError:
        return {}, None, {}
    half = stats.t.ppf(0.5 + confidence / 2, n - k) * np.sqrt(np.clip(np.diag(cov), 0, None))
    lo, hi = named_params(form, res.x - half), named_params(form, res.x + half)
    return {name: (min(lo[name], hi[name]), max(lo[name], hi[name])) for name in lo}, cov, dict.fromkeys(lo, n - k)


def band(f, depth, confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """`Fit.band` of the fit `f`: the pointwise interval of its curve by its interval method (the bootstrap's
    percentiles of the refitted curves, else a t-interval by the delta method with the CR2 or OLS covariance)."""
    depth = np.asarray(depth, dtype=float)
    nan = np.full(depth.shape, np.nan)
    lx = np.log(depth)
    if f.boot is None or not len(f.boot):
        if f.cov is None:
            return nan, nan
        lo, hi = nan.copy(), nan.copy()
        for i, point in enumerate(lx.ravel()):
            grad = _gradient(f, point)
            pred = float(f._form.predict(f._theta, np.array([point]))[0])
            df = f._sandwich.df(grad) if f._sandwich is not None else f.n - len(f._theta)
            se = math.sqrt(max(float(grad @ f.cov @ grad), 0.0))
            half = stats.t.ppf(0.5 + confidence / 2, df) * se if np.isfinite(df) else math.nan
            lo.flat[i], hi.flat[i] = pred - half, pred + half
        return lo, hi
    curves = np.array([f._form.predict(t, lx) for t in f.boot])
    a = (1 - confidence) / 2
    return np.quantile(curves, a, axis=0), np.quantile(curves, 1 - a, axis=0)


def _gradient(f, point: float) -> np.ndarray:
    """d prediction / d theta at ln D = point (central differences; exact for the linear forms)."""
    theta, at = f._theta, np.array([point])
    grad = np.empty(len(theta))
    for j in range(len(theta)):
        h = 1e-6 * max(1.0, abs(theta[j]))
        up, down = theta.copy(), theta.copy()
        up[j] += h
        down[j] -= h
        grad[j] = (f._form.predict(up, at)[0] - f._form.predict(down, at)[0]) / (2 * h)
    return grad
