"""Seeds needed: how many seeds per side a claim's own test needs to reach 80% power.

`seeds_needed(data, claim)` answers for the test `verify` used on that claim (`claims.evaluate` records
its inputs) at the study's current design: the same pairing, cells per side and x values of a slope, for
the effect observed so far (`effect=None`) or a given one (a claim's `min_effect`), at one-sided alpha.
How, per test:

- t-tests (paired t, one-sample t, Welch; one- and two-sample Yuen): closed form, the noncentral t
  (power = P(T' > t_{1−alpha, df}), T' ~ t(df, δ/se(n))), with the spread observed so far: the sd of the
  per-seed differences, of the seeds, of each side (Welch's df), the winsorised sd (Yuen).
- The CR2 slope test: closed form on per-seed slopes. With every seed at every x, the CR2 t by seed is the
  one-sample t over the seeds' own least-squares slopes (Bell-McCaffrey df = seeds − 1), so its power is
  that t's with their sd. A difference of slopes: the per-seed slope differences (seeds shared), else
  a two-sample t over per-seed slopes.
- Exact tests of failure rates (binomial, McNemar, Fisher): exact enumeration of every outcome at n seeds
  a side, with the observed rates (McNemar: the observed shares failing on one side only).
- The exact sign test of a median: exact enumeration, P(a seed above the number) from a normal with the
  observed mean and sd.
- Randomisation tests (bimodal or tied seeds): simulation of the test itself (SIM_DRAWS draws of seeds
  resampled from those observed, shifted to the effect, a fixed seed) up to SIM_MAX_SEEDS; beyond, the
  closed form of the t-test it approaches (Lehmann & Romano, "Testing Statistical Hypotheses", 15.2).

The figure is an estimate: the spread (or rates) come from the few seeds run so far, and a spread from 2
or 3 seeds can be off by a factor of 2 or more either way. `verify`, `analyze`, the report and the JSON
output show it for every inconclusive claim (`fill`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from ...study.claims_grammar import Claim
from ...study.schema import ClaimEntry
from ..data import StudyData
from ..stats import _trimmed
from . import decide as claims_mod
from . import exact
from .verdict import VerdictKind

ALPHA = claims_mod.ALPHA
POWER = 0.8
MAX_SEEDS = 1000  # per side; beyond it `per_side` is None
SIM_DRAWS = 400
SIM_MAX_SEEDS = 12
SIM_SEED = 0


@dataclass
class SeedsNeeded:
    per_side: int | None  # seeds per side for `power` at `effect`; None: more than MAX_SEEDS (or never)
    effect: float  # the effect it was computed for, on the claim's scale (lhs − rhs, or lhs − number)
    spread: float | None  # the spread assumed (sd of the test's unit), None where the test has none
    method: str  # e.g. "closed form: noncentral t, paired", "exact enumeration, Fisher"
    note: str = ""  # what it rests on, e.g. "sd estimated from 2 seeds: an estimate"


def seeds_needed(
    data: StudyData,
    claim: Claim | ClaimEntry | str,
    *,
    effect: float | None = None,
    power: float = POWER,
    alpha: float = ALPHA,
) -> SeedsNeeded | None:
    """Seeds per side at which the claim's own test reaches `power` at one-sided `alpha`, for `effect`
    (None: the effect observed so far; a number: on the claim's scale, signed as lhs − rhs, or a positive
    size in the claimed direction). None where it cannot be said: an invalid claim, one no test decides
    (a mean against a number on bimodal seeds), a bootstrap of medians."""
    v = claims_mod.evaluate(data, claim, alpha)
    v = v if v.verdict != VerdictKind.PENDING or "design" in v.extra else None
    return _for_verdict(v, effect, power, alpha) if v is not None else None


def fill(data: StudyData, verdicts: list, power: float = POWER) -> list:
    """Set `seeds_needed` of every inconclusive verdict (and a pending one whose finished seeds are
    inconclusive so far): {"observed": SeedsNeeded as a dict, "min_effect": ... where the claim has one}."""
    for v in verdicts:
        state = v.extra.get("interim", v.verdict)
        if state != VerdictKind.INCONCLUSIVE or "design" not in v.extra:
            continue
        found = {"observed": _for_verdict(v, None, power, v.alpha)}
        if v.min_effect is not None:
            found["min_effect"] = _for_verdict(v, v.min_effect, power, v.alpha)
        found = {k: asdict(s) for k, s in found.items() if s is not None}
        v.seeds_needed = found or None
    return verdicts


def _for_verdict(v, effect: float | None, power: float, alpha: float) -> SeedsNeeded | None:
    design = v.extra.get("design")
    if design is None:
        return None
    if v.extra.get("tost") is not None:
        return _tost(v, effect, power, alpha)
    greater = design["greater"]
    if effect is None:
        effect = _observed(v, design)
    elif (effect > 0) != greater:  # a size given positive: in the claimed direction
        effect = abs(effect) if greater else -abs(effect)
    if not np.isfinite(effect):
        return None
    # A non-inferiority claim tests lhs − rhs against its margin's −δ (or +δ), `shift`: its test sees the effect
    # from there (a true difference of 0 is δ from the null of `A >= B, margin δ`)
    shift = float(design.get("shift", 0.0))
    solver = _SOLVERS[design["test"]]
    found = solver(design, effect - shift, power, alpha)
    if found is None:
        return None
    found.effect = effect
    effect = effect - shift
    if (effect > 0) != greater or effect == 0:
        found.per_side = None
        found.note = "; ".join(
            filter(
                None,
                [
                    f"the effect {effect:+.3g} is not in the claimed direction: no number of seeds "
                    "supports the claim at it",
                    found.note,
                ],
            )  # fmt: skip
        )
    return found


def _tost(v, effect: float | None, power: float, alpha: float) -> SeedsNeeded | None:
    """An equivalence claim's seeds per side: both one-sided tests (TOST) must reject, at the true difference
    `effect` (None: the one observed). Closed form for the t-tests (one-sample or paired, Welch), by the usual
    bound P(both) >= P(lower) + P(upper) − 1 over the two noncentral t's; None for the others."""
    lower, upper = v.extra["tost"]["lower"], v.extra["tost"]["upper"]
    if lower is None or upper is None or lower["test"] not in ("t1", "welch"):
        return None
    theta = v.estimate if effect is None else effect
    delta = v.margin
    if not (np.isfinite(theta) and delta) or abs(theta) >= delta:
        return SeedsNeeded(None, theta, None, "closed form: TOST (two noncentral t)",
                           f"a true difference {theta:+.3g} at or beyond the margin ±{delta:g}: equivalence "
                           "cannot be shown at it")  # fmt: skip
    n = np.arange(2, MAX_SEEDS + 1)
    if lower["test"] == "t1":
        sd = _sd(lower["x"])
        if not np.isfinite(sd) or sd <= 0:
            return None
        se, df, spread, used = sd / np.sqrt(n), n - 1.0, sd, len(lower["x"])
    else:
        sa, sb = _sd(lower["a"]), _sd(lower["b"])
        if not (np.isfinite(sa) and np.isfinite(sb)) or sa + sb <= 0:
            return None
        va, vb = sa**2 / n, sb**2 / n
        se, df = np.sqrt(va + vb), (va + vb) ** 2 / (va**2 / (n - 1) + vb**2 / (n - 1))
        spread, used = math.sqrt((sa**2 + sb**2) / 2), min(len(lower["a"]), len(lower["b"]))
    both = _t_power(df, (theta + delta) / se, alpha) + _t_power(df, (delta - theta) / se, alpha) - 1
    found = _first(n, both, power)
    if found is not None and lower.get("span") is not None:  # a number on a bounded metric: both gates too
        for side in (lower, upper):
            gated = _with_gate(SeedsNeeded(found, theta, spread, ""), side, theta - side.get("shift", 0.0), alpha)
            found = gated.per_side if gated.per_side is not None else None
            if found is None:
                break
    return SeedsNeeded(found, theta, spread, "closed form: TOST (two noncentral t, P(both) >= P(lower) + "
                       "P(upper) - 1)", _spread_note(used))  # fmt: skip


