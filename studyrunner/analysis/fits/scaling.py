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
  one fit (an interval from the paired t beside an estimate from the fit could exclude it, and Welch over
  cell values with several cells at a depth would ignore the seeds). With one seed,
  the classical OLS t-interval (n − p degrees of freedom).
- `bootstrap`: the percentile bootstrap of seeds within strata (refitting each draw); at 2 seeds a
  cell it hardly varies and covered the true slope 58% of the time at 2×2 (nominal 95%). Kept as an option.

Where it lives (this package, `studyrunner.analysis.fits`): the forms and their least-squares solve in `forms`;
the interval methods in `intervals` (the CR2 sandwich and Bell-McCaffrey degrees of freedom in `robust`); here
the fit itself, its scores, and the study-level fits (points from a study, every form ranked, fits per group
with slope ratios).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from ..data import StudyData, depth_at_loops, loops_columns
from ..stats import CONFIDENCE
from . import intervals, robust
from .forms import FORMS, Form, bound_flags, get_form, named_params, solve
from .intervals import bootstrap_intervals, cr2_intervals, ols_intervals

CI_METHODS = ("cr2", "bootstrap")
DEFAULT_CI = "cr2"


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
        return intervals.band(self, depth, confidence)

    def row(self) -> dict:
        out = {"form": self.form, "n": self.n, "r2": self.r2, "rmse": self.rmse, "aic": self.aic, "bic": self.bic}
        for name, value in self.params.items():
            lo, hi = self.param_ci.get(name, (math.nan, math.nan))
            out.update({name: value, f"{name}_lo": lo, f"{name}_hi": hi})
        out["extrapolation_error"] = self.extrapolation_error
        out["ci"] = self.ci_method
        out["flags"] = "; ".join(self.flags)
        return out


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
    res = solve(f, lx, y, loss, f_scale)
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
        params=named_params(f, theta),
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
        flags=bound_flags(f, theta, lx, y),
    )
    ci = ci or DEFAULT_CI
    if ci not in CI_METHODS:
        raise ValueError(f"unknown interval method {ci!r}; methods: {', '.join(CI_METHODS)}")
    if ci == "bootstrap":
        bootstrap_intervals(out, f, res, lx, strata, loss, f_scale, n_boot, confidence)
    elif clusters is not None:
        out.clusters = np.asarray(clusters)[ok]
        cr2_intervals(out, f, res, lx, out.clusters, confidence)
    if not out.param_ci:  # no seeds given, or one seed: the classical interval
        out.param_ci, out.cov, out.df = ols_intervals(f, res, len(y), confidence)
        out.ci_method = "OLS t (equal noise assumed)" if out.param_ci else ""
    if extrapolate:
        out.extrapolation_error = _leave_largest_out(f, x, y, loss, f_scale)
    return out


def _leave_largest_out(form: Form, x, y, loss, f_scale) -> float:
    top = x.max()
    keep = x < top
    if len(np.unique(x[keep])) < max(2, len(form.params)) or keep.sum() < len(form.params):
        return math.nan
    res = solve(form, np.log(x[keep]), y[keep], loss, f_scale)
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
