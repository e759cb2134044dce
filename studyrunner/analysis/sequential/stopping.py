"""Sequential seeds: the looks of a group-sequential design over a study's claims (docs/analysis/sequential.md).

A study with `seeds: {start, max, step, spending}` runs the first `start` seeds of every cell, then looks: each
claim is decided from the recorded trials, and the cells its undecided claims select get `step` more seeds, until
every claim is decided or its cells reach `max`. Repeated looks at the data would inflate the false-positive rate
of a test run at α each time; a **group-sequential design with an alpha-spending function** (Lan & DeMets 1983)
holds it: each direction of a claim ("supported" in the claimed direction, "contradicted" in the other) is a
one-sided test at level ALPHA that may spend, by the information fraction t of a look, at most α(t) in all:

- O'Brien-Fleming type (default): α(t) = 2 − 2Φ(z_{1−α/2} / √t): almost nothing early, nearly α at the end;
- Pocock type: α(t) = α ln(1 + (e − 1) t): about evenly.

The information fraction of a look is the seeds per side the claim's test uses over those it would use at `max` (a
side pooling several cells too: its test runs on one value per seed; a failure rate's trials over its cells × max),
and 1 at a claim's last possible look (its cells at `max`), so the last look spends what is left. The boundary c_k
of look k (on the normal scale) solves P(Z_1 < c_1, ..., Z_{k−1} < c_{k−1}, Z_k ≥ c_k) = α(t_k) − α(t_{k−1}) under
the joint normal law of the looks' statistics (corr(Z_i, Z_j) = √(t_i / t_j)), computed by the recursive numerical
integration of Armitage, McPherson & Rowe (1969; Jennison & Turnbull 2000, ch. 19) on the fractions the looks
actually had. The boundary becomes a **nominal one-sided level** 1 − Φ(c_k), and the claim's own test decides at it
(`evaluate(..., alpha=nominal)`: a t-test at its current degrees of freedom, an exact test with its exact p;
Jennison & Turnbull 2000, §3.8 and ch. 11). The two directions are separate one-sided designs whose boundaries
ignore the other's stopping, so each holds its level (conservatively).

**Small seed counts.** t-statistics at 1-3 degrees of freedom re-estimate their variance at every look and cross
normal-theory levels a little more often (5.4-5.8% at one-sided 0.05); the boundaries are therefore computed at
a level α' calibrated by simulation (`calibrated_alpha`, fixed seed) so that a one-sample t-test holds α.

**Futility** (non-binding): a claim still undecided gets no more seeds when, were the effect its `min_effect`
(the drift from `analysis.claims.power.seeds_needed`) or else the one seen so far, neither direction would cross by
`max` with conditional probability 10% or more (Lan, Simon & Halperin 1982), judged only from MIN_FUTILITY_SEEDS
(4) seeds per side; an equivalence claim when, were the true difference 0 from now on, both its one-sided tests
would cross by `max` with probability below 10%. The boundaries never count on it, so it cannot raise the
false-positive rate; it costs power, which the simulations (benchmarks/sequential.py, futility.py) report. A
stopped claim reads "inconclusive (stopped for futility)", never a tie (its ledger state stays `futile`).

**Equivalence and non-inferiority** (an entry's `margin`): each one-sided test the claim rests on meets the look's
nominal level (`extra["tests"]` of its verdict: supported when every claimed test crosses, contradicted when any
opposite one does), so a TOST runs both of its tests at the look's level.

**Multiplicity** (`multiplicity: holm`, `_holm`): the graphical group-sequential Holm design of Maurer & Bretz
(2013): each claim starts with an equal share of alpha and its boundaries at that share; a decided claim's share
passes to the claims not decided, which are tested again at the same look at their larger level.

**p-values and intervals.** A decided or ended claim carries its *repeated p-value* (Jennison & Turnbull 2000,
§9.1): the smallest level at which the design would have crossed at its last look, rescaled by α / α' (and by its
Holm share); it is below ALPHA exactly when the claim crossed, and valid however the looks stopped (futility, other
claims), so Holm across a study's claims (`verify --holm`) may take it as it takes a fixed-sample p (valid, but
nearly powerless: `multiplicity: holm` is the design for it). Its interval is a repeated confidence interval
(ch. 9), labelled so in `verify` (`Verdict.interval_kind`, `nominal`).

Everything here is a pure function of a StudyData (the ledger's rows at a look) and the earlier looks: no Ray,
no SQL. The runner (orchestrate/feeds/waves.py) calls `take_look` after each wave; the simulations call the same
`take_look` through `run_sequential`.

Where it lives (this package, `studyrunner.analysis.sequential`): the spending functions, boundaries, nominal
levels, repeated p-values and the calibrated level in `spending`; `Design`, `ClaimLook`, `Look` and their ledger
rows in `looks`; here what a look decides (`take_look`, futility), the whole sequential study for simulations,
and the claims' verdicts read back from the looks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from scipy.stats import norm

from ...study.claims_grammar import EQUIVALENT, Claim, parse_claim
from ...study.schema import ClaimEntry
from ..claims import bounded
from ..claims import decide as claims_module
from ..claims import power as power_module
from ..claims.verdict import ALPHA, VerdictKind
from ..data import StudyData
from .looks import (
    DECIDED,
    MIN_FUTILITY_SEEDS,
    TERMINAL,
    ClaimLook,
    ClaimState,
    Design,
    Look,
    design_of,
    looks_from_rows,
)
from .spending import (
    SPENDING_NAMES,
    boundaries,
)


def claim_test(data: StudyData, claim, alpha: float = ALPHA) -> claims_module.Verdict:
    """The claim's own test (analysis/claims/decide.py) decided at one-sided `alpha`, with `p_claimed` and `p_opposite`;
    `claim` a Claim, a text or a ClaimEntry (whose margin makes it an equivalence or non-inferiority claim)."""
    return claims_module.evaluate(data, claim, alpha=alpha)


def claim_specs(source) -> list[tuple[str, float | None]]:
    """(claim text, min_effect or None) of each claim of `source` (a StudyData or a Study: its `claims`, each a
    ClaimEntry, a mapping or a plain string)."""
    return [(c.claim, c.min_effect) for c in entries_of(source.claims)]


def entries_of(items) -> list[ClaimEntry]:
    """Claim entries from `claims:` items or `take_look` specs: ClaimEntry, mappings, texts, (text, min_effect)."""
    out = []
    for c in items:
        if isinstance(c, tuple):
            text, min_effect = c
            c = {"claim": text, **({"min_effect": min_effect} if min_effect is not None else {})}
        out.append(c if isinstance(c, ClaimEntry) else ClaimEntry.model_validate(c))
    return out


# ----------------------------------------------------------------------------------------------- looks


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
    specs: list | None = None,
    intervals: bool = True,
    multiplicity: str | None = None,
) -> Look:
    """The next look: every claim not yet decided is decided from `data` (the study's trials at the look, every
    one finished) at its boundary, and the next wave (seeds per cell) is planned; `history`: the earlier looks.
    `slots`: the cluster's trial slots (how many seeds a wave adds without `design.step`). `intervals`: also
    evaluate each analysed claim at its nominal level for the interval shown (the decision needs only the p).
    `specs`: the claims (ClaimEntry, mappings, texts or (text, min_effect)); default the study's. `multiplicity`:
    the study's `multiplicity:` ("holm": the graphical group-sequential Holm design, `_holm`; default the
    design's)."""
    if multiplicity is not None:
        design = replace(design, multiplicity=multiplicity)
    entries = entries_of(data.claims if specs is None else specs)
    number = len(history) + 1
    seeds = seeds_per_cell(data)
    earlier: dict[int, list[ClaimLook]] = {}
    for look in history:
        for c in look.claims:
            earlier.setdefault(c.index, []).append(c)

    def one(i: int, entry: ClaimEntry, weight: float = 1.0) -> ClaimLook:
        return _claim_look(data, design, i, entry, earlier.get(i, []), seeds, number, intervals, weight)

    if design.multiplicity == "holm":
        looks = _holm(entries, earlier, one, number)
    else:
        looks = [one(i, entry) for i, entry in enumerate(entries)]
    sampling = list(dict.fromkeys(c for cl in looks if cl.state == ClaimState.SAMPLING for c in cl.cells))
    step = design.step or max(1, slots // max(1, len(sampling)))
    next_seeds = {c: (min(design.max, n + step) if c in sampling else n) for c, n in seeds.items()}
    return Look(number, seeds, looks, next_seeds, step, design.multiplicity)


def _holm(entries: list[ClaimEntry], earlier: dict[int, list[ClaimLook]], one, number: int) -> list[ClaimLook]:
    """The graphical group-sequential Holm design (Maurer & Bretz 2013, "Multiple testing in group sequential
    trials using graphical approaches", Stat Biopharm Res 5:311-320), with Holm's graph: each of the m claims
    starts with an equal share 1/m of alpha; a claim decided (supported or contradicted) at a look passes its
    share on to the claims not decided, equally (so each holds 1/|J| for J the claims not yet decided), and they
    are tested again at this look at their larger level, with their own spending functions (every boundary
    recomputed at the new level over the looks' information fractions), and at later looks; a claim keeps
    sampling until it crosses its current Holm level, stops for futility or reaches `max`. A claim stopped (futile
    or at `max`) at an earlier look keeps its share (it is not rejected) but is not tested again: conservative.
    Invalid claims are no hypothesis and hold no share."""

    def open_claim(c: ClaimLook) -> bool:
        return c.state not in DECIDED and c.state != ClaimState.INVALID

    before = [earlier[i][-1].state if earlier.get(i) else ClaimState.SAMPLING for i in range(len(entries))]
    share = 1.0 / max(1, sum(state not in DECIDED and state != ClaimState.INVALID for state in before))
    looks = [one(i, entry, share) for i, entry in enumerate(entries)]
    carried = {c.index for c in looks if not c.analysed and c.state in TERMINAL}  # stopped or decided before
    while True:
        J = [c.index for c in looks if open_claim(c)]
        weight = 1.0 / max(1, len(J))
        redo = [i for i in J if i not in carried and looks[i].weight < weight - 1e-12]
        if not redo:
            break
        for i in redo:
            looks[i] = one(i, entries[i], weight)
    for c in looks:
        if c.index in carried and c.state not in DECIDED:
            c.weight = 1.0 / max(1, sum(open_claim(x) for x in looks))
    return looks


def _claim_look(
    data: StudyData,
    design: Design,
    index: int,
    entry: ClaimEntry,
    earlier: list[ClaimLook],
    seeds: dict[str, int],
    number: int,
    intervals: bool,
    weight: float = 1.0,
) -> ClaimLook:
    text = entry.claim
    last = earlier[-1] if earlier else None
    if last is not None and last.state in TERMINAL:  # decided: the look that decided it stands
        return replace(last, analysed=False)
    try:
        claim = parse_claim(text)
    except ValueError as exc:
        return ClaimLook(index, text, ClaimState.INVALID, decided_at=number, detail=str(exc))
    by_side = last.sides if last is not None and last.sides else _cells(data, claim)  # fixed from the first wave
    cells = list(dict.fromkeys(c for side in by_side for c in side))
    v = claim_test(data, entry)
    if v.verdict == VerdictKind.INVALID:
        return ClaimLook(index, text, ClaimState.INVALID, decided_at=number, detail=v.detail, cells=cells)
    used, fraction, ended = _information(design, claim, by_side, v, cells, seeds)
    fractions = [c.fraction for c in earlier if c.analysed]
    out = ClaimLook(
        index,
        text,
        ClaimState.SAMPLING,
        cells=cells,
        sides=by_side,
        seeds=min(used) if used else 0,
        test=v.test,
        weight=weight,
    )
    if v.verdict == VerdictKind.PENDING or fraction <= 0 or (fractions and fraction <= fractions[-1] + 1e-12):
        out.detail = "no new seed with a value since the last look"
        return out
    fractions.append(fraction)
    level = design if weight >= 1 else replace(design, alpha=design.alpha * weight)  # a Holm share of alpha
    boundary = boundaries(tuple(fractions), level.level, design.spending)[-1]
    nominal = float(norm.sf(boundary))
    # Each one-sided test the claim rests on, as (its own p, the distribution-free gate's p or 0): the claim is
    # supported when every `claimed` test crosses (one; two for equivalence: TOST) and contradicted when any
    # `opposite` one does. A test's p meets the boundary; the anytime-valid gate meets the level itself (it needs
    # no spending). A fixed test's p already holds both.
    tests = v.extra.get("tests") or {"claimed": [(v.p_claimed, 0.0)], "opposite": [(v.p_opposite, 0.0)]}
    claimed, opposite = tests["claimed"], tests["opposite"]
    p_claimed = max(float(t) for t, _ in claimed)
    out.analysed, out.fraction, out.boundary, out.nominal = True, fraction, boundary, nominal
    out.p_claimed, out.p_opposite = p_claimed, min(float(t) for t, _ in opposite)
    out.z = float(norm.isf(p_claimed)) if np.isfinite(p_claimed) else math.nan
    held = v.extra.get("held")  # a margin claim below 5 seeds per side (decide._margin_floor): no crossing yet
    crosses = lambda t, g: bool(t < nominal and g <= level.alpha)  # noqa: E731
    _decide(out, data, claim, entry, v, design, level, tuple(fractions), crosses, held, ended, claimed, opposite)
    if out.state in TERMINAL:
        out.decided_at = number
        out.p_sequential = _sequential_p(out, claimed, opposite, level, tuple(fractions), weight)
    shown = claim_test(data, entry, nominal) if intervals and nominal != design.alpha else v
    out.estimate, out.lo, out.hi = shown.estimate, shown.lo, shown.hi
    detail = f"look {number}: one-sided p {p_claimed:.3g} vs nominal {nominal:.3g} (t = {fraction:.2f})"
    if weight < 1:
        detail += f"; Holm share {weight:.3g} of alpha"
    gated = max(g for _, g in claimed)
    if all(t < nominal for t, _ in claimed) and gated > level.alpha:
        detail += f"; held back by the distribution-free bound (p {gated:.3g} > {level.alpha:g})"
    out.detail = f"{detail}; {out.detail}" if out.detail else detail
    return out


def _information(design: Design, claim, by_side, v, cells: list[str], seeds: dict[str, int]):
    """Seeds used per side, the information fraction, and whether every cell is at `max`. Information is seeds
    per side over `max` (a pooled side's values are one per seed: its seeds, not its trials); a failure rate
    counts trials, a side's cells x max of them at `max`."""
    capacity = [
        design.max * max(1, len(side)) if q.kind == "failure_rate" else design.max
        for q, side in zip(claim.quantities, by_side, strict=True)
    ]
    used = list(v.seeds) if len(v.seeds) == len(capacity) else [0] * len(capacity)
    ended = all(seeds.get(c, 0) >= design.max for c in cells)
    fraction = 1.0 if ended else min(1.0, min(u / k for u, k in zip(used, capacity, strict=True)))
    return used, fraction, ended


def _decide(
    out: ClaimLook, data, claim, entry, v, design, level, fractions, crosses, held, ended, claimed, opposite
) -> None:
    """The look's state: crossed for the claim or against it, ended at `max`, or stopped for futility."""
    seeds_now = out.fraction * design.max  # seeds per side the information stands for
    if not held and all(crosses(t, g) for t, g in claimed):
        out.state = ClaimState.SUPPORTED
    elif not held and any(crosses(t, g) for t, g in opposite):
        out.state = ClaimState.CONTRADICTED
    elif ended:
        out.state = ClaimState.ENDED
    elif "has no known range" in v.detail and not np.isfinite(out.p_claimed):
        out.state, out.detail = ClaimState.FUTILE, "futile: " + v.detail.split("; ")[0]  # no seed count can decide it
    elif seeds_now >= MIN_FUTILITY_SEEDS - 1e-9:
        if claim.op == EQUIVALENT:
            why = _equivalence_futility(claimed, design, level.level, fractions)
            why = why or _gate_futility(v, design, equivalence=True)
        else:
            opposite_z = float(norm.isf(out.p_opposite)) if np.isfinite(out.p_opposite) else math.nan
            why = _futility(data, claim, entry, v, design, level, fractions, out.z, opposite_z, design.max)
            why = why or _gate_futility(v, design)
        if why is not None:
            out.state, out.needed, out.detail = ClaimState.FUTILE, why[0], why[1]
    if held and out.state in (ClaimState.SAMPLING, ClaimState.ENDED):
        out.detail = held


def _sequential_p(out: ClaimLook, claimed, opposite, level, fractions, weight: float) -> float:
    """The repeated p of a decided claim, on alpha's scale (below it iff crossed; a Holm share scales it)."""

    def repeated(t: float, g: float) -> float:
        # p 0 (an exact difference: every seed the same) is z = +inf, whose repeated p is 0, not unknown
        z = float(norm.isf(t)) if not math.isnan(t) else math.nan
        return max(level.p_value(fractions, z), g) if not math.isnan(z) else math.nan

    if out.state == ClaimState.CONTRADICTED:
        p = min(p for p in (repeated(t, g) for t, g in opposite) if np.isfinite(p))
    else:
        found = [repeated(t, g) for t, g in claimed]
        p = max(found) if all(np.isfinite(found)) else math.nan
    return min(1.0, p / min(1.0, weight))


def _equivalence_futility(claimed, design: Design, level: float, fractions: tuple[float, ...]):
    """(None, why) when an equivalence claim can no longer be shown by `max`, else None. Were the true difference
    0 (the equivalence the claim hopes for) from now on, both one-sided tests would have to cross at `max`; with
    z_L, z_U the two tests' statistics now (z_L + z_U = 2δ / se), the final statistic of the first is normal with
    mean z_L √t + (δ / se_max)(1 − t) and variance 1 − t, and both cross when it lies in (c, 2δ / se_max − c) for
    the final boundary c (se_max = se √t, the spread held). Futile when that conditional power is below
    `design.futility_cp` (non-binding: the boundaries never count on it, so it cannot raise the rate of false
    equivalence; it costs power, benchmarks/equivalence.py)."""
    if len(claimed) != 2:
        return None
    (t_l, _), (t_u, _) = claimed
    if not (np.isfinite(t_l) and np.isfinite(t_u)) or fractions[-1] >= 1:
        return None
    z_l, z_u = float(norm.isf(t_l)), float(norm.isf(t_u))
    t = fractions[-1]
    final = boundaries((*fractions, 1.0), level, design.spending)[-1]  # were the next look the last
    width = (z_l + z_u) / math.sqrt(t)  # 2δ / se at max
    if width <= 0:
        cp = 0.0
    else:
        mean = z_l * math.sqrt(t) + width / 2 * (1 - t)
        s = math.sqrt(1 - t)
        cp = max(0.0, float(norm.cdf((width - final - mean) / s) - norm.cdf((final - mean) / s)))
    if cp >= design.futility_cp:
        return None
    return None, (
        f"futile: were the true difference 0 from now on, equivalence would be shown by max with probability "
        f"{cp:.2g} (conditional power; below {design.futility_cp:g})"
    )


def _gate_futility(v: claims_module.Verdict, design: Design, equivalence: bool = False) -> tuple[None, str] | None:
    """Futile when the distribution-free gate (analysis/claims/bounded.py) could pass in neither direction by `max`
    were the seeds to come at the mean seen so far (non-binding, as `_futility`); for equivalence, when either of
    its two gates could not."""
    if equivalence:
        designs = [d for d in (v.extra.get("tost") or {}).values() if d is not None and d.get("span") is not None]
        if not designs:
            return None
        ps = [
            bounded.projected_p(d["x"], d["null"], d["greater"], *d["span"], design.max - len(d["x"])) for d in designs
        ]
        if max(ps) <= design.alpha:
            return None
        worst = max(ps)
        return None, (
            f"futile: at the mean seen so far the distribution-free bound would not reach {design.alpha:g} by "
            f"{design.max} seeds for both sides of the margin (p {worst:.3g})"
        )
    if v.extra.get("gate") is None:
        return None
    d = v.extra["design"]
    span = d["span"]
    more = design.max - len(d["x"])
    ps = [bounded.projected_p(d["x"], d["null"], way, *span, more) for way in (True, False)]
    if min(ps) <= design.alpha:
        return None
    return None, (
        f"futile: at the mean seen so far the distribution-free bound on this accuracy would not reach "
        f"{design.alpha:g} by {design.max} seeds in either direction (p {min(ps):.3g}): a failure mode no seed has "
        "shown could explain seeds this close to the number"
    )


def _futility(data, claim, entry, v, design: Design, level: Design, fractions, z: float, opposite: float, most: int):
    """(seeds needed or None, why) when the claim is futile at this look, else None: were the effect `min_effect`
    (declared) or what it looks like now (none declared), neither direction would cross by `max` with conditional
    probability `design.futility_cp` or more (Lan, Simon & Halperin 1982; Jennison & Turnbull 2000, §10.6).
    Judged only from MIN_FUTILITY_SEEDS seeds per side (`_claim_look`). At `min_effect` the drift comes from
    `seeds_needed` (80% power at it with the spread seen: n seeds per side means a standardised effect of
    (z_{1-α} + z_{0.8}) √(max / n) at max). `design.futility_effect` "observed" is the rule of 80% power at the
    observed effect within max instead (it halves power: see the docs). `level`: the design at the claim's share
    of alpha (Holm), whose boundaries the claim meets."""
    if not (np.isfinite(z) and np.isfinite(opposite)) or fractions[-1] >= 1:
        return None
    min_effect = entry.min_effect
    t = fractions[-1]
    final = boundaries((*fractions, 1.0), level.level, design.spending)[-1]  # were the next look the last
    needed = None
    if min_effect is not None or design.futility_effect == "observed":
        needed = power_module.seeds_needed(
            data, entry, effect=min_effect, power=design.futility_power, alpha=level.alpha
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
            else (norm.isf(level.alpha) + norm.ppf(design.futility_power)) * math.sqrt(most / per_side)
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
    specs: list | None = None,
    intervals: bool = False,
    multiplicity: str | None = None,
) -> list[Look]:
    """A whole sequential study as the runner takes it, for simulations: `draw(seeds per cell)` gives the study's
    data with those seeds recorded; looks are taken until the last one adds no seeds."""
    seeds = {c: design.start for c in cells}
    history: list[Look] = []
    while True:
        look = take_look(
            draw(seeds), design, history, slots=slots, specs=specs, intervals=intervals, multiplicity=multiplicity
        )
        history.append(look)
        if look.final:
            return history
        seeds = look.next_seeds


# ------------------------------------------------------------------------------------------------ verify


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
    for i, entry in enumerate(entries_of(data.claims)):
        c = last.get(i)
        if c is None or c.claim != entry.claim:
            v = claims_module.evaluate(data, entry)
            why = "no look yet" if not looks else "added after the looks: its verdict is a fixed-sample one"
            v.detail = f"sequential: {why}" + (f"; {v.detail}" if v.detail else "")
            if not looks and v.verdict != VerdictKind.INVALID:
                v.extra["interim"], v.verdict = v.verdict, VerdictKind.PENDING
            out.append(v)
            continue
        v = _verdict(c, design, data.sequential is not None)
        v.margin, v.min_effect = entry.margin, entry.min_effect
        v.lhs, v.rhs = _sides_at(data, entry, c.seeds)
        out.append(v)
    return out


def _sides_at(data: StudyData, entry: ClaimEntry, seeds: int) -> tuple[float, float]:
    """The two sides' values (lhs, rhs) on the seeds the deciding look's test used (seeds 0 .. seeds-1), as the
    fixed-sample evaluation states them; the look rows keep only the difference and its interval."""
    trials = data.trials
    if seeds and "seed" in trials:
        trials = trials[trials["seed"] < seeds]
    if trials.empty:
        return math.nan, math.nan
    v = claims_module.evaluate(replace(data, trials=trials), entry)
    return v.lhs, v.rhs


def _verdict(c: ClaimLook, design: Design, running: bool) -> claims_module.Verdict:
    """A claim as its looks left it. Its interval is a repeated confidence interval (Jennison & Turnbull 2000,
    ch. 9): computed at the nominal level of the look that decided, stopped or ended it, so that over every look
    it holds the truth with probability 1 − 2·alpha (alpha: the claim's share under Holm); it says so
    (`interval_kind`, `nominal`). A claim stopped for futility is inconclusive, `stopped` "futility"."""
    verdict = {
        ClaimState.SUPPORTED: VerdictKind.SUPPORTED,
        ClaimState.CONTRADICTED: VerdictKind.CONTRADICTED,
        ClaimState.INVALID: VerdictKind.INVALID,
        ClaimState.FUTILE: VerdictKind.INCONCLUSIVE,
        ClaimState.ENDED: VerdictKind.INCONCLUSIVE,
    }.get(c.state, VerdictKind.PENDING)
    alpha = design.alpha * min(1.0, c.weight)
    v = claims_module.Verdict(c.claim, verdict, estimate=c.estimate, lo=c.lo, hi=c.hi, test=c.test, alpha=alpha)
    if np.isfinite(c.nominal):
        v.interval_kind, v.nominal = "repeated", c.nominal
    spending = SPENDING_NAMES.get(design.spending, design.spending)
    holm = f", Holm share {c.weight:.3g} of {design.alpha:g}" if c.weight < 1 else ""
    v.test = f"{c.test}; group-sequential ({spending}, one-sided {design.alpha:g}{holm})" if c.test else v.test
    at = f"look {c.decided_at}" if c.decided_at else "the last look"
    level = f"one-sided p {c.p_claimed:.3g} vs nominal {c.nominal:.3g} (information {c.fraction:.2f}, {c.seeds} seeds)"
    if c.state in DECIDED:
        p = c.p_claimed if c.state == ClaimState.SUPPORTED else c.p_opposite
        level = level.replace(f"{c.p_claimed:.3g}", f"{p:.3g}", 1)
        v.detail = f"{c.state} at {at}: {level}; sequential p {c.p_sequential:.3g}"
    elif c.state == ClaimState.FUTILE:
        v.stopped = "futility"
        why = c.detail[c.detail.index("futile: ") + len("futile: ") :] if "futile: " in c.detail else c.detail
        v.detail = f"stopped for futility at {at} (no tie: it could not be decided within max seeds): {why}; {level}"
    elif c.state == ClaimState.ENDED:
        held = next((part for part in c.detail.split("; ") if part.startswith("a margin is decided from")), "")
        v.detail = f"undecided at max ({at}): {level}" + (f"; {held}" if held else "")
    elif c.state == ClaimState.INVALID:
        v.detail = c.detail
    else:
        v.detail = "pending: still sampling" + (f"; last analysed: {level}" if np.isfinite(c.nominal) else "")
    v.p = c.p_sequential if c.state in TERMINAL else math.nan
    v.seeds = (c.seeds,)
    v.extra.update({"look": c.decided_at, "state": c.state, "nominal": c.nominal, "p_look": c.p_claimed})
    return v
