"""Scaling fits of a metric against effective depth D (shared/reference/anchors_platforms.md §4).

Forms (fitted with `scipy.optimize.least_squares`; `loss="huber"` or `"soft_l1"` for robustness):

- `loglinear`:   y = α·ln D + β                                (seed 002's form)
- `logistic`:    y = c + (top − c) / (1 + exp(−k·(ln D − m)))   (accuracies that saturate; the ceiling top
                 is fitted within [largest mean y at one D, 1 or 100]; `top=` fixes it)
- `power_floor`: y = E + A·D^(−γ)                               (losses; fitted in log space as
                 ln y = logsumexp(e, a − γ·ln D), Chinchilla's approach 3)

A fit whose parameter rests on a bound (the logistic's midpoint far outside the data, its steepness at
±50, its ceiling at either end) carries `flags` ("at bound: m"): it ranks after unflagged fits.

Every form is scored in y space (R², RMSE, AIC and BIC through statsmodels' information criteria on the
Gaussian likelihood), so forms can be compared. The extrapolation error refits without the largest D and
predicts it.

Intervals (`ci=`), chosen to hold their level at the 2-5 seeds per cell that studies run
(`tests/test_analysis_coverage.py` checks it by simulation; `python -m benchmarks coverage` prints the table):

- `cr2` (default): a t-interval from the cluster-robust sandwich with the CR2 small-sample correction,
  clustered by seed (the same seed means the same initialisation and data stream in every cell, so a
  seed's points are not independent), with Bell-McCaffrey degrees of freedom (Imbens & Kolesár 2016);
  statsmodels has CR1 with G−1 degrees of freedom only, which undercovers with 2-5 clusters. Nonlinear
  forms use the Jacobian at the optimum as the design. The seed stays the unit of replication however
  many cells share a depth: with two distinct D and every seed at both, CR2 by seed is exactly the paired
  t over per-seed depth means (df = seeds − 1), so a slope claim over two depths and the pairwise claim
  on the same cells agree; with a seed missing at one depth the estimate and interval both come from the
  one fit (an earlier rule took the interval from the paired t and the estimate from the fit, and fell
  back to Welch over cell values with several cells at a depth, which ignored the seeds). With one seed,
  the classical OLS t-interval (n − p degrees of freedom).
- `bootstrap`: the earlier percentile bootstrap of seeds within strata (refitting each draw); at 2 seeds a
  cell it hardly varies and covered the true slope 58% of the time at 2×2 (nominal 95%). Kept as an option.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pandas as pd
from scipy import stats
from scipy.optimize import least_squares
from scipy.special import expit, logsumexp

from . import robust
from .data import StudyData, depth_at_loops, loops_columns
from .stats import CONFIDENCE, SEED

N_BOOT = 1000  # bootstrap refits (closed-form log-linear fits); nonlinear forms use NONLINEAR_BOOT
NONLINEAR_BOOT = 200
CI_METHODS = ("cr2", "bootstrap")
DEFAULT_CI = "cr2"


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


@dataclass
class Fit:
    form: str
    formula: str
    params: dict[str, float]
    n: int
    rss: float
    r2: float
    rmse: float
    aic: float
    bic: float
    param_ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    ci_method: str = ""
    cov: np.ndarray | None = field(default=None, repr=False)  # of the fitted (internal) parameters
    df: dict[str, float] = field(default_factory=dict)  # t degrees of freedom per parameter
    extrapolation_error: float = math.nan  # observed mean at the largest D minus the prediction fitted without it
    # why the fit is not to be trusted, e.g. "at bound: m" (a parameter resting on its bound); flagged
    # fits rank after unflagged ones and are never the best form
    flags: list[str] = field(default_factory=list)
    x: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False)
    y: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False)
    boot: np.ndarray | None = field(default=None, repr=False)  # bootstrap thetas (rows)
    _form: Form | None = field(default=None, repr=False)
    _theta: np.ndarray | None = field(default=None, repr=False)
    _sandwich: robust.Sandwich | None = field(default=None, repr=False)
    clusters: np.ndarray | None = field(default=None, repr=False)  # seed of each point (x, y), when given
    trial_keys: np.ndarray | None = field(default=None, repr=False)  # trial of each point, when the caller sets it

    def predict(self, depth) -> np.ndarray:
        return self._form.predict(self._theta, np.log(np.asarray(depth, dtype=float)))

    @property
    def residuals(self) -> np.ndarray:
        return self.y - self.predict(self.x)

    def band(self, depth, confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
        """Pointwise interval of the fitted curve: the fit's interval method applied to the prediction at
        each depth (delta method for nonlinear forms); NaN where the fit has no interval."""
        depth = np.asarray(depth, dtype=float)
        nan = np.full(depth.shape, np.nan)
        lx = np.log(depth)
        if self.boot is None or not len(self.boot):
            if self.cov is None:
                return nan, nan
            lo, hi = nan.copy(), nan.copy()
            for i, point in enumerate(lx.ravel()):
                grad = self._gradient(point)
                pred = float(self._form.predict(self._theta, np.array([point]))[0])
                df = self._sandwich.df(grad) if self._sandwich is not None else self.n - len(self._theta)
                se = math.sqrt(max(float(grad @ self.cov @ grad), 0.0))
                half = stats.t.ppf(0.5 + confidence / 2, df) * se if np.isfinite(df) else math.nan
                lo.flat[i], hi.flat[i] = pred - half, pred + half
            return lo, hi
        curves = np.array([self._form.predict(t, lx) for t in self.boot])
        a = (1 - confidence) / 2
        return np.quantile(curves, a, axis=0), np.quantile(curves, 1 - a, axis=0)

    def _gradient(self, point: float) -> np.ndarray:
        """d prediction / d theta at ln D = point (central differences; exact for the linear forms)."""
        theta, at = self._theta, np.array([point])
        grad = np.empty(len(theta))
        for j in range(len(theta)):
            h = 1e-6 * max(1.0, abs(theta[j]))
            up, down = theta.copy(), theta.copy()
            up[j] += h
            down[j] -= h
            grad[j] = (self._form.predict(up, at)[0] - self._form.predict(down, at)[0]) / (2 * h)
        return grad

    def row(self) -> dict:
        out = {"form": self.form, "n": self.n, "r2": self.r2, "rmse": self.rmse, "aic": self.aic, "bic": self.bic}
        for name, value in self.params.items():
            lo, hi = self.param_ci.get(name, (math.nan, math.nan))
            out.update({name: value, f"{name}_lo": lo, f"{name}_hi": hi})
        out["extrapolation_error"] = self.extrapolation_error
        out["ci"] = self.ci_method
        out["flags"] = "; ".join(self.flags)
        return out


def _solve(form: Form, lx: np.ndarray, y: np.ndarray, loss: str, f_scale: float, starts=None):
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


def _information(n: int, k: int, rss: float) -> tuple[float, float]:
    from statsmodels.tools.eval_measures import aic, bic

    if n <= 0 or rss <= 0:
        return (-math.inf, -math.inf) if n > 0 else (math.nan, math.nan)
    llf = -n / 2 * (math.log(2 * math.pi) + math.log(rss / n) + 1)
    return float(aic(llf, n, k)), float(bic(llf, n, k))


def fit(
    depth,
    y,
    form: str = "loglinear",
    strata=None,
    loss: str = "linear",
    f_scale: float = 1.0,
    n_boot: int | None = None,
    top: float | None = None,
    confidence: float = CONFIDENCE,
    extrapolate: bool = True,
    clusters=None,
    ci: str | None = None,
) -> Fit | None:
    """Fit `form` to points (D, y). `clusters` labels the points that share
    a seed, for the `cr2` interval; `strata` (default: D) groups the seeds the `bootstrap` interval
    resamples within. None when the form cannot be fitted (too few distinct D, non-positive y for
    power_floor)."""
    x = np.asarray(depth, dtype=float)
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0)
    x, y = x[ok], y[ok]
    strata = np.asarray(strata)[ok] if strata is not None else x
    f = get_form(form, y, top)
    if f is not None and f.name == "logistic" and "top" in f.params and len(np.unique(x)) < len(f.params):
        f = get_form(form, y, f.bounds(np.log(x), y)[1][-1])  # too few depths to fit the ceiling: fix it at the cap
    k = len(f.params) if f else 0
    if f is None or len(np.unique(x)) < max(2, k) or len(y) < k:
        return None
    lx = np.log(x)
    res = _solve(f, lx, y, loss, f_scale)
    if res is None:
        return None
    theta = res.x
    pred = f.predict(theta, lx)
    rss = float(np.sum((y - pred) ** 2))
    tss = float(np.sum((y - y.mean()) ** 2))
    aic_, bic_ = _information(len(y), k, rss)
    out = Fit(
        form=f.name,
        formula=f.formula,
        params=_named(f, theta),
        n=len(y),
        rss=rss,
        r2=1 - rss / tss if tss > 0 else math.nan,
        rmse=math.sqrt(rss / len(y)),
        aic=aic_,
        bic=bic_,
        x=x,
        y=y,
        _form=f,
        _theta=theta,
        flags=_bound_flags(f, theta, lx, y),
    )
    ci = ci or DEFAULT_CI
    if ci not in CI_METHODS:
        raise ValueError(f"unknown interval method {ci!r}; methods: {', '.join(CI_METHODS)}")
    if ci == "bootstrap":
        _bootstrap(out, f, res, lx, strata, loss, f_scale, n_boot, confidence)
    elif clusters is not None:
        out.clusters = np.asarray(clusters)[ok]
        _robust(out, f, res, lx, out.clusters, confidence)
    if not out.param_ci:  # no seeds given, or one seed: the classical interval
        out.param_ci, out.cov, out.df = _asymptotic(f, res, len(y), confidence)
        out.ci_method = "OLS t (equal noise assumed)" if out.param_ci else ""
    if extrapolate:
        out.extrapolation_error = _leave_largest_out(f, x, y, loss, f_scale)
    return out


def _bootstrap(out: Fit, f: Form, res, lx, strata, loss, f_scale, n_boot, confidence) -> None:
    """Percentile intervals from refits on seeds resampled within strata (the `bootstrap` option)."""
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
        r = _solve(f, lx[idx], y[idx], loss, f_scale, starts=[res.x])  # refit from the full-data optimum
        if r is not None:
            boot.append(r.x)
    if boot:
        out.boot = np.array(boot)
        a = (1 - confidence) / 2
        named = [_named(f, t) for t in out.boot]
        for name in f.params:
            vals = np.array([d[name] for d in named])
            out.param_ci[name] = (float(np.quantile(vals, a)), float(np.quantile(vals, 1 - a)))
        out.ci_method = f"bootstrap ({len(boot)} refits, stratified)"


def _robust(out: Fit, f: Form, res, lx, clusters, confidence) -> None:
    """CR2 t-intervals clustered by seed (see the module docstring)."""
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
    lo_n, hi_n = _named(f, np.array([lo[p] for p in f.params])), _named(f, np.array([hi[p] for p in f.params]))
    out.param_ci = {p: (min(lo_n[p], hi_n[p]), max(lo_n[p], hi_n[p])) for p in lo_n}
    out.df = {p: df[p] for p in lo_n}


def _bound_flags(form: Form, theta: np.ndarray, lx: np.ndarray, y: np.ndarray) -> list[str]:
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


def _named(form: Form, theta: np.ndarray) -> dict[str, float]:
    if form.name == "power_floor":
        e, a, g = theta
        return {"E": float(np.exp(e)), "A": float(np.exp(a)), "gamma": float(g)}
    return {name: float(v) for name, v in zip(form.params, theta, strict=True)}


def _asymptotic(form: Form, res, n: int, confidence: float):
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
    lo, hi = _named(form, res.x - half), _named(form, res.x + half)
    return {name: (min(lo[name], hi[name]), max(lo[name], hi[name])) for name in lo}, cov, dict.fromkeys(lo, n - k)


def _leave_largest_out(form: Form, x, y, loss, f_scale) -> float:
    top = x.max()
    keep = x < top
    if len(np.unique(x[keep])) < max(2, len(form.params)) or keep.sum() < len(form.params):
        return math.nan
    res = _solve(form, np.log(x[keep]), y[keep], loss, f_scale)
    if res is None:
        return math.nan
    return float(np.mean(y[~keep]) - form.predict(res.x, np.log(np.array([top])))[0])


# --- study-level helpers -------------------------------------------------------------------------


def scaling_points(data: StudyData, metric: str | None = None, source: str = "trained", successful: bool = True):
    """Points (trial, D, y) to fit: `trained` uses each trial's D (measured for halting families);
    `loops` uses the test-time depth columns `{metric}_loops_{n}` (eval.loops) of every trial."""
    metric = metric or data.metric
    done = data.done[~data.done.failed] if successful else data.done
    cols = ["trial_key", "cell_hash", "cell", "seed", "baseline", "depth", "y"]
    if source == "trained":
        if metric not in done:
            return pd.DataFrame(columns=cols)
        pts = done.assign(y=done[metric])
        return pts[[*cols[:-1], "y", *data.config_columns]].dropna(subset=["depth", "y"])
    rows = []
    for n, col in loops_columns(done, metric).items():
        part = done.assign(y=done[col], depth=done.apply(lambda r, n=n: depth_at_loops(r, n), axis=1))
        rows.append(part)
    if not rows:
        return pd.DataFrame(columns=cols)
    pts = pd.concat(rows, ignore_index=True)
    return pts[[*cols[:-1], "y", *data.config_columns]].dropna(subset=["depth", "y"])


def fit_forms(points: pd.DataFrame, forms=FORMS, strata: str = "depth", **kwargs) -> list[Fit]:
    """Every form that can be fitted to `points`, best BIC first (clustered by seed); flagged fits (a
    parameter at its bound) come after every unflagged one, so the first fit is a flagged one only when all are."""
    fits = [fit(points.depth, points.y, form, **_cluster_args(points, strata), **kwargs) for form in forms]
    fits = [f for f in fits if f is not None]
    return sorted(fits, key=lambda f: (bool(f.flags), f.bic if np.isfinite(f.bic) else -math.inf))


def _cluster_args(points: pd.DataFrame, strata: str = "depth") -> dict:
    seeds = points["seed"].to_numpy() if "seed" in points else None
    return {"strata": points[strata].to_numpy(), "clusters": seeds}


def fit_table(fits: list[Fit]) -> pd.DataFrame:
    return pd.DataFrame([f.row() for f in fits])


def fit_groups(
    points: pd.DataFrame, by: str, form: str = "loglinear", ref=None, param: str = "alpha", **kwargs
) -> pd.DataFrame:
    """Fit `form` per value of column `by`; the slope ratio param_group / param_ref with an interval (the
    bootstrap's percentiles of independent refits, or the delta method on ln ratio with the smaller of the
    two fits' degrees of freedom); ref defaults to the first group."""
    fits = {}
    for value, group in points.groupby(by, sort=False, dropna=False):
        f = fit(group.depth, group.y, form, **_cluster_args(group), **kwargs)
        if f is not None:
            fits[value] = f
    if not fits:
        return pd.DataFrame()
    ref = ref if ref in fits else next(iter(fits))
    rows = []
    for value, f in fits.items():
        row = {by: value, **f.row()}
        r = fits[ref]
        p, pr = f.params.get(param, math.nan), r.params.get(param, math.nan)
        row["ref"] = ref
        row["ratio"] = p / pr if pr else math.nan
        lo = hi = math.nan
        if f.boot is not None and r.boot is not None and value != ref:
            idx = f._form.params.index(param) if param in f._form.params else None
            if idx is not None:
                m = min(len(f.boot), len(r.boot))
                with np.errstate(all="ignore"):
                    ratios = f.boot[:m, idx] / r.boot[:m, idx]
                ratios = ratios[np.isfinite(ratios)]
                if len(ratios):
                    lo, hi = np.quantile(ratios, [(1 - CONFIDENCE) / 2, 1 - (1 - CONFIDENCE) / 2])
        elif value != ref and f.cov is not None and r.cov is not None and param in f._form.params and p * pr > 0:
            lo, hi = _ratio_interval(f, r, param)
        row["ratio_lo"], row["ratio_hi"] = float(lo), float(hi)
        rows.append(row)
    return pd.DataFrame(rows)


def _ratio_interval(f: Fit, r: Fit, param: str) -> tuple[float, float]:
    """Delta method on ln(p_f / p_r), the fits independent; t with the smaller degrees of freedom."""
    i = f._form.params.index(param)
    pf, pr = f._theta[i], r._theta[i]
    # an exact fit's variances can come out as -1e-33 rather than 0: rounding, not a negative variance
    se = math.sqrt(max(0.0, f.cov[i, i] / pf**2 + r.cov[i, i] / pr**2))
    df = min(f.df.get(param, math.nan), r.df.get(param, math.nan))
    if not np.isfinite(df):
        return math.nan, math.nan
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, df) * se
    return float(pf / pr * math.exp(-half)), float(pf / pr * math.exp(half))


def failure_vs_depth(data: StudyData) -> dict[str, float]:
    """p_fail(D) by logistic regression on ln D (statsmodels); empty when failures do not vary."""
    import statsmodels.api as sm

    done = data.done.dropna(subset=["depth"])
    done = done[done.depth > 0]
    y = done.failed.astype(float).to_numpy()
    if len(done) < 3 or y.min() == y.max() or done.depth.nunique() < 2:
        return {}
    X = sm.add_constant(np.log(done.depth.to_numpy(float)))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = sm.GLM(y, X, family=sm.families.Binomial()).fit()
    except Exception:  # noqa: BLE001 - perfect separation and friends
        return {}
    lo, hi = res.conf_int()[1]
    if not np.isfinite(res.bse[1]) or res.bse[1] > 10:  # failures separate by depth: no identifiable slope
        return {}
    return {"slope": float(res.params[1]), "slope_lo": float(lo), "slope_hi": float(hi), "n": len(y)}
