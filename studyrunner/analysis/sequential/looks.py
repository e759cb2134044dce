"""The bookkeeping of a sequential study's looks: its design (`Design`: seeds, step, spending, futility), each
claim's state at a look (`ClaimLook`), a look with the wave it plans (`Look`), and their rows in the ledger's
`looks` and `look_claims` tables (store/db.py), read back by `looks_from_rows`. What a look decides is
`stopping.take_look`'s.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from scipy.stats import norm

from ..claims.verdict import ALPHA, VerdictKind
from .spending import SPENDING_NAMES, boundaries, calibrated_alpha, repeated_p


class ClaimState(StrEnum):
    """A claim's state at a look (`ClaimLook.state`, the ledger's `look_claims.state`): sampling until a look
    decides it (supported, contradicted), stops it for futility, ends it at `max` undecided, or finds it invalid."""

    SAMPLING = "sampling"
    SUPPORTED = VerdictKind.SUPPORTED.value
    CONTRADICTED = VerdictKind.CONTRADICTED.value
    FUTILE = "futile"  # stopped for futility: its verdict is inconclusive (stopped for futility)
    ENDED = VerdictKind.INCONCLUSIVE.value  # reached `max` seeds without crossing a boundary
    INVALID = VerdictKind.INVALID.value


DECIDED = (ClaimState.SUPPORTED, ClaimState.CONTRADICTED)
# a claim in one of these gets no more looks
TERMINAL = (ClaimState.SUPPORTED, ClaimState.CONTRADICTED, ClaimState.FUTILE, ClaimState.ENDED, ClaimState.INVALID)
FUTILITY_POWER = 0.8
# No claim is stopped for futility before its test has this many seeds per side (information × max). At 2-3
# seeds the spread (and the trend) a conditional power rests on is too rough: under the effect the fixed design
# detects with 80% power, 25.6% of real effects stopped futile (10% at the first look, 2 seeds), most with
# intervals still holding the effect (benchmarks/futility.py; docs/analysis/sequential.md).
MIN_FUTILITY_SEEDS = 4
MULTIPLICITY = ("none", "holm")  # the study's `multiplicity:` (Holm: the graphical group-sequential design)
STOPPED_FOR_FUTILITY = "inconclusive (stopped for futility)"  # how a futile claim is printed: no tie


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
    multiplicity: str = "none"  # "holm": claims share alpha by the graphical Holm design (stopping._holm)

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
        name = SPENDING_NAMES[self.spending]
        holm = "; Holm over the claims (graphical group-sequential)" if self.multiplicity == "holm" else ""
        return f"seeds {self.start} to {self.max} per cell, {step}; {name} spending, one-sided {self.alpha:g}{holm}"

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
    state: ClaimState
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
    # Its share of alpha (1 without `multiplicity: holm`); kept in the look row's design (`holm_weights`), not in
    # the claim's row
    weight: float = 1.0

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Look:
    number: int
    seeds: dict[str, int]  # cell_hash -> seeds the look's data holds (seeds 0 .. n-1)
    claims: list[ClaimLook]
    next_seeds: dict[str, int]  # cell_hash -> seeds after the wave this look adds (= seeds: it adds none)
    step: int = 0
    multiplicity: str = "none"  # the design's `multiplicity` the look was taken under

    @property
    def final(self) -> bool:
        return self.next_seeds == self.seeds

    @property
    def wave(self) -> dict[str, int]:
        """Seeds this look adds, per cell that gets any."""
        return {c: n - self.seeds.get(c, 0) for c, n in self.next_seeds.items() if n > self.seeds.get(c, 0)}


def final_states(looks: list[Look]) -> list[ClaimLook]:
    """Each claim as the last look left it."""
    return looks[-1].claims if looks else []


def describe_state(c: ClaimLook, seeds: dict[str, int]) -> str:
    """One line for progress and status: 'claim 2 supported at look 3, 5 seeds'."""
    n = min((seeds.get(cell, 0) for cell in c.cells), default=0)
    if c.state in DECIDED or c.state == ClaimState.FUTILE:
        n = c.seeds or n  # the seeds of the look that decided it, not those its cells reached for other claims
    if c.state in DECIDED:
        return f"claim {c.index + 1} {c.state} at look {c.decided_at}, {n} seeds"
    if c.state == ClaimState.FUTILE:
        shown = interval_text(c)
        return f"claim {c.index + 1} {STOPPED_FOR_FUTILITY} at look {c.decided_at}, {n} seeds" + (
            f", interval {shown}" if shown else ""
        )
    if c.state == ClaimState.ENDED:
        return f"claim {c.index + 1} inconclusive at max, {n} seeds"
    if c.state == ClaimState.INVALID:
        return f"claim {c.index + 1} invalid: {c.detail}"
    return f"claim {c.index + 1} undecided, {n} seeds"


def interval_text(c: ClaimLook) -> str:
    """A look's interval as '[lo, hi] (repeated-confidence, nominal 98.3%)', or '' without one."""
    if math.isnan(c.lo) and math.isnan(c.hi):
        return ""
    from ..claims.verdict import _percent

    nominal = f", nominal {_percent(1 - 2 * c.nominal)}" if math.isfinite(c.nominal) else ""
    return f"[{c.lo:.3g}, {c.hi:.3g}] (repeated-confidence{nominal})"


