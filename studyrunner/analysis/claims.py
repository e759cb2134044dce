"""`studyrunner verify`: each declared claim decided by one test at one-sided level ALPHA = 0.05.

A claim compares two sides (see `studyrunner.study.claims_grammar` for the grammar; docs/analysis/claims.md
for the user's account). Every directional claim (`<`, `>`, `<=`, `>=`; `>=` reads as `>`) is decided by one
test, which gives two one-sided p-values, `p_up` (lhs is greater) and `p_down` (lhs is less):

- **supported**: the one-sided p in the claimed direction is < alpha;
- **contradicted**: the one-sided p in the opposite direction is < alpha;
- **inconclusive**: neither, or too few seeds for the test.

The interval shown is the one the verdict uses: the two one-sided (1 − alpha) bounds of the same test (at
alpha 0.05 a two-sided 90% interval), so its lower bound lies above 0 exactly when a `>` claim is supported.
`p` is the one-sided p in the verdict's direction (the claimed one when inconclusive); `p_claimed` and
`p_opposite` are both. `verify(..., holm=True)` adjusts over the claims' `p` by Holm's step-down method,
counting identical hypotheses (the same test on the same trials in the same direction) once.

Tests per quantity (the seed is the unit of replication: a side that spans several cells is reduced to
one value per seed, the mean of that seed's cells, before any test of means, IQMs or medians):

| quantity | against a number | against the same quantity |
|---|---|---|
| metric mean | one-sample t over seeds | paired t over shared seeds (2+), else Welch over seeds |
| iqm | one-sample Yuen trimmed t | paired: one-sample Yuen of per-seed differences; else two-sample Yuen |
| median | exact sign (order-statistic) test | stratified bootstrap, from 10 seeds a side |
| failure_rate | exact binomial test (Clopper-Pearson bounds) | exact McNemar over shared seeds, else Fisher |
| slope | the fit's CR2 t by seed | CR2 t of the interaction |

On seeds no t-test describes (`why_irregular`, `tied`: the failure rule splits them, a cell is bimodal,
values tie at an extreme such as an accuracy of 1, or the spread is zero), a comparison is decided by an
exact randomisation test (`exact`: sign flips over shared seeds, permutations over disjoint ones or
within seeds for a slope) whose shift interval agrees with it; a mean or IQM against a number, or a
difference of slopes or medians, cannot be decided there (inconclusive, pointing to the failure-rate
claim that can), nor a mean or IQM against a number in a study whose `failure:` rule says seeds may
fail. A metric that does not depend on the seed (`deterministic`) is decided by the sign of the
difference. Every test records its inputs in `extra["design"]` for `power.seeds_needed`. The user's
account, with the simulation table: docs/analysis/claims.md.

Slope claims fit every finished seed with a value (failed seeds at their recorded metric); seeds without a
finite value (diverged) are dropped and counted in the detail. A claim whose evidence rests on fewer than
3 seeds a side says so in its detail.

**pending** (a study still running): a claim one of whose sides selects a trial that has not finished
(pending or running) is `pending`, whatever its finished seeds say so far, and never fails `verify`.
Where the finished seeds already allow it, the claim is still evaluated on them and the detail reads
"pending: N trials unfinished; supported on the finished seeds so far" (the interval is shown); where
they do not (no finished trial selected yet), the detail is "pending: N trials unfinished". The reading
chosen: a verdict is only final once every seed it rests on is in, so an early contradiction does not
fail a CI run mid-study, and an early support is not taken as final.

A claim that names a field the study does not have, or selects no trial at all, is `invalid`.

Where it lives: this module parses a claim, sends it to the test of its quantity and adjusts by Holm; the
tests are in `claims_location` (means, IQMs, medians), `claims_slope` and `claims_failure`; the trials and
per-seed values a side rests on, and the checks that choose between a t-test and an exact one, in
`claims_evidence`; `Verdict` and the endings the tests share in `claims_verdict`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..study.claims_grammar import Claim, GrammarError, Number, parse_claim
from ..study.schema import ClaimEntry
from .claims_evidence import STATISTICS, count_unfinished, seeds_dropped, seeds_used, side_rows, why_irregular
from .claims_failure import failure_rate_vs_number, failure_rates
from .claims_location import location_vs_number, locations
from .claims_slope import slope_fit, slope_vs_number, slopes
from .claims_verdict import (
    ALPHA,
    CONTRADICTED,
    INCONCLUSIVE,
    INVALID,
    PENDING,
    SUPPORTED,
    InvalidClaim,
    MalformedClaim,
    Verdict,
)
from .data import StudyData

# the public names, as before the tests moved out (`claims_*`)
__all__ = [
    "ALPHA", "CONTRADICTED", "FEW_SEEDS", "INCONCLUSIVE", "INVALID", "PENDING", "SUPPORTED", "Verdict",
    "adjust_holm", "evaluate", "flat", "verdict_table", "verify",
]  # fmt: skip

FEW_SEEDS = 3  # fewer seeds a side than this: the detail says so


def evaluate(data: StudyData, claim: Claim | ClaimEntry | dict | str, alpha: float = ALPHA) -> Verdict:
    """Decide one claim on a study's finished trials at one-sided level `alpha` (`pending` while a trial it
    selects is unfinished); the interval shown is the test's 1 − 2·alpha one (both one-sided bounds)."""
    claim = ClaimEntry.model_validate(claim) if isinstance(claim, dict) else claim
    min_effect = claim.min_effect if isinstance(claim, ClaimEntry) else None
    claim = claim.claim if isinstance(claim, ClaimEntry) else claim
    text = claim if isinstance(claim, str) else claim.text

    def bare(verdict: str, detail: str, unfinished: int = 0) -> Verdict:
        return Verdict(text, verdict, detail=detail, unfinished=unfinished, min_effect=min_effect, alpha=alpha)

    try:
        claim = parse_claim(claim) if isinstance(claim, str) else claim
        unfinished = sum(count_unfinished(data, q) for q in claim.quantities)
    except (GrammarError, InvalidClaim) as exc:
        return bare(INVALID, str(exc))
    try:
        v = _evaluate(data, claim, Verdict(text, INCONCLUSIVE, min_effect=min_effect, alpha=alpha))
    except InvalidClaim as exc:
        if not unfinished or isinstance(exc, MalformedClaim):
            return bare(INVALID, str(exc))
        # nothing to evaluate yet (no finished trial, or none reported the metric): wait for the rest
        return bare(PENDING, f"pending: {unfinished} trials unfinished ({exc} so far)", unfinished)
    if not v.seeds:
        v.seeds = tuple(seeds_used(data, q) for q in claim.quantities)
    notes = [v.detail] if v.detail else []
    dropped = sum(seeds_dropped(data, q) for q in claim.quantities if q.kind == "slope")
    if dropped:
        notes.append(f"{dropped} seeds dropped: no value (diverged)")
    if v.seeds and min(v.seeds) < FEW_SEEDS:
        few = min(v.seeds)
        seeds = f"{few} seed{'' if few == 1 else 's'} per side"
        if any(q.kind == "failure_rate" for q in claim.quantities):
            notes.append(f"{seeds}: an exact test on so few seeds can hardly reach p < {alpha:g}")
        else:
            notes.append(f"{seeds}: an interval from fewer than {FEW_SEEDS} seeds is wide and rests on normality")
    if unfinished:
        v.extra["interim"] = v.verdict
        notes.insert(0, f"pending: {unfinished} trials unfinished; {v.verdict} on the finished seeds so far")
        v.verdict, v.unfinished = PENDING, unfinished
    v.detail = "; ".join(notes)
    return v