def _observed(v, design) -> float:
    if design["test"] in ("mcnemar", "fisher"):
        return v.lhs - v.rhs  # the rate difference (Fisher's interval is on the odds-ratio scale)
    return v.estimate


# --- closed forms: the noncentral t ------------------------------------------------------------------------


def _first(n: np.ndarray, power: np.ndarray, target: float) -> int | None:
    ok = np.flatnonzero(power >= target)
    return int(n[ok[0]]) if len(ok) else None


def _t_power(df, ncp, alpha: float) -> np.ndarray:
    """One-sided power of a t-test in the effect's direction (ncp > 0)."""
    df = np.maximum(np.asarray(df, dtype=float), 1e-9)
    return stats.nct.sf(stats.t.ppf(1 - alpha, df), df, np.abs(ncp))


def _sd(x) -> float:
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    return float(x.std(ddof=1)) if len(x) >= 2 else math.nan


def _spread_note(n: int, what: str = "sd") -> str:
    return f"an estimate: the {what} comes from {n} seed{'s' if n != 1 else ''}"


def _one_sample(design, effect, power, alpha, x=None, label="one-sample") -> SeedsNeeded | None:
    x = design["x"] if x is None else x
    sd = _sd(x)
    if not np.isfinite(sd) or sd <= 0:
        return None
    n = np.arange(2, MAX_SEEDS + 1)
    found = _first(n, _t_power(n - 1, effect * np.sqrt(n) / sd, alpha), power)
    return SeedsNeeded(found, effect, sd, f"closed form: noncentral t, {label}", _spread_note(len(x)))