# ------------------------------------------------------------------------------------ the ledger's rows

_FLOATS = ("fraction", "nominal", "boundary", "z", "p_claimed", "p_opposite", "p_sequential", "estimate", "lo", "hi")


def look_row(look: Look, design: Design, entries: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The `looks` row of a look (store/db.py LookRow, less the study). `entries`, every field of each claim entry
    as the study file gave it (`claim_entries`), is kept with the design: after the first look none may change."""
    return {
        "number": look.number,
        "seeds": dict(look.seeds),
        "next_seeds": dict(look.next_seeds),
        "step": look.step,
        "design": {
            **asdict(replace(design, multiplicity=look.multiplicity)),
            **({"claim_entries": entries} if entries is not None else {}),
            **({"holm_weights": [c.weight for c in look.claims]} if look.multiplicity == "holm" else {}),
        },
        "claims": [c.claim for c in look.claims],
    }


def claim_entries(study) -> list[dict[str, Any]]:
    """Every field of each entry of the study's `claims:` (its text, `min_effect`, and any field a newer study
    file adds), as JSON values: what a sequential study's first look fixes."""
    from ...study.claim_entries import ClaimEntry

    entries = [c if isinstance(c, ClaimEntry) else ClaimEntry.model_validate(c) for c in study.claims]
    return [{name: getattr(entry, name) for name in type(entry).model_fields} for entry in entries]


def changed_claim_fields(recorded: dict[str, Any], study) -> list[str]:
    """The claim fields the study file now gives differently from the first look's record: `claims` (added,
    removed or reordered entries, or a changed text), or `claims[i].FIELD`. A look recorded before the entries
    were kept (texts only) is compared by text."""
    now = claim_entries(study)
    was = recorded.get("claim_entries")
    if was is None:
        return []
    multiplicity = getattr(study, "multiplicity", None) or "none"
    changed = ["multiplicity"] if recorded.get("multiplicity", "none") != multiplicity else []
    if [e.get("claim") for e in was] != [e["claim"] for e in now]:
        return [*changed, "claims"]
    for i, (old, new) in enumerate(zip(was, now, strict=True)):
        for name in sorted(set(old) | set(new)):
            if old.get(name) != new.get(name):
                changed.append(f"claims[{i}].{name}")
    return changed


def claim_row(c: ClaimLook) -> dict[str, Any]:
    """The `look_claims` row of a claim at a look (store/db.py LookClaimRow, less the study and the look)."""
    row = {k: v for k, v in c.row().items() if k not in ("index", "claim", "cells", "sides", "weight")}
    return {**row, "claim": c.index, "text": c.claim, "cells": [list(side) for side in c.sides]}


def looks_from_rows(rows: list[dict[str, Any]]) -> list[Look]:
    """Looks as `analysis.data.looks_of` reads them from the ledger."""
    looks = []
    for r in rows:
        claims = []
        design = r.get("design") or {}
        weights = design.get("holm_weights") or []
        for c in r["claims"]:
            sides = [list(side) for side in c.get("cells") or []]
            values = {k: (math.nan if c.get(k) is None else float(c[k])) for k in _FLOATS}
            claims.append(
                ClaimLook(
                    c["claim"],
                    c["text"],
                    ClaimState(c["state"]),
                    bool(c["analysed"]),
                    c.get("decided_at"),
                    int(c.get("seeds") or 0),
                    needed=c.get("needed"),
                    test=c.get("test") or "",
                    detail=c.get("detail") or "",
                    cells=list(dict.fromkeys(x for side in sides for x in side)),
                    sides=sides,
                    weight=float(weights[c["claim"]]) if c["claim"] < len(weights) else 1.0,
                    **values,
                )
            )
        multiplicity = design.get("multiplicity", "none")
        looks.append(Look(r["number"], dict(r["seeds"]), claims, dict(r["next_seeds"]), int(r["step"]), multiplicity))
    return looks


def design_of(row: dict[str, Any]) -> Design:
    """A Design from its `looks.design` row (fields a newer or older studyrunner does not know are left out)."""
    return Design(**{k: row[k] for k in Design.__dataclass_fields__ if k in row})
