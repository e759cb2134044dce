"""A claim's verdict, and the ways a test sets it.

`Verdict` is what `claims.evaluate` returns (and `sequential.verdicts` rebuilds from the looks). The helpers are
the endings the tests of every quantity share (`location`, `slope`, `failure`): a verdict from
the deciding test's two one-sided p-values (`conclude`), from a difference known exactly (`exact_difference`),
from an exact randomisation test (`randomised`), and the inconclusive verdict of seeds on which no test holds
its level (`cannot_decide`). Which test decides which claim: the module docstring of `decide`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from ...study.claims_grammar import Quantity
from . import exact


class VerdictKind(StrEnum):
    """What a claim's verdict says (`Verdict.verdict`, and `verdict` in `verify --format json`): a `StrEnum`, so
    it prints, compares and serialises as its word."""

    SUPPORTED = "supported"
    CONTRADICTED = "contradicted"
    INCONCLUSIVE = "inconclusive"
    INVALID = "invalid"
    PENDING = "pending"  # trials the claim selects have not finished


ALPHA = 0.05  # every directional claim is decided at this one-sided level (exactly 0.05, not 1 - 0.95)


@dataclass
class Verdict:
    claim: str
    verdict: VerdictKind
    estimate: float = math.nan  # lhs - rhs (or lhs - number); on `scale` where one is named
    lo: float = math.nan
    hi: float = math.nan
    lhs: float = math.nan
    rhs: float = math.nan
    test: str = ""
    detail: str = ""
    extra: dict = field(default_factory=dict)
    # The one-sided p of the deciding test in the verdict's direction (the claimed one when inconclusive);
    # NaN where the claim cannot be decided.
    p: float = math.nan
    # Seeds (values) each side's evidence rests on (paired: the shared seeds); () until counted.
    seeds: tuple[int, ...] = ()
    unfinished: int = 0  # trials the claim's sides select that have not finished
    # Holm's step-down adjustment over the study's claims (`verify(..., holm=True)`); NaN / "" otherwise.
    p_holm: float = math.nan
    verdict_holm: VerdictKind | str = ""
    # The one-sided p-values of the test that decides the claim, in the claimed direction and the opposite
    # one (NaN only where the claim cannot be decided, e.g. too few seeds).
    p_claimed: float = math.nan
    p_opposite: float = math.nan
    min_effect: float | None = None  # the claim's smallest effect of interest (study file), on its scale
    seeds_needed: dict | None = None  # for an inconclusive claim: {"observed": ..., "min_effect": ...}
    alpha: float = ALPHA  # the one-sided level it was decided at; [lo, hi] is the 1 − 2·alpha interval
    # The scale of estimate/lo/hi when it is not the difference lhs − rhs: "odds ratio" (Fisher's test,
    # where no effect is 1, not 0).
    scale: str = ""
    # What makes two claims one hypothesis for Holm: the test, the trials of each side, the direction.
    hypothesis: tuple | None = field(default=None, repr=False)
    # The entry's margin (equivalence `~=`, non-inferiority `>=` / `<=`), on the estimate's scale; None: none.
    margin: float | None = None
    # Why a claim that is inconclusive gets no more seeds: "futility" (a sequential look stopped it), else "".
    stopped: str = ""
    # How the interval was computed: "fixed" (one look: the two one-sided (1 − alpha) bounds) or "repeated" (a
    # sequential look's repeated confidence interval, Jennison & Turnbull ch. 9: at the look's `nominal`
    # one-sided level, so that its simultaneous level over every look is 1 − 2·alpha).
    interval_kind: str = "fixed"
    nominal: float = math.nan  # a repeated interval's one-sided nominal level (NaN for a fixed one)

    @property
    def shown_verdict(self) -> str:
        """The verdict as printed: an inconclusive claim a sequential look stopped for futility says so (it is no
        tie: the data only could not decide it within `max`)."""
        return f"{self.verdict} (stopped for futility)" if self.stopped == "futility" else self.verdict

    @property
    def interval_label(self) -> str:
        """What the interval is, for tables: 'fixed 90%', or 'repeated-confidence 90% (nominal 98.3%)' for a
        sequential look's repeated confidence interval (simultaneous over the looks; computed at the nominal
        level of the look that decided or stopped the claim)."""
        if math.isnan(self.lo) and math.isnan(self.hi):
            return ""
        level = _percent(1 - 2 * self.alpha)
        if self.interval_kind == "repeated":
            nominal = f" (nominal {_percent(1 - 2 * self.nominal)})" if math.isfinite(self.nominal) else ""
            return f"repeated-confidence {level}{nominal}"
        return f"fixed {level}"

    @property
    def null(self) -> float:
        """The value of estimate/lo/hi that means no difference (1 on the odds-ratio scale, else 0)."""
        return 1.0 if self.scale == "odds ratio" else 0.0

    def row(self, holm: bool = False) -> dict:
        row = {
            "claim": self.claim,
            "verdict": self.verdict,
            "lhs": self.lhs,
            "rhs": self.rhs,
            "difference": self.estimate,
            "lo": self.lo,
            "hi": self.hi,
            "scale": self.scale or "difference",
            "confidence": 1 - 2 * self.alpha,
            "interval_kind": "repeated-confidence" if self.interval_kind == "repeated" else "fixed",
            "nominal_confidence": 1 - 2 * self.nominal if self.interval_kind == "repeated" else math.nan,
            "interval_label": self.interval_label,
            "margin": self.margin,
            "stopped": self.stopped or None,
            "p": self.p,
            "p_claimed": self.p_claimed,
            "p_opposite": self.p_opposite,
            "test": self.test,
            "detail": self.detail,
            "min_effect": self.min_effect,
            "seeds_needed": self.seeds_needed,
        }
        if holm:
            row["p_holm"], row["verdict_holm"] = self.p_holm, self.verdict_holm
        return row


def _percent(level: float) -> str:
    """0.9 -> '90%', 0.9828 -> '98.3%', 0.99972 -> '99.97%': one decimal, more where it would round to 100%."""
    digits = 1
    while digits < 6 and level < 1 and round(100 * level, digits) >= 100:
        digits += 1
    text = f"{100 * level:.{digits}f}".rstrip("0").rstrip(".")
    return f"{text}%"


class InvalidClaim(Exception):
    """A claim that cannot be evaluated on the finished trials (an unknown field, no trial selected): `invalid`,
    or `pending` while trials it selects are unfinished."""


class MalformedClaim(InvalidClaim):
    """A claim no further trial can make answerable (invalid even while trials are unfinished)."""


def conclude(v: Verdict, greater: bool, p_up: float, p_down: float) -> Verdict:
    """The verdict from the deciding test's one-sided p-values: "lhs is greater" (`p_up`), "lhs is less"
    (`p_down`), for a claim that lhs is greater (`greater`) or less; NaN p-values decide nothing."""
    p_claimed, p_opposite = (float(p_up), float(p_down)) if greater else (float(p_down), float(p_up))
    v.p_claimed, v.p_opposite = p_claimed, p_opposite
    if p_claimed < v.alpha:
        v.verdict, v.p = VerdictKind.SUPPORTED, p_claimed
    elif p_opposite < v.alpha:
        v.verdict, v.p = VerdictKind.CONTRADICTED, p_opposite
    else:
        v.verdict, v.p = VerdictKind.INCONCLUSIVE, p_claimed
    return v


def exact_difference(v: Verdict, greater: bool, difference: float, null: float = 0.0) -> Verdict:
    """The verdict of a difference known exactly (`deterministic`): its side of `null` decides it."""
    v.estimate = v.lo = v.hi = difference
    v.test = "exact: every seed gives the same value in each cell (the metric does not depend on the seed)"
    return conclude(v, greater, 0.0 if difference > null else 1.0, 0.0 if difference < null else 1.0)


def randomised(v: Verdict, res: exact.Randomisation | None, why: str, greater: bool) -> Verdict:
    """The verdict of an exact randomisation test (`exact`), said to be one, and what it can reach."""
    if res is None:
        v.detail = "; ".join(filter(None, [v.detail, f"{why}: too few seeds for a test"]))
        return v
    v.estimate, v.lo, v.hi = res.estimate, res.lo, res.hi
    v.test = f"exact {res.method}, interval by inverting it under a shift"
    note = f"{why}: a randomisation test, exact on any seeds (smallest p {res.smallest_p:.3g})"
    if res.smallest_p >= v.alpha:
        note += f"; it cannot reach p < {v.alpha:g} with these seeds"
    v.detail = "; ".join(filter(None, [v.detail, note]))
    return conclude(v, greater, res.p_up, res.p_down)


def cannot_decide(v: Verdict, q: Quantity, reason: str, against_number: bool = False) -> Verdict:
    """Inconclusive, saying why no test of this quantity holds its level here and what would decide it."""
    where = f"[{', '.join(f'{k}={val}' for k, val in q.selector)}]" if q.selector else ""
    v.lo = v.hi = math.nan
    v.test = "no test holds its level here"
    what = f"a {q.kind} against a number" if against_number else f"a difference of {q.kind}s"
    v.detail = (
        f"cannot decide: {reason}, and no test of {what} holds its level on such seeds; a failure-rate claim "
        f"decides it, e.g. failure_rate{where} < 0.5 with a `failure:` rule (its exact binomial test holds)"
    )
    return v


def cannot_shift(v: Verdict, q: Quantity, reason: str) -> Verdict:
    """Inconclusive: a margin (equivalence, non-inferiority) tests a difference against a value other than 0, and
    on seeds that fail or succeed no test of that holds its level. The randomisation tests are exact there only
    for no difference at all (both sides' seeds from the same mixture); a shift of the mean is no shift of the
    seeds' distribution."""
    v.lo = v.hi = math.nan
    v.test = "no test holds its level here"
    where = f"[{', '.join(f'{k}={val}' for k, val in q.selector)}]" if q.selector else ""
    v.detail = (
        f"cannot decide: {reason}, and a margin asks whether the difference lies beyond a value other than 0, "
        "which no test holds its level for on such seeds (the randomisation tests are exact only for no difference "
        f"at all); compare the failure rates, e.g. failure_rate{where} < 0.5 with a `failure:` rule"
    )
    return v


def shifted(v: Verdict, res: dict, c: float) -> None:
    """Set v's interval from a test of lhs against c (bounds on the lhs scale) as lhs − c."""
    v.estimate, v.lo, v.hi = v.lhs - c, res["lo"] - c, res["hi"] - c