def _t1(design, effect, power, alpha):
    label = "paired (per-seed differences)" if "d" in design or design.get("paired") else "one-sample"
    found = _one_sample(design, effect, power, alpha, label=label)
    if found is not None and design.get("span") is not None:
        found = _with_gate(found, design, effect, alpha)
    return found


def _with_gate(found: SeedsNeeded, design: dict, effect: float, alpha: float) -> SeedsNeeded:
    """An accuracy against a number is decided only where the distribution-free gate (analysis/claims/bounded.py) passes
    too: its all-in bet grows by (m − lo) / (c − lo) a seed at a mean m = c + effect (the most it can grow on
    average), so it needs at least log(1/alpha) / log of that."""
    (lo, hi), c = design["span"], design["null"]
    if not (c - lo > 0 and hi - c > 0):  # a number at or beyond the range: the gate decides at once
        return found
    ratio = (c + effect - lo) / (c - lo) if effect > 0 else (hi - c - effect) / (hi - c)
    gate = math.ceil(math.log(1 / alpha) / math.log(ratio)) if ratio > 1 else None
    if gate is None or gate > MAX_SEEDS:
        found.per_side = None
    elif found.per_side is not None:
        found.per_side = max(found.per_side, gate)
    found.method += "; and the distribution-free bound's seeds at that mean (closed form: the all-in bet's growth)"
    return found


def _welch(design, effect, power, alpha):
    a, b = design["a"], design["b"]
    sa, sb = _sd(a), _sd(b)
    if not (np.isfinite(sa) and np.isfinite(sb)) or sa + sb <= 0:
        return None
    n = np.arange(2, MAX_SEEDS + 1)
    va, vb = sa**2 / n, sb**2 / n
    df = (va + vb) ** 2 / (va**2 / (n - 1) + vb**2 / (n - 1))
    found = _first(n, _t_power(df, effect / np.sqrt(va + vb), alpha), power)
    sd = math.sqrt((sa**2 + sb**2) / 2)
    return SeedsNeeded(found, effect, sd, "closed form: noncentral t, Welch", _spread_note(min(len(a), len(b)), "sds"))


