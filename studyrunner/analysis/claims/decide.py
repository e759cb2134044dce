"""`studyrunner verify`: each declared claim decided by one test at one-sided level ALPHA = 0.05.

A claim compares two sides (see `studyrunner.study.claims_grammar` for the grammar; docs/analysis/claims.md
for the user's account). Every directional claim (`<`, `>`, `<=`, `>=`; `>=` reads as `>`) is decided by one
test, which gives two one-sided p-values, `p_up` (lhs is greater) and `p_down` (lhs is less):

- **supported**: the one-sided p in the claimed direction is < alpha;
- **contradicted**: the one-sided p in the opposite direction is < alpha;
- **inconclusive**: neither, or too few seeds for the test.

The interval shown is the one the verdict uses: the two one-sided (1 − alpha) bounds of the same test (at
alpha 0.05 a two-sided 90% interval), so its lower bound lies above 0 exactly when a `>` claim is supported.

A ClaimEntry's `margin` δ changes what is tested, with the same test per quantity (below): `A >= B` (`A <= B`)
is **non-inferiority**, the test of A − B > −δ (A − B < δ): supported when the lower (upper) bound lies beyond
∓δ, contradicted when the other bound does; `A ~= B` is **equivalence**, two one-sided tests (TOST: A − B > −δ
and A − B < δ, each at alpha): supported when both reject (the interval inside (−δ, δ)), contradicted when the
difference is shown beyond the margin, p the larger of the two. A margin is not decided (inconclusive) in a
study whose failure rule says seeds may fail, on seeds the rule splits or a bimodal cell (`cannot_shift`: the
randomisation tests are exact only for no difference at all), nor below MARGIN_FROM (5) seeds per side, where a
second mode cannot show yet (`_margin_floor`); a failure rate or median against a number is exact at any count.
Each verdict records the one-sided tests it rests on in `extra["tests"]` (claimed: all must reject; opposite:
any), which a sequential look compares with its nominal level.
`p` is the one-sided p in the verdict's direction (the claimed one when inconclusive); `p_claimed` and
`p_opposite` are both. `verify(..., holm=True)` adjusts over the claims' `p` by Holm's step-down method,
counting identical hypotheses (the same test on the same trials in the same direction) once.

Tests per quantity (the seed is the unit of replication: a side that spans several cells is reduced to
one value per seed, the mean of that seed's cells, before any test of means, IQMs or medians):

| quantity | against a number | against the same quantity |
|---|---|---|
| metric mean | one-sample t and the gate (known range only*) | paired t over shared seeds (2+), else Welch |
| iqm | one-sample Yuen trimmed t (known range only*) | paired: Yuen of per-seed differences; else two-sample Yuen |
| median | exact sign (order-statistic) test | stratified bootstrap, from 10 seeds a side |
| failure_rate | exact binomial test (Clopper-Pearson bounds) | exact McNemar over shared seeds, else Fisher |
| slope | the fit's CR2 t by seed | CR2 t of the interaction |

*A mean or IQM against a number on a metric of no known range (`bounded.range_of`) is not decided
(`location.no_range`): no test of a mean holds its level on skewed seeds without a bound (Bahadur & Savage
1956; the t-test called 19-28% of skewed nulls supported under the looks); the median's sign test and comparisons
of cells are.

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
tests are in `location` (means, IQMs, medians), `slope` and `failure`; the trials and per-seed values a side
rests on, and the checks that choose between a t-test and an exact one, in `evidence`; `Verdict` and the
endings the tests share in `verdict` (all in this package, `studyrunner.analysis.claims`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...study.claims_check import MARGIN_FROM  # seeds per side from which a margin claim is decided
from ...study.claims_grammar import EQUIVALENT, Claim, GrammarError, Number, flip, parse_claim
from ...study.schema import ClaimEntry
from ..data import StudyData
from . import bounded
from .evidence import STATISTICS, count_unfinished, seeds_dropped, seeds_used, side_rows, why_irregular
from .failure import failure_rate_vs_number, failure_rates
from .location import location_vs_number, locations
from .slope import slope_fit, slope_vs_number, slopes
from .verdict import ALPHA, InvalidClaim, MalformedClaim, Verdict, VerdictKind, cannot_shift

FEW_SEEDS = 3  # fewer seeds a side than this: the detail says so


def evaluate(data: StudyData, claim: Claim | ClaimEntry | dict | str, alpha: float = ALPHA) -> Verdict:
    """Decide one claim on a study's finished trials at one-sided level `alpha` (`pending` while a trial it
    selects is unfinished); the interval shown is the test's 1 − 2·alpha one (both one-sided bounds). A
    ClaimEntry's `margin` makes `~=` an equivalence claim and `>=` / `<=` a non-inferiority one."""
    claim = ClaimEntry.model_validate(claim) if isinstance(claim, dict) else claim
    min_effect = claim.min_effect if isinstance(claim, ClaimEntry) else None
    margin = claim.margin if isinstance(claim, ClaimEntry) else None
    claim = claim.claim if isinstance(claim, ClaimEntry) else claim
    text = claim if isinstance(claim, str) else claim.text

    def bare(verdict: VerdictKind, detail: str, unfinished: int = 0) -> Verdict:
        return Verdict(
            text, verdict, detail=detail, unfinished=unfinished, min_effect=min_effect, alpha=alpha, margin=margin
        )

    try:
        claim = parse_claim(claim) if isinstance(claim, str) else claim
        unfinished = sum(count_unfinished(data, q) for q in claim.quantities)
        if claim.op == EQUIVALENT and margin is None:
            raise MalformedClaim("an equivalence claim (~=) needs a margin: {claim: '...', margin: 0.02}")
        if margin is not None and claim.op in ("<", ">"):
            raise MalformedClaim("a margin goes with >= or <= (non-inferiority) or ~= (equivalence), not < or >")
    except (GrammarError, InvalidClaim) as exc:
        return bare(VerdictKind.INVALID, str(exc))
    try:
        start = Verdict(text, VerdictKind.INCONCLUSIVE, min_effect=min_effect, alpha=alpha, margin=margin)
        v = _decide(data, claim, start)
    except InvalidClaim as exc:
        if not unfinished or isinstance(exc, MalformedClaim):
            return bare(VerdictKind.INVALID, str(exc))
        # nothing to evaluate yet (no finished trial, or none reported the metric): wait for the rest
        return bare(VerdictKind.PENDING, f"pending: {unfinished} trials unfinished ({exc} so far)", unfinished)
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
        v.verdict, v.unfinished = VerdictKind.PENDING, unfinished
    v.detail = "; ".join(notes)
    return v


