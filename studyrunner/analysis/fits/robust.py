"""Cluster-robust least-squares inference with few clusters: the CR2 sandwich and Bell-McCaffrey degrees
of freedom (Bell & McCaffrey 2002; Imbens & Kolesár 2016, "Robust standard errors in small samples").

statsmodels offers CR1 (`cov_type="cluster"`) with G − 1 degrees of freedom, which undercovers badly with
the 2-5 seeds (clusters) a study runs; R's clubSandwich has CR2 but no Python package does, so the few lines
are here. CR2 scales each cluster's residuals by (I − H_gg)^(-1/2), which makes the variance unbiased when
the errors are homoskedastic; the degrees of freedom are those of the Satterthwaite approximation to the
distribution of c'V c under that working model, computed per contrast c.

Below it, what `verify` tests of fitted coefficients: a slope (`coefficient`) and the difference of two
slopes in one regression with an interaction (`slope_difference`), each as an estimate, se and df.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

_TINY = 1e-12


@dataclass
class Sandwich:
    """CR2 covariance of least-squares coefficients, and the pieces for per-contrast degrees of freedom."""

    cov: np.ndarray  # k x k
    parts: np.ndarray  # G x n x k: (I − H)[:, g] A_g X_g (X'X)^-1 per cluster g
    clusters: int

    def se(self, c) -> float:
        c = np.asarray(c, dtype=float)
        return math.sqrt(max(float(c @ self.cov @ c), 0.0))

    def df(self, c) -> float:
        """Bell-McCaffrey degrees of freedom of contrast c (at least 1)."""
        g = self.parts @ np.asarray(c, dtype=float)  # G x n
        b = g @ g.T
        denom = float(np.sum(b * b))
        return max(float(np.trace(b)) ** 2 / denom, 1.0) if denom > 0 else math.nan

    def interval(self, c, estimate: float, confidence: float) -> tuple[float, float]:
        half = stats.t.ppf(0.5 + confidence / 2, self.df(c)) * self.se(c)
        return estimate - half, estimate + half


def cr2(X: np.ndarray, residuals: np.ndarray, clusters) -> Sandwich | None:
    """The CR2 sandwich of the least-squares fit with design X (n x k) and residuals, clustered by the
    labels in `clusters` (n). None with fewer than two clusters (a sandwich would be zero)."""
    X = np.asarray(X, dtype=float)
    e = np.asarray(residuals, dtype=float)
    labels = pd.factorize(np.asarray(clusters), sort=False)[0]
    n_clusters = int(labels.max()) + 1 if len(labels) else 0
    if n_clusters < 2:
        return None
    bread = np.linalg.pinv(X.T @ X)
    M = np.eye(len(X)) - X @ bread @ X.T
    meat = np.zeros((X.shape[1], X.shape[1]))
    parts = []
    for g in range(n_clusters):
        idx = np.flatnonzero(labels == g)
        w, V = np.linalg.eigh(M[np.ix_(idx, idx)])
        # the pseudo-inverse square root where a cluster holds all of a parameter's information (w = 0)
        A = V @ np.diag(np.where(w > _TINY, 1 / np.sqrt(np.clip(w, _TINY, None)), 0.0)) @ V.T
        AX = A @ X[idx]
        u = AX.T @ e[idx]
        meat += np.outer(u, u)
        parts.append(M[:, idx] @ AX @ bread)
    return Sandwich(bread @ meat @ bread, np.stack(parts), n_clusters)


# --- tests of fitted coefficients (claims) -----------------------------------------------------


def slope_difference(a: tuple, b: tuple, log_x: bool = True) -> dict | None:
    """α_a − α_b of two straight-line fits, each side given as (x, y, seeds): one regression with a
    side indicator and its interaction, y = β + α·x + g·(β' + α'·x), so seeds shared by both sides are
    one cluster; CR2 by seed (OLS with one seed). {estimate, se, df, method}; None with fewer than two
    distinct x a side."""
    xs, ys, cs, side = [], [], [], []
    for g, (x, y, seeds) in enumerate((a, b)):
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        ok = np.isfinite(x) & np.isfinite(y) & ((x > 0) if log_x else True)
        if len(np.unique(x[ok])) < 2:
            return None
        xs.append(np.log(x[ok]) if log_x else x[ok])
        ys.append(y[ok])
        cs.append(np.asarray(seeds)[ok])
        side.append(np.full(ok.sum(), float(g)))
    x, y, g, seeds = map(np.concatenate, (xs, ys, side, cs))
    X = np.column_stack([np.ones_like(x), x, g, g * x])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    c = np.array([0.0, 0.0, 0.0, -1.0])  # α_a − α_b = −α'
    estimate = float(c @ coef)
    resid = y - X @ coef
    sandwich = cr2(X, resid, seeds)
    if sandwich is not None:
        return {
            "estimate": estimate,
            "se": sandwich.se(c),
            "df": sandwich.df(c),
            "method": f"CR2 t by seed ({sandwich.clusters} seeds)",
        }
    df = len(y) - 4
    if df < 1:
        return None
    se = math.sqrt(float(resid @ resid) / df * float(c @ np.linalg.pinv(X.T @ X) @ c))
    return {"estimate": estimate, "se": se, "df": float(df), "method": "OLS t (one seed)"}


def coefficient(f, name: str) -> dict:
    """The fit's parameter `name` as {estimate, se, df, method}: from its CR2 sandwich by seed, else the
    classical OLS covariance (one seed); se and df NaN when the fit has neither."""
    estimate = f.params[name]
    i = f._form.params.index(name) if f._form is not None and name in f._form.params else None
    if i is None or f.cov is None:
        return {"estimate": estimate, "se": math.nan, "df": math.nan, "method": f.ci_method}
    c = np.eye(len(f._theta))[i]
    se = math.sqrt(max(float(c @ f.cov @ c), 0.0))
    return {"estimate": estimate, "se": se, "df": f.df.get(name, math.nan), "method": f.ci_method}