def _flip(op: str) -> str:
    return {"<": ">", ">": "<", "<=": ">=", ">=": "<="}[op]


def _evaluate(data: StudyData, claim: Claim, v: Verdict) -> Verdict:
    lhs, op, rhs = claim.lhs, claim.op, claim.rhs
    if isinstance(lhs, Number):  # `0.5 < x` is `x > 0.5`
        lhs, op, rhs = rhs, _flip(op), lhs
    greater = op in (">", ">=")
    if isinstance(rhs, Number):
        v.rhs = rhs.value
        rows = side_rows(data, lhs)
        if lhs.kind == "failure_rate":
            return failure_rate_vs_number(v, rows, greater, rhs.value)
        if lhs.kind == "slope":
            f = slope_fit(data, lhs, rows)
            return slope_vs_number(v, f, lhs, greater, rhs.value, why_irregular(data, [(rows, lhs.metric)]))
        irregular = why_irregular(data, [(rows, lhs.metric)])
        if not irregular and data.failure_rule is not None and lhs.kind != "median":
            irregular = (
                f"the study's failure rule ({data.failure_rule.text}) says seeds may fail, and a {lhs.kind} "
                "against a number mixes failed and learned seeds in a share a few seeds cannot pin down"
            )
        return location_vs_number(v, rows, lhs, greater, rhs.value, irregular)
    if lhs.kind != rhs.kind and not (lhs.kind in STATISTICS and rhs.kind in STATISTICS):
        raise MalformedClaim(f"cannot compare {lhs.kind} with {rhs.kind}")
    a_rows, b_rows = side_rows(data, lhs), side_rows(data, rhs)
    if lhs.kind == "failure_rate":
        return failure_rates(v, a_rows, b_rows, greater)
    irregular = why_irregular(data, [(a_rows, lhs.metric), (b_rows, rhs.metric)])
    if lhs.kind == "slope":
        fa, fb = slope_fit(data, lhs, a_rows), slope_fit(data, rhs, b_rows)
        return slopes(v, fa, fb, lhs, rhs, greater, irregular)
    return locations(v, a_rows, b_rows, lhs, rhs, greater, irregular)