def _sides(claim: Claim) -> tuple:
    """(lhs, op, rhs) with a number, if any, on the right: `0.5 < x` is `x > 0.5`."""
    lhs, op, rhs = claim.lhs, claim.op, claim.rhs
    if isinstance(lhs, Number):
        lhs, op, rhs = rhs, flip(op), lhs
    return lhs, op, rhs


def _decide(data: StudyData, claim: Claim, v: Verdict) -> Verdict:
    """A directional claim (`<`, `>`; `>=` / `<=` without a margin read as `>` / `<`), a non-inferiority claim
    (`>=` / `<=` with a margin: the directional test against −margin / +margin) or an equivalence claim (`~=`:
    two one-sided tests, `_equivalence`)."""
    lhs, op, rhs = _sides(claim)
    exact = lhs.kind in ("failure_rate", "median") and isinstance(rhs, Number)  # exact at any number, on any seeds
    if v.margin is not None and data.failure_rule is not None and not exact:
        reason = f"the study's failure rule ({data.failure_rule.text}) says seeds may fail"
        v = cannot_shift(v, lhs, reason)
        v.extra["tests"] = {"claimed": [(math.nan, 0.0)], "opposite": [(math.nan, 0.0)]}
        return v
    if op == EQUIVALENT:
        v = _equivalence(data, lhs, rhs, v)
    else:
        greater = op in (">", ">=")
        shift = 0.0 if v.margin is None else (-v.margin if greater else v.margin)
        v = _evaluate(data, lhs, rhs, greater, v, shift)
        _record_tests(v, shift)
        if v.margin is not None:
            sign = "lhs − rhs > " if greater else "lhs − rhs < "
            v.test = f"non-inferiority by {v.margin:g} ({sign}{shift:g}): {v.test}"
    if v.margin is not None and not exact:
        _margin_floor(v, v.seeds or tuple(seeds_used(data, q) for q in claim.quantities))
    return v