def _yuen_se(var_w: float, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`stats.yuen_one`'s se at n seeds (the winsorised variance held fixed), and the h values kept."""
    h = n - 2 * np.floor(0.25 * n)
    return np.sqrt((n - 1) * var_w / (h * (h - 1))), h


def _yuen1(design, effect, power, alpha):
    x = np.sort(np.asarray(design["x"], dtype=float))
    if len(x) < 2:
        return None
    _, var_w, _, _ = _trimmed(x)
    if var_w <= 0:
        return None
    n = np.arange(2, MAX_SEEDS + 1)
    se, h = _yuen_se(var_w, n)
    found = _first(n, _t_power(h - 1, effect / se, alpha), power)
    return SeedsNeeded(found, effect, math.sqrt(var_w), "closed form: noncentral t, Yuen (winsorised sd)",
                       _spread_note(len(x), "winsorised sd"))  # fmt: skip


def _yuen2(design, effect, power, alpha):
    a, b = np.sort(np.asarray(design["a"], dtype=float)), np.sort(np.asarray(design["b"], dtype=float))
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = _trimmed(a)[1], _trimmed(b)[1]
    if va + vb <= 0:
        return None
    n = np.arange(2, MAX_SEEDS + 1)
    h = n - 2 * np.floor(0.25 * n)
    da, db = (n - 1) * va / (h * (h - 1)), (n - 1) * vb / (h * (h - 1))
    df = (da + db) ** 2 / (da**2 / (h - 1) + db**2 / (h - 1))
    found = _first(n, _t_power(df, effect / np.sqrt(da + db), alpha), power)
    sd = math.sqrt((va + vb) / 2)
    return SeedsNeeded(found, effect, sd, "closed form: noncentral t, Yuen two-sample (winsorised sds)",
                       _spread_note(min(len(a), len(b)), "winsorised sds"))  # fmt: skip


# --- slopes: per-seed slopes --------------------------------------------------------------------------


def _per_seed_slopes(x, y, seeds) -> dict:
    out = {}
    for s in np.unique(seeds):
        m = seeds == s
        if len(np.unique(x[m])) >= 2:
            out[s] = float(np.polyfit(x[m], y[m], 1)[0])
    return out


def _slope(design, effect, power, alpha):
    x, y, seeds = (np.asarray(design[k]) for k in ("x", "y", "seeds"))
    slopes = np.array(list(_per_seed_slopes(x.astype(float), y.astype(float), seeds).values()))
    if len(slopes) < 2:  # seeds with one point each (no repeat): no per-seed slope
        return None
    found = _one_sample({"x": slopes}, effect, power, alpha, label="the CR2 slope test (per-seed slopes)")
    if found is not None:
        found.note = _spread_note(len(slopes), "sd of the per-seed slopes") + "; seeds at every x of the design"
    return found


def _slope_diff(design, effect, power, alpha):
    (xa, ya, sa), (xb, yb, sb) = design["a"], design["b"]
    if sa is None or sb is None:
        return None
    pa = _per_seed_slopes(np.asarray(xa, float), np.asarray(ya, float), np.asarray(sa))
    pb = _per_seed_slopes(np.asarray(xb, float), np.asarray(yb, float), np.asarray(sb))
    shared = sorted(set(pa) & set(pb))
    if len(shared) >= 2:
        d = np.array([pa[s] - pb[s] for s in shared])
        return _one_sample({"x": d}, effect, power, alpha, label="CR2 slope difference (per-seed slope differences)")
    return _welch({"a": np.array(list(pa.values())), "b": np.array(list(pb.values()))}, effect, power, alpha)


# --- exact tests: enumeration ------------------------------------------------------------------------------


def _search(power_at, target: float, lowest: int = 1) -> int | None:
    """The smallest n in [lowest, MAX_SEEDS] with power_at(n) >= target: every n up to 64, then doubling
    and bisection (exact tests' power saws up and down by a little with n; this finds the first n of the
    rise, not always the very first that crosses)."""
    for n in range(lowest, min(64, MAX_SEEDS) + 1):
        if power_at(n) >= target:
            return n
    lo, hi = 64, 128
    while power_at(hi) < target:
        lo, hi = hi, hi * 2
        if lo >= MAX_SEEDS:
            return None
    hi = min(hi, MAX_SEEDS)
    if power_at(hi) < target:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if power_at(mid) >= target else (mid, hi)
    return hi


def _binomial(design, effect, power, alpha):
    c, greater = design["null"], design["greater"]
    rate = c + effect
    if not 0 <= rate <= 1:
        return None

    def power_at(n):
        k = np.arange(n + 1)
        p = stats.binom.sf(k - 1, n, c) if greater else stats.binom.cdf(k, n, c)
        return float(stats.binom.pmf(k, n, rate)[p < alpha].sum())

    return SeedsNeeded(_per_cell(_search(power_at, power), design), effect, None, "exact enumeration, binomial test",
                       f"an estimate: the failure rate {rate:.3g} assumed" + _cells_note(design))  # fmt: skip


def _mcnemar(design, effect, power, alpha):
    n0, only_a, only_b, greater = design["n"], design["only_a"], design["only_b"], design["greater"]
    discordant = (only_a + only_b) / n0
    if discordant <= 0:
        return SeedsNeeded(None, effect, None, "exact enumeration, McNemar",
                           "no seed failed on one side only yet: the discordant share is unknown")  # fmt: skip
    # keep the observed share of discordant seeds; the effect is π_a − π_b
    pa, pb = (discordant + effect) / 2, (discordant - effect) / 2
    if pa < 0 or pb < 0 or pa + pb > 1:
        return None
    from scipy.special import gammaln

    def power_at(n):
        b, c = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
        ok = b + c <= n
        b, c = b[ok], c[ok]
        rest = n - b - c
        with np.errstate(divide="ignore"):
            logp = (gammaln(n + 1) - gammaln(b + 1) - gammaln(c + 1) - gammaln(rest + 1)
                    + b * np.log(pa) + c * np.log(pb) + rest * np.log(max(1 - pa - pb, 1e-300)))  # fmt: skip
        m = b + c
        pv = stats.binom.sf(b - 1, m, 0.5) if greater else stats.binom.cdf(b, m, 0.5)
        pv = np.where(m > 0, pv, 1.0)
        return float(np.exp(logp)[pv < alpha].sum())

    return SeedsNeeded(_search(power_at, power), effect, None, "exact enumeration, McNemar",
                       f"an estimate: {discordant:.2g} of seeds failing on one side only, as observed")  # fmt: skip


def _fisher(design, effect, power, alpha):
    greater = design["greater"]
    rb = design["k2"] / design["n2"]
    ra = rb + effect
    if not 0 <= ra <= 1:
        return None

    def power_at(n):
        k1, k2 = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
        total = k1 + k2
        # one-sided Fisher p of "a fails more" (greater) or less: the hypergeometric tail of k1
        pv = stats.hypergeom.sf(k1 - 1, 2 * n, total, n) if greater else stats.hypergeom.cdf(k1, 2 * n, total, n)
        prob = np.outer(stats.binom.pmf(np.arange(n + 1), n, ra), stats.binom.pmf(np.arange(n + 1), n, rb))
        return float(prob[pv < alpha].sum())

    note = f"an estimate: failure rates {ra:.3g} vs {rb:.3g} assumed (the observed rhs rate)" + _cells_note(design)
    return SeedsNeeded(_per_cell(_search(power_at, power, 2), design), effect, None, "exact enumeration, Fisher", note)


def _per_cell(trials: int | None, design) -> int | None:
    """Seeds a side from the trials a failure rate counts: each seed adds one trial per cell of the side."""
    return None if trials is None else math.ceil(trials / max(design.get("cells", 1), 1))


def _cells_note(design) -> str:
    cells = design.get("cells", 1)
    return f"; {cells} cells a side, so each seed adds {cells} trials" if cells > 1 else ""


def _sign(design, effect, power, alpha):
    x, greater = np.asarray(design["x"], dtype=float), design["greater"]
    sd = _sd(x)
    if not np.isfinite(sd) or sd <= 0:
        return None
    above = stats.norm.cdf(effect / sd)  # P(a seed above the number), seeds ~ normal

    def power_at(n):
        k = np.arange(n + 1)
        p = stats.binom.sf(k - 1, n, 0.5) if greater else stats.binom.cdf(k, n, 0.5)
        return float(stats.binom.pmf(k, n, above)[p < alpha].sum())

    return SeedsNeeded(_search(power_at, power), effect, sd, "exact enumeration, sign test",
                       _spread_note(len(x)) + "; normal seeds assumed")  # fmt: skip


# --- randomisation tests: simulation ------------------------------------------------------------------------


def _simulated(draw, test, closed, effect, power, alpha, lowest: int, label: str) -> SeedsNeeded | None:
    """The smallest n (from `lowest`, the first n whose smallest p is below alpha) at which the test rejects
    in `power` of SIM_DRAWS simulated studies; beyond SIM_MAX_SEEDS, the closed form `closed`."""
    rng = np.random.default_rng(SIM_SEED)
    for n in range(lowest, SIM_MAX_SEEDS + 1):
        hits = 0
        for _ in range(SIM_DRAWS):
            res = test(*draw(n, rng))
            hits += res is not None and (res.p_up if effect > 0 else res.p_down) < alpha
        if hits / SIM_DRAWS >= power:
            return SeedsNeeded(n, effect, None, f"simulation of the {label}, {SIM_DRAWS} draws", "")
    found = closed()
    if found is None:
        return None
    found.per_side = max(found.per_side, SIM_MAX_SEEDS + 1) if found.per_side is not None else None
    found.method = f"closed form beyond {SIM_MAX_SEEDS} seeds (the {label} approaches the t-test): " + found.method
    return found


def _signflip(design, effect, power, alpha):
    d = np.asarray(design["d"], dtype=float)
    if len(d) < 2:
        return None
    centred = d - d.mean()

    def draw(n, rng):
        return (rng.choice(centred, n) + effect,)

    found = _simulated(draw, lambda d: exact.sign_flip(d, alpha), lambda: _one_sample({"x": d}, effect, power, alpha),
                       effect, power, alpha, _lowest(lambda n: 0.5**n, alpha), "exact sign-flip test")  # fmt: skip
    return _resampled(found, d)


def _perm2(design, effect, power, alpha):
    a, b = np.asarray(design["a"], dtype=float), np.asarray(design["b"], dtype=float)
    if len(a) < 2 or len(b) < 2:
        return None
    ca, cb = a - a.mean(), b - b.mean()

    def draw(n, rng):
        return rng.choice(ca, n) + effect, rng.choice(cb, n)

    found = _simulated(draw, lambda x, y: exact.two_sample(x, y, alpha), lambda: _welch(design, effect, power, alpha),
                       effect, power, alpha, _lowest(lambda n: 1 / math.comb(2 * n, n), alpha),
                       "permutation test")  # fmt: skip
    return _resampled(found, np.concatenate([ca, cb]))


def _slope_perm(design, effect, power, alpha):
    found = _slope(design, effect, power, alpha)
    if found is not None:
        x = np.asarray(design["x"], dtype=float)
        points = len(np.unique(x))
        lowest = _lowest(lambda n: 1 / math.factorial(points) ** n, alpha)
        found.per_side = max(found.per_side, lowest) if found.per_side is not None else None
        found.method = "closed form (the permutation test of the slope approaches the CR2 t): " + found.method
    return found


def _lowest(smallest_p, alpha: float) -> int:
    return next(n for n in range(1, 64) if smallest_p(n) < alpha)


def _resampled(found: SeedsNeeded | None, values: np.ndarray) -> SeedsNeeded | None:
    if found is not None and found.method.startswith("simulation"):
        found.spread = _sd(values)
        found.note = f"an estimate: seeds resampled from the {len(values)} values observed, shifted to the effect"
    return found


_SOLVERS = {
    "t1": _t1,
    "welch": _welch,
    "yuen1": _yuen1,
    "yuen2": _yuen2,
    "slope": _slope,
    "slope_diff": _slope_diff,
    "slope_perm": _slope_perm,
    "binomial": _binomial,
    "mcnemar": _mcnemar,
    "fisher": _fisher,
    "sign": _sign,
    "signflip": _signflip,
    "perm2": _perm2,
}