# --- the study's claims -----------------------------------------------------------------------------


def verify(data: StudyData, claims: list | None = None, holm: bool = False, alpha: float = ALPHA) -> list[Verdict]:
    """Every claim of the study (or `claims`: texts or ClaimEntry), in order, decided at one-sided `alpha`;
    `holm`: with Holm-adjusted p-values beside."""
    verdicts = [evaluate(data, c, alpha) for c in (data.claims if claims is None else claims)]
    return adjust_holm(verdicts, alpha) if holm else verdicts


def adjust_holm(verdicts: list[Verdict], alpha: float = ALPHA) -> list[Verdict]:
    """Holm's step-down control of the family-wise error over the claims that were decided (supported,
    contradicted or inconclusive) and have a p-value; each gets `p_holm` and `verdict_holm` (a supported or
    contradicted claim whose adjusted p is >= alpha becomes inconclusive). Identical hypotheses (the same
    test on the same trials in the same direction, e.g. a slope over two depths and the pairwise claim on
    those cells: the same trials a side, the same p) count once. Claims without a p-value, pending or
    invalid keep their verdict and a NaN `p_holm`."""
    from statsmodels.stats.multitest import multipletests

    tested = [v for v in verdicts if v.verdict in (SUPPORTED, CONTRADICTED, INCONCLUSIVE) and np.isfinite(v.p)]
    for v in verdicts:
        v.p_holm, v.verdict_holm = math.nan, v.verdict
    groups: dict[object, list[Verdict]] = {}
    for i, v in enumerate(tested):
        same = (v.hypothesis, v.verdict, round(v.p, 12)) if v.hypothesis is not None else i
        groups.setdefault(same, []).append(v)
    if groups:
        members = list(groups.values())
        adjusted = multipletests([group[0].p for group in members], alpha=alpha, method="holm")[1]
        for group, p in zip(members, adjusted, strict=True):
            for v in group:
                v.p_holm = float(p)
                if v.verdict in (SUPPORTED, CONTRADICTED) and p >= alpha:
                    v.verdict_holm = INCONCLUSIVE
    return verdicts


def verdict_table(verdicts: list[Verdict], holm: bool = False) -> pd.DataFrame:
    """One row per verdict; `seeds_needed` holds a dict (JSON output) or None: `flat` it for CSV."""
    return pd.DataFrame([v.row(holm) for v in verdicts], columns=list(Verdict("", "").row(holm)))


def flat(table: pd.DataFrame) -> pd.DataFrame:
    """The verdict table for CSV: `seeds_needed` as a JSON string (empty where none)."""
    import json

    if "seeds_needed" not in table:
        return table
    return table.assign(seeds_needed=table.seeds_needed.map(lambda d: json.dumps(d) if d else ""))