def _margin_floor(v: Verdict, seeds: tuple[int, ...]) -> None:
    """A margin claim (equivalence, non-inferiority) is decided only from MARGIN_FROM seeds per side. A margin
    tests the difference against a value other than 0, which no test holds its level for on seeds that fail or
    learn, so such seeds must be seen as such (`why_irregular`: a `failure:` rule's split, or two modes, read from
    5 seeds); at 2-4 seeds that all fell in one mode, two cells whose failure rates differ look alike, and false
    equivalence ran at 0.13-0.22 (benchmarks/equivalence.py, bimodal seeds without a rule). Below it the verdict is
    inconclusive and a sequential look does not cross (`extra["held"]`; its futility rule still applies)."""
    if not seeds or min(seeds) >= MARGIN_FROM:
        return
    v.extra["held"] = f"a margin is decided from {MARGIN_FROM} seeds per side; {min(seeds)} so far"
    if v.verdict not in (VerdictKind.SUPPORTED, VerdictKind.CONTRADICTED):
        return
    was = v.verdict
    v.verdict = VerdictKind.INCONCLUSIVE
    v.p = v.p_claimed
    v.detail = "; ".join(
        filter(
            None,
            [
                v.detail.replace(f"equivalent within ±{v.margin:g}", "within the margin by the tests alone").replace(
                    f"shown to differ by more than {v.margin:g}", "beyond the margin by the tests alone"
                ),
                f"{v.extra['held']} (where a second mode of the seeds shows): {was} by the tests alone",
            ],
        )
    )


def _record_tests(v: Verdict, shift: float) -> None:
    """The one-sided tests a sequential look compares with its boundary (`extra["tests"]`): for the claim to be
    supported every `claimed` one must cross, for it to be contradicted any `opposite` one; each as (the test's own
    p, the distribution-free gate's p or 0), the test's p meeting the look's nominal level and the gate's ALPHA."""
    gate = v.extra.get("gate")
    if gate is not None:
        claimed, opposite = (gate["t_claimed"], gate["claimed"]), (gate["t_opposite"], gate["opposite"])
    else:
        claimed, opposite = (v.p_claimed, 0.0), (v.p_opposite, 0.0)
    v.extra["tests"] = {"claimed": [claimed], "opposite": [opposite]}
    if "design" in v.extra:
        v.extra["design"]["shift"] = shift


def _equivalence(data: StudyData, lhs, rhs, v: Verdict) -> Verdict:
    """`A ~= B` with margin δ: two one-sided tests (TOST; Schuirmann 1987), each the claim's own test at level
    alpha, of A − B > −δ and of A − B < δ. Supported (equivalent) when both reject, i.e. the 1 − 2·alpha interval
    lies inside (−δ, δ); contradicted when the difference is shown to be at least δ away (the interval lies
    entirely outside [−δ, δ]: A − B < −δ or A − B > δ rejects at alpha); else inconclusive. The shown interval
    takes its lower bound from the first test and its upper bound from the second (the same test's bounds)."""
    delta = v.margin
    seen: dict = {}  # the sides' rows and the irregularity check, read once for both tests
    lower = _evaluate(data, lhs, rhs, True, _copy(v), -delta, seen)
    _record_tests(lower, -delta)
    upper = _evaluate(data, lhs, rhs, False, _copy(v), delta, seen)
    _record_tests(upper, delta)
    out = lower
    out.lo, out.hi = lower.lo, upper.hi
    out.test = f"equivalence within ±{delta:g}: two one-sided tests (TOST), each the {lower.test or 'test'}"
    tests = {
        "claimed": lower.extra["tests"]["claimed"] + upper.extra["tests"]["claimed"],
        "opposite": lower.extra["tests"]["opposite"] + upper.extra["tests"]["opposite"],
    }
    out.extra["tests"] = tests
    out.extra["tost"] = {"lower": lower.extra.get("design"), "upper": upper.extra.get("design")}
    held = [max(t, g) for t, g in tests["claimed"]]
    shown = [max(t, g) for t, g in tests["opposite"]]
    if not all(np.isfinite(held)):  # a side no test decides: nothing to conclude
        out.p_claimed = out.p_opposite = out.p = math.nan
        out.verdict = VerdictKind.INCONCLUSIVE
        return out
    out.p_claimed, out.p_opposite = max(held), min(shown)
    if out.p_claimed < v.alpha:
        out.verdict, out.p = VerdictKind.SUPPORTED, out.p_claimed
    elif out.p_opposite < v.alpha:
        out.verdict, out.p = VerdictKind.CONTRADICTED, out.p_opposite
    else:
        out.verdict, out.p = VerdictKind.INCONCLUSIVE, out.p_claimed
    out.hypothesis = None
    note = (
        f"equivalent within ±{delta:g}" if out.verdict == VerdictKind.SUPPORTED
        else f"shown to differ by more than {delta:g}" if out.verdict == VerdictKind.CONTRADICTED
        else f"neither equivalence within ±{delta:g} nor a difference beyond it is shown"
    )  # fmt: skip
    out.detail = "; ".join(filter(None, [out.detail, note]))
    return out


