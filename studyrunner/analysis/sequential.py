"""Sequential seeds: the looks of a group-sequential design over a study's claims (docs/analysis/sequential.md).

A study with `seeds: {start, max, step, spending}` runs the first `start` seeds of every cell, then looks: each
claim is decided from the recorded trials, and the cells its undecided claims select get `step` more seeds, until
every claim is decided or its cells reach `max`. Repeated looks at the data would inflate the false-positive rate
of a test run at α each time; a **group-sequential design with an alpha-spending function** (Lan & DeMets 1983)
holds it: each direction of a claim ("supported" in the claimed direction, "contradicted" in the other) is a
one-sided test at level ALPHA that may spend, by the information fraction t of a look, at most α(t) in all:

- O'Brien-Fleming type (default): α(t) = 2 − 2Φ(z_{1−α/2} / √t): almost nothing early, nearly α at the end;
- Pocock type: α(t) = α ln(1 + (e − 1) t): about evenly.

The information fraction of a look is the seeds per side the claim's test uses over those it would use at `max`
(a cell's seeds; a pooled side's trials over its cells × max), and 1 at a claim's last possible look (its cells
at `max`), so the last look spends what is left. The boundary c_k of look k (on the normal scale) solves
P(Z_1 < c_1, ..., Z_{k−1} < c_{k−1}, Z_k ≥ c_k) = α(t_k) − α(t_{k−1}) under the joint normal law of the looks'
statistics (corr(Z_i, Z_j) = √(t_i / t_j)), computed by the recursive numerical integration of Armitage,
McPherson & Rowe (1969; Jennison & Turnbull 2000, ch. 19) on the fractions the looks actually had. The boundary
becomes a **nominal one-sided level** 1 − Φ(c_k), and the claim's own test decides at it (`evaluate(...,
alpha=nominal)`: a t-test at its current degrees of freedom, an exact test with its exact p; Jennison & Turnbull
2000, §3.8 and ch. 11). The two directions are separate one-sided designs whose boundaries ignore the other's
stopping, so each holds its level (conservatively).

**Small seed counts.** t-statistics at 1-3 degrees of freedom re-estimate their variance at every look and cross
normal-theory levels a little more often (5.4-5.8% at one-sided 0.05); the boundaries are therefore computed at
a level α' calibrated by simulation (`calibrated_alpha`, fixed seed) so that a one-sample t-test holds α.

**Futility** (non-binding): a claim still undecided gets no more seeds when, were the effect its `min_effect`
(the drift from `analysis.power.seeds_needed`) or else the one seen so far, neither direction would cross by
`max` with conditional probability 10% or more (Lan, Simon & Halperin 1982). The boundaries never count on it,
so it cannot raise the false-positive rate; it costs power, which the simulation (benchmarks/sequential.py)
reports.

**p-values.** A decided or ended claim carries its *repeated p-value* (Jennison & Turnbull 2000, §9.1): the
smallest level at which the design would have crossed at its last look, rescaled by α / α'; it is below ALPHA
exactly when the claim crossed, and valid however the looks stopped (futility, other claims), so Holm across a
study's claims (`verify --holm`) takes it as it takes a fixed-sample p.

Everything here is a pure function of a StudyData (the ledger's rows at a look) and the earlier looks: no Ray,
no SQL. The runner (orchestrate/waves.py) calls `take_look` after each wave; the simulations call the same
`take_look` through `run_sequential`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import optimize
from scipy.special import ndtr
from scipy.stats import norm

from ..study.claims_grammar import Claim, Number, parse_claim
from ..study.schema import ClaimEntry
from . import claims as claims_module
from . import power as power_module
from .data import StudyData

SAMPLING, FUTILE, ENDED = "sampling", "futile", "inconclusive"
SUPPORTED, CONTRADICTED, INVALID = claims_module.SUPPORTED, claims_module.CONTRADICTED, claims_module.INVALID
DECIDED = (SUPPORTED, CONTRADICTED)
TERMINAL = (SUPPORTED, CONTRADICTED, FUTILE, ENDED, INVALID)  # a claim in one of these gets no more looks
SPENDING = ("obrien_fleming", "pocock")
FUTILITY_POWER = 0.8
GRID_POINTS = 241  # per look, Simpson's rule (odd); boundaries agree with scipy's multivariate normal to ~1e-6
SD_RANGE = 8.0  # the grid spans this many standard deviations below the boundary


ALPHA = claims_module.ALPHA


def claim_test(data: StudyData, claim: Claim, alpha: float = ALPHA) -> claims_module.Verdict:
    """The claim's own test (analysis/claims.py) decided at one-sided `alpha`, with `p_claimed` and `p_opposite`."""
    return claims_module.evaluate(data, claim, alpha=alpha)


