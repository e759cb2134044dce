"""Seeds needed: how many seeds per side a claim's own test needs to reach 80% power.

`seeds_needed(data, claim)` answers for the test `verify` uses on that claim at the study's current design
(the same pairing, cells per side, x values of a slope), for the effect observed so far (`effect=None`) or a
given one (a claim's `min_effect`). It is an estimate: the spread it assumes is estimated from the few
seeds run so far.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..study.claims_grammar import Claim
from ..study.schema import ClaimEntry
from .data import StudyData

ALPHA = 0.05  # = claims.ALPHA (not imported: claims imports this module)
POWER = 0.8
MAX_SEEDS = 1000  # per side; beyond it `per_side` is None


@dataclass
class SeedsNeeded:
    per_side: int | None  # seeds per side for `power` at `effect`; None: more than MAX_SEEDS (or never)
    effect: float  # the effect it was computed for, on the claim's scale
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
    (None: the effect observed so far). None where it cannot be said (an invalid claim, no spread yet)."""
    return None