def _copy(v: Verdict) -> Verdict:
    return Verdict(v.claim, v.verdict, min_effect=v.min_effect, alpha=v.alpha, margin=v.margin)


def _evaluate(
    data: StudyData, lhs, rhs, greater: bool, v: Verdict, shift: float = 0.0, seen: dict | None = None
) -> Verdict:
    """lhs − rhs (or lhs − number) against `shift` (0, or a margin's ∓δ), one-sided in the direction `greater`.
    `seen`: the sides' rows and irregularity from an earlier call on the same claim (the two tests of TOST)."""
    seen = {} if seen is None else seen

    def rows_of(q):
        if id(q) not in seen:
            seen[id(q)] = side_rows(data, q)
        return seen[id(q)]

    def irregular_of(*parts):
        key = ("irregular", *(id(q) for q in parts))
        if key not in seen:
            seen[key] = why_irregular(data, [(rows_of(q), q.metric) for q in parts])
        return seen[key]

    if isinstance(rhs, Number):
        v.rhs = rhs.value
        c = rhs.value + shift  # the test's null on the lhs scale; estimate and interval stay lhs − number
        rows = rows_of(lhs)
        if lhs.kind == "failure_rate":
            v = failure_rate_vs_number(v, rows, greater, min(max(c, 0.0), 1.0) if shift else c)
        elif lhs.kind == "slope":
            f = slope_fit(data, lhs, rows)
            irregular = irregular_of(lhs)
            if irregular and shift:
                return cannot_shift(v, lhs, irregular)
            v = slope_vs_number(v, f, lhs, greater, c, irregular)
        else:
            irregular = irregular_of(lhs)
            if not irregular and data.failure_rule is not None and lhs.kind != "median":
                irregular = (
                    f"the study's failure rule ({data.failure_rule.text}) says seeds may fail, and a {lhs.kind} "
                    "against a number mixes failed and learned seeds in a share a few seeds cannot pin down"
                )
            v = location_vs_number(v, rows, lhs, greater, c, irregular, bounded.range_of(data, lhs.metric))
        v.rhs = rhs.value
        if shift and v.scale == "":
            v.estimate, v.lo, v.hi = v.estimate + shift, v.lo + shift, v.hi + shift
        return v
    if lhs.kind != rhs.kind and not (lhs.kind in STATISTICS and rhs.kind in STATISTICS):
        raise MalformedClaim(f"cannot compare {lhs.kind} with {rhs.kind}")
    a_rows, b_rows = rows_of(lhs), rows_of(rhs)
    if lhs.kind == "failure_rate":
        if shift:
            raise MalformedClaim("no exact test of a difference of failure rates within a margin is built")
        return failure_rates(v, a_rows, b_rows, greater)
    irregular = irregular_of(lhs, rhs)
    if lhs.kind == "slope":
        fa, fb = slope_fit(data, lhs, a_rows), slope_fit(data, rhs, b_rows)
        return slopes(v, fa, fb, lhs, rhs, greater, irregular, shift)
    return locations(v, a_rows, b_rows, lhs, rhs, greater, irregular, shift)


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

    decided = (VerdictKind.SUPPORTED, VerdictKind.CONTRADICTED, VerdictKind.INCONCLUSIVE)
    tested = [v for v in verdicts if v.verdict in decided and np.isfinite(v.p)]
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
                if v.verdict in (VerdictKind.SUPPORTED, VerdictKind.CONTRADICTED) and p >= alpha:
                    v.verdict_holm = VerdictKind.INCONCLUSIVE
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