def claim_specs(source) -> list[tuple[str, float | None]]:
    """(claim text, min_effect or None) of each claim of `source` (a StudyData or a Study: its `claims`, each a
    ClaimEntry, a mapping or a plain string)."""
    entries = [c if isinstance(c, ClaimEntry) else ClaimEntry.model_validate(c) for c in source.claims]
    return [(c.claim, c.min_effect) for c in entries]


# ------------------------------------------------------------------------------ spending and boundaries


def spent(kind: str, t: float, alpha: float = ALPHA) -> float:
    """α(t): the one-sided level a design may have spent by information fraction t (Lan & DeMets 1983)."""
    t = min(max(float(t), 0.0), 1.0)
    if t <= 0:
        return 0.0
    if kind == "obrien_fleming":
        return float(2 * norm.sf(norm.isf(alpha / 2) / math.sqrt(t)))
    if kind == "pocock":
        return float(alpha * math.log(1 + (math.e - 1) * t))
    raise ValueError(f"spending must be one of {', '.join(SPENDING)}, not {kind!r}")


def _pdf(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _simpson(lo: float, hi: float, n: int = GRID_POINTS) -> tuple[np.ndarray, np.ndarray]:
    x = np.linspace(lo, hi, n)
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4, 2
    return x, w * (hi - lo) / (n - 1) / 3


def _crossings(fractions: tuple[float, ...], bounds: tuple[float, ...]) -> list[float]:
    """P(Z_1 < c_1, ..., Z_{k−1} < c_{k−1}, Z_k ≥ c_k) under H0 for each k, for boundaries c (normal scale)."""
    out, grid, mass = [], None, None
    previous = 0.0
    for t, c in zip(fractions, bounds, strict=True):
        b = c * math.sqrt(t)  # the boundary on the score scale S = Z √t (independent increments)
        if grid is None:
            out.append(float(norm.sf(c)))
        else:
            out.append(float(mass @ ndtr((grid - b) / math.sqrt(t - previous))))
        grid, mass = _continue(grid, mass, t, previous, b)
        previous = t
    return out


def _continue(grid, mass, t: float, previous: float, b: float):
    """The sub-density of S_k on (−∞, b) after look k (as Simpson-weighted masses on a grid)."""
    bottom, top = -SD_RANGE * math.sqrt(t), min(b, SD_RANGE * math.sqrt(t))
    if top <= bottom:  # every path crossed: nothing continues
        return np.array([bottom]), np.zeros(1)
    x, w = _simpson(bottom, top)
    if grid is None:
        density = _pdf(x / math.sqrt(t)) / math.sqrt(t)
    else:
        s = math.sqrt(t - previous)
        density = mass @ (_pdf((x[None, :] - grid[:, None]) / s) / s)
    return x, w * density


@lru_cache(maxsize=4096)
def boundaries(fractions: tuple[float, ...], alpha: float = ALPHA, kind: str = "obrien_fleming") -> tuple[float, ...]:
    """The upper boundaries c_1..c_K (normal scale) of a one-sided level-`alpha` design with looks at `fractions`
    (increasing, in (0, 1]), spending `kind`: each look spends α(t_k) − α(t_{k−1})."""
    if any(b <= a for a, b in zip(fractions, fractions[1:], strict=False)) or not fractions or fractions[0] <= 0:
        raise ValueError(f"information fractions must increase from above 0: {fractions}")
    bounds: list[float] = []
    grid = mass = None
    previous = 0.0
    for t in fractions:
        increment = spent(kind, t, alpha) - spent(kind, previous, alpha)
        if grid is None:
            c = float(norm.isf(increment)) if increment > 0 else math.inf
        else:
            s = math.sqrt(t - previous)

            def excess(b: float, grid=grid, mass=mass, s=s, increment=increment) -> float:
                return float(mass @ ndtr((grid - b) / s)) - increment

            lo, hi = grid[0] - 10 * s, grid[-1] + 40 * s
            if increment <= 0 or excess(hi) > 0:
                c = math.inf
            elif excess(lo) < 0:  # cannot spend that much (not with these spending functions): cross at once
                c = -math.inf
            else:
                c = optimize.brentq(excess, lo, hi, xtol=1e-10) / math.sqrt(t)
        bounds.append(c)
        grid, mass = _continue(grid, mass, t, previous, c * math.sqrt(t) if np.isfinite(c) else math.inf)
        previous = t
    return tuple(bounds)


def nominal_level(fractions: tuple[float, ...], alpha: float = ALPHA, kind: str = "obrien_fleming") -> float:
    """The one-sided level the claim's own test is run at on the last of `fractions`: 1 − Φ(c_K)."""
    return float(norm.sf(boundaries(tuple(fractions), alpha, kind)[-1]))


def repeated_p(fractions: tuple[float, ...], z: float, kind: str = "obrien_fleming") -> float:
    """The repeated p-value of a statistic `z` at the last of `fractions`: the smallest level α' whose design
    (same spending, same fractions) crosses there, i.e. c_K(α') ≤ z (Jennison & Turnbull 2000, §9.1). At least
    0.5 is reported as the fixed-sample one-sided p (a statistic on the wrong side of 0)."""
    if not np.isfinite(z):
        return 0.0 if z > 0 else 1.0
    fractions = tuple(fractions)

    def gap(log_alpha: float) -> float:
        return boundaries(fractions, round(math.exp(log_alpha), 15), kind)[-1] - z

    lo, hi = math.log(1e-12), math.log(0.5)
    if gap(hi) > 0:
        return max(0.5, float(norm.sf(z)))
    if gap(lo) <= 0:
        return 1e-12
    return float(math.exp(optimize.brentq(gap, lo, hi, xtol=1e-6)))


@lru_cache(maxsize=64)
def calibrated_alpha(
    start: int, most: int, step: int, alpha: float = ALPHA, kind: str = "obrien_fleming", sims: int = 40_000
) -> float:
    """The level α' at which the design's boundaries are computed, so that a one-sample t-test at n − 1 degrees of
    freedom, run at each look's nominal level, calls "supported" under H0 at rate α over the looks at seeds
    start, start + step, ..., most.

    The nominal levels hold α exactly for normal statistics; t-statistics at few degrees of freedom are less
    correlated from look to look than their normal counterparts, so they cross slightly more often (5.4-5.8% at
    one-sided 0.05 for start 2-3 and max 8-12). Found by simulation with a fixed seed (the same α' everywhere);
    a test with more degrees of freedom at the same seeds (Welch, several cells a side) is then conservative."""
    from scipy.stats import t as student

    seeds = np.array(list(range(start, most, step)) + [most])
    if len(seeds) == 1:
        return alpha
    fractions = tuple(seeds / most)
    x = np.random.default_rng(20_221_983).standard_normal((sims, most))
    total, squares = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
    n = seeds.astype(float)
    mean = total[:, seeds - 1] / n
    sd = np.sqrt(np.maximum(squares[:, seeds - 1] - n * mean * mean, 0) / (n - 1))
    p = student.sf(mean / (sd / np.sqrt(n)), n - 1)

    def rate(level: float) -> float:
        return float(np.mean(np.any(p < norm.sf(np.array(boundaries(fractions, round(level, 12), kind))), axis=1)))

    if rate(alpha) <= alpha:
        return alpha
    return float(optimize.brentq(lambda a: rate(a) - alpha, alpha / 4, alpha, xtol=1e-5))


# ----------------------------------------------------------------------------------------------- looks


@dataclass(frozen=True)
class Design:
    start: int
    max: int
    step: int | None = None  # None: fill the cluster's free trial slots
    spending: str = "obrien_fleming"
    alpha: float = ALPHA
    futility_power: float = FUTILITY_POWER  # with a min_effect (or futility_effect "observed"): power asked for
    futility_effect: str = "trend"  # without a min_effect: "trend" (conditional power), "observed" or "none"
    futility_cp: float = 0.1  # "trend": futile below this conditional power in both directions

    @classmethod
    def of(cls, seeds: Any) -> Design:
        """From a study's `seeds: {start, max, step, spending}` (a SequentialSeeds or its dict)."""
        get = seeds.get if isinstance(seeds, dict) else lambda k, d=None: getattr(seeds, k, d)
        return cls(int(get("start")), int(get("max")), get("step"), get("spending") or "obrien_fleming")

    @property
    def level(self) -> float:
        """The level the boundaries are computed at (`calibrated_alpha`; the planned step, or 1 without one)."""
        return calibrated_alpha(self.start, self.max, self.step or 1, self.alpha, self.spending)

    def p_value(self, fractions: tuple[float, ...], z: float) -> float:
        """The repeated p-value of `z` at the last of `fractions`, on the scale of `alpha`: below it exactly when
        the look crossed (the repeated p at `level`, times alpha / level)."""
        return min(1.0, repeated_p(fractions, z, self.spending) * self.alpha / self.level)

    def describe(self) -> str:
        step = f"step {self.step}" if self.step else "step: the cluster's free trial slots"
        name = {"obrien_fleming": "O'Brien-Fleming", "pocock": "Pocock"}[self.spending]
        return f"seeds {self.start} to {self.max} per cell, {step}; {name} spending, one-sided {self.alpha:g}"

    def planned_levels(self, step: int) -> list[tuple[int, float, float]]:
        """(seeds, information fraction, nominal one-sided level) of each look, every seed finished."""
        seeds = list(range(self.start, self.max, step)) + [self.max]
        fractions = tuple(s / self.max for s in seeds)
        return [
            (s, t, float(norm.sf(c)))
            for s, t, c in zip(seeds, fractions, boundaries(fractions, self.level, self.spending), strict=True)
        ]


@dataclass
class ClaimLook:
    """One claim at one look. `analysed` is False when the look carried an earlier state (a decided claim, or no
    new seed with a value)."""

    index: int
    claim: str
    state: str
    analysed: bool = False
    decided_at: int | None = None  # the look that decided or ended it
    seeds: int = 0  # seeds per side its test used (the fewest over its sides)
    fraction: float = math.nan
    nominal: float = math.nan  # one-sided level of this look
    boundary: float = math.nan  # c_k, normal scale
    z: float = math.nan  # the test's one-sided p in the claim's direction on the normal scale: Φ⁻¹(1 − p)
    p_claimed: float = math.nan
    p_opposite: float = math.nan
    p_sequential: float = math.nan  # the repeated p-value (decided or ended claims)
    estimate: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    test: str = ""
    detail: str = ""
    needed: int | None = None  # seeds per side for FUTILITY_POWER (None: not estimated)
    cells: list[str] = field(default_factory=list)  # the cells it selects
    sides: list[list[str]] = field(default_factory=list)  # ... per side (quantity) of the claim

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Look:
    number: int
    seeds: dict[str, int]  # cell_hash -> seeds the look's data holds (seeds 0 .. n-1)
    claims: list[ClaimLook]
    next_seeds: dict[str, int]  # cell_hash -> seeds after the wave this look adds (= seeds: it adds none)
    step: int = 0

    @property
    def final(self) -> bool:
        return self.next_seeds == self.seeds

    @property
    def wave(self) -> dict[str, int]:
        """Seeds this look adds, per cell that gets any."""
        return {c: n - self.seeds.get(c, 0) for c, n in self.next_seeds.items() if n > self.seeds.get(c, 0)}


def _greater(claim: Claim) -> bool:
    op = claim.op if not isinstance(claim.lhs, Number) else {"<": ">", ">": "<", "<=": ">=", ">=": "<="}[claim.op]
    return op in (">", ">=")


def _cells(data: StudyData, claim: Claim) -> list[list[str]]:
    """The cells each quantity of the claim selects, among the study's registered trials."""
    out = []
    for q in claim.quantities:
        try:
            rows = data.select(q.selector, frame=data.trials)
        except Exception:  # noqa: BLE001 - an unknown field: the test says so (invalid)
            rows = data.trials.iloc[0:0]
        out.append(list(dict.fromkeys(rows.cell_hash)))
    return out


def seeds_per_cell(data: StudyData) -> dict[str, int]:
    """Seeds each cell's registered trials hold (a sequential study registers seeds 0 .. n-1 in order)."""
    counts = data.trials.groupby("cell_hash", sort=False).size()
    order = [c for c in data.cells_order if c in counts.index] + [c for c in counts.index if c not in data.cells_order]
    return {c: int(counts[c]) for c in order}


def take_look(
    data: StudyData,
    design: Design,
    history: list[Look],
    *,
    slots: int = 1,
    specs: list[tuple[str, float | None]] | None = None,
    intervals: bool = True,
) -> Look:
    """The next look: every claim not yet decided is decided from `data` (the study's trials at the look, every
    one finished) at its boundary, and the next wave (seeds per cell) is planned; `history`: the earlier looks.
    `slots`: the cluster's trial slots (how many seeds a wave adds without `design.step`). `intervals`: also
    evaluate each analysed claim at its nominal level for the interval shown (the decision needs only the p)."""
    specs = claim_specs(data) if specs is None else specs
    number = len(history) + 1
    seeds = seeds_per_cell(data)
    earlier: dict[int, list[ClaimLook]] = {}
    for look in history:
        for c in look.claims:
            earlier.setdefault(c.index, []).append(c)
    looks = [
        _claim_look(data, design, i, text, min_effect, earlier.get(i, []), seeds, number, intervals)
        for i, (text, min_effect) in enumerate(specs)
    ]
    sampling = list(dict.fromkeys(c for cl in looks if cl.state == SAMPLING for c in cl.cells))
    step = design.step or max(1, slots // max(1, len(sampling)))
    next_seeds = {c: (min(design.max, n + step) if c in sampling else n) for c, n in seeds.items()}
    return Look(number, seeds, looks, next_seeds, step)


def _claim_look(
    data: StudyData,
    design: Design,
    index: int,
    text: str,
    min_effect: float | None,
    earlier: list[ClaimLook],
    seeds: dict[str, int],
    number: int,
    intervals: bool,
) -> ClaimLook:
    last = earlier[-1] if earlier else None
    if last is not None and last.state in TERMINAL:  # decided: the look that decided it stands
        return replace(last, analysed=False)
    try:
        claim = parse_claim(text)
    except ValueError as exc:
        return ClaimLook(index, text, INVALID, decided_at=number, detail=str(exc))
    by_side = last.sides if last is not None and last.sides else _cells(data, claim)  # fixed from the first wave
    cells = list(dict.fromkeys(c for side in by_side for c in side))
    v = claim_test(data, claim)
    if v.verdict == INVALID:
        return ClaimLook(index, text, INVALID, decided_at=number, detail=v.detail, cells=cells)
    capacity = [
        design.max if q.kind == "slope" else design.max * max(1, len(side))
        for q, side in zip(claim.quantities, by_side, strict=True)
    ]
    used = list(v.seeds) if len(v.seeds) == len(capacity) else [0] * len(capacity)
    ended = all(seeds.get(c, 0) >= design.max for c in cells)
    fraction = 1.0 if ended else min(1.0, min(u / k for u, k in zip(used, capacity, strict=True)))
    fractions = [c.fraction for c in earlier if c.analysed]
    out = ClaimLook(index, text, SAMPLING, cells=cells, sides=by_side, seeds=min(used) if used else 0, test=v.test)
    if v.verdict == claims_module.PENDING or fraction <= 0 or (fractions and fraction <= fractions[-1] + 1e-12):
        out.detail = "no new seed with a value since the last look"
        return out
    fractions.append(fraction)
    boundary = boundaries(tuple(fractions), design.level, design.spending)[-1]
    nominal = float(norm.sf(boundary))
    p_claimed, p_opposite = float(v.p_claimed), float(v.p_opposite)
    out.analysed, out.fraction, out.boundary, out.nominal = True, fraction, boundary, nominal
    out.p_claimed, out.p_opposite = p_claimed, p_opposite
    out.z = float(norm.isf(p_claimed)) if np.isfinite(p_claimed) else math.nan
    if p_claimed < nominal:
        out.state = SUPPORTED
    elif p_opposite < nominal:
        out.state = CONTRADICTED
    elif ended:
        out.state = ENDED
    else:
        opposite = float(norm.isf(p_opposite)) if np.isfinite(p_opposite) else math.nan
        why = _futility(data, claim, v, design, min_effect, tuple(fractions), out.z, opposite, min(capacity))
        if why is not None:
            out.state, out.needed, out.detail = FUTILE, why[0], why[1]
    if out.state in TERMINAL:
        out.decided_at = number
        toward = out.z if out.state != CONTRADICTED else float(norm.isf(p_opposite))
        out.p_sequential = design.p_value(tuple(fractions), toward)
    shown = claim_test(data, claim, nominal) if intervals and nominal != design.alpha else v
    out.estimate, out.lo, out.hi = shown.estimate, shown.lo, shown.hi
    detail = f"look {number}: one-sided p {p_claimed:.3g} vs nominal {nominal:.3g} (t = {fraction:.2f})"
    out.detail = f"{detail}; {out.detail}" if out.detail else detail
    return out


def _futility(data, claim, v, design: Design, min_effect, fractions, z: float, opposite: float, most: int):
    """(seeds needed or None, why) when the claim is futile at this look, else None: were the effect `min_effect`
    (declared) or what it looks like now (none declared), neither direction would cross by `max` with conditional
    probability `design.futility_cp` or more (Lan, Simon & Halperin 1982; Jennison & Turnbull 2000, §10.6).
    At `min_effect` the drift comes from `seeds_needed` (80% power at it with the spread seen: n seeds per side
    means a standardised effect of (z_{1-α} + z_{0.8}) √(max / n) at max). `design.futility_effect` "observed"
    is the rule of 80% power at the observed effect within max instead (it halves power: see the docs)."""
    if not (np.isfinite(z) and np.isfinite(opposite)) or fractions[-1] >= 1:
        return None
    t = fractions[-1]
    final = boundaries((*fractions, 1.0), design.level, design.spending)[-1]  # were the next look the last
    needed = None
    if min_effect is not None or design.futility_effect == "observed":
        needed = power_module.seeds_needed(
            data, claim, effect=min_effect, power=design.futility_power, alpha=design.alpha
        )
        if needed is None:
            return None
        if min_effect is None:  # "observed": 80% power at the observed effect within max
            if needed.per_side is not None and needed.per_side <= most:
                return None
            more = f"{needed.per_side} seeds per side" if needed.per_side else "more seeds than any cap"
            return needed.per_side, f"futile: {more} for 80% power at the observed effect {needed.effect:.3g}"
        per_side = needed.per_side
        drift = (
            0.0
            if per_side is None
            else (norm.isf(design.alpha) + norm.ppf(design.futility_power)) * math.sqrt(most / per_side)
        )
        cp = [float(norm.cdf((x * math.sqrt(t) + drift * (1 - t) - final) / math.sqrt(1 - t))) for x in (z, opposite)]
        what = f"at its min_effect {min_effect:g}"
    elif design.futility_effect == "trend":
        cp = [float(norm.cdf((x / math.sqrt(t) - final) / math.sqrt(1 - t))) for x in (z, opposite)]
        what = "at the effect seen so far"
    else:
        return None
    if max(cp) >= design.futility_cp:
        return None
    return (needed.per_side if needed is not None else None), (
        f"futile: {what} it would be decided by max with probability {max(cp):.2g} "
        f"(conditional power; below {design.futility_cp:g})"
    )


def run_sequential(
    draw: Callable[[dict[str, int]], StudyData],
    design: Design,
    cells: list[str],
    *,
    slots: int = 1,
    specs: list[tuple[str, float | None]] | None = None,
    intervals: bool = False,
) -> list[Look]:
    """A whole sequential study as the runner takes it, for simulations: `draw(seeds per cell)` gives the study's
    data with those seeds recorded; looks are taken until the last one adds no seeds."""
    seeds = {c: design.start for c in cells}
    history: list[Look] = []
    while True:
        look = take_look(draw(seeds), design, history, slots=slots, specs=specs, intervals=intervals)
        history.append(look)
        if look.final:
            return history
        seeds = look.next_seeds


def final_states(looks: list[Look]) -> list[ClaimLook]:
    """Each claim as the last look left it."""
    return looks[-1].claims if looks else []


def describe_state(c: ClaimLook, seeds: dict[str, int]) -> str:
    """One line for progress and status: 'claim 2 supported at look 3, 5 seeds'."""
    n = min((seeds.get(cell, 0) for cell in c.cells), default=0)
    if c.state in DECIDED:
        return f"claim {c.index + 1} {c.state} at look {c.decided_at}, {n} seeds"
    if c.state == FUTILE:
        return f"claim {c.index + 1} futile at look {c.decided_at}, {n} seeds (no more seeds for it)"
    if c.state == ENDED:
        return f"claim {c.index + 1} inconclusive at max, {n} seeds"
    if c.state == INVALID:
        return f"claim {c.index + 1} invalid: {c.detail}"
    return f"claim {c.index + 1} undecided, {n} seeds"


# ------------------------------------------------------------------------------------ the ledger's rows

_FLOATS = ("fraction", "nominal", "boundary", "z", "p_claimed", "p_opposite", "p_sequential", "estimate", "lo", "hi")


def look_row(look: Look, design: Design) -> dict[str, Any]:
    """The `looks` row of a look (store/db.py LookRow, less the study)."""
    return {
        "number": look.number,
        "seeds": dict(look.seeds),
        "next_seeds": dict(look.next_seeds),
        "step": look.step,
        "design": asdict(design),
        "claims": [c.claim for c in look.claims],
    }


def claim_row(c: ClaimLook) -> dict[str, Any]:
    """The `look_claims` row of a claim at a look (store/db.py LookClaimRow, less the study and the look)."""
    row = {k: v for k, v in c.row().items() if k not in ("index", "claim", "cells", "sides")}
    return {**row, "claim": c.index, "text": c.claim, "cells": [list(side) for side in c.sides]}


def looks_from_rows(rows: list[dict[str, Any]]) -> list[Look]:
    """Looks as `analysis.data.looks_of` reads them from the ledger."""
    looks = []
    for r in rows:
        claims = []
        for c in r["claims"]:
            sides = [list(side) for side in c.get("cells") or []]
            values = {k: (math.nan if c.get(k) is None else float(c[k])) for k in _FLOATS}
            claims.append(
                ClaimLook(
                    c["claim"],
                    c["text"],
                    c["state"],
                    bool(c["analysed"]),
                    c.get("decided_at"),
                    int(c.get("seeds") or 0),
                    needed=c.get("needed"),
                    test=c.get("test") or "",
                    detail=c.get("detail") or "",
                    cells=list(dict.fromkeys(x for side in sides for x in side)),
                    sides=sides,
                    **values,
                )
            )
        looks.append(Look(r["number"], dict(r["seeds"]), claims, dict(r["next_seeds"]), int(r["step"])))
    return looks


def design_of(row: dict[str, Any]) -> Design:
    """A Design from its `looks.design` row (fields a newer or older studyrunner does not know are left out)."""
    return Design(**{k: row[k] for k in Design.__dataclass_fields__ if k in row})


# ------------------------------------------------------------------------------------------------ verify

_NAMES = {"obrien_fleming": "O'Brien-Fleming", "pocock": "Pocock"}


def verify(data: StudyData, holm: bool = False) -> list[claims_module.Verdict]:
    """`claims.verify` for any study: a sequential study's claims as its looks decided them (`verdicts`), any
    other's by their fixed-sample tests. `holm`: Holm over the claims' p-values (here the repeated p-values)."""
    if data.sequential is None:
        return claims_module.verify(data, holm=holm)
    found = verdicts(data)
    return claims_module.adjust_holm(found) if holm else found


def verdicts(data: StudyData) -> list[claims_module.Verdict]:
    """The claims of a sequential study as its looks decided them (the ledger's rows, never recomputed: a seed
    rerun later changes no decided look). `p` is the repeated p-value of the look that decided or ended the claim
    (Holm takes it); the interval is the one its test showed at that look's nominal level."""
    looks = looks_from_rows(data.looks)
    design = design_of(data.looks[0]["design"]) if data.looks else Design.of(data.sequential or {"start": 2, "max": 2})
    last = {c.index: c for c in looks[-1].claims} if looks else {}
    out = []
    for i, (text, _) in enumerate(claim_specs(data)):
        c = last.get(i)
        if c is None or c.claim != text:
            v = claims_module.evaluate(data, text)
            why = "no look yet" if not looks else "added after the looks: its verdict is a fixed-sample one"
            v.detail = f"sequential: {why}" + (f"; {v.detail}" if v.detail else "")
            if not looks and v.verdict != INVALID:
                v.extra["interim"], v.verdict = v.verdict, claims_module.PENDING
            out.append(v)
            continue
        out.append(_verdict(c, design, data.sequential is not None))
    return out


def _verdict(c: ClaimLook, design: Design, running: bool) -> claims_module.Verdict:
    verdict = {
        SUPPORTED: SUPPORTED,
        CONTRADICTED: CONTRADICTED,
        INVALID: INVALID,
        FUTILE: claims_module.INCONCLUSIVE,
        ENDED: claims_module.INCONCLUSIVE,
    }.get(c.state, claims_module.PENDING)
    v = claims_module.Verdict(c.claim, verdict, estimate=c.estimate, lo=c.lo, hi=c.hi, test=c.test)
    spending = _NAMES.get(design.spending, design.spending)
    v.test = f"{c.test}; group-sequential ({spending}, one-sided {design.alpha:g})" if c.test else v.test
    at = f"look {c.decided_at}" if c.decided_at else "the last look"
    level = f"one-sided p {c.p_claimed:.3g} vs nominal {c.nominal:.3g} (information {c.fraction:.2f}, {c.seeds} seeds)"
    if c.state in DECIDED:
        p = c.p_claimed if c.state == SUPPORTED else c.p_opposite
        level = level.replace(f"{c.p_claimed:.3g}", f"{p:.3g}", 1)
        v.detail = f"{c.state} at {at}: {level}; sequential p {c.p_sequential:.3g}"
    elif c.state == FUTILE:
        v.detail = f"stopped at {at}, {c.detail.split('; ', 1)[-1]}; {level}"
    elif c.state == ENDED:
        v.detail = f"undecided at max ({at}): {level}"
    elif c.state == INVALID:
        v.detail = c.detail
    else:
        v.detail = "pending: still sampling" + (f"; last analysed: {level}" if np.isfinite(c.nominal) else "")
    v.p = c.p_sequential if c.state in TERMINAL else math.nan
    v.seeds = (c.seeds,)
    v.extra.update({"look": c.decided_at, "state": c.state, "nominal": c.nominal, "p_look": c.p_claimed})
    return v
