"""What `validate` (and `submit`) check of a study's `claims:` beyond the grammar, once it is compiled.

Each claim must be answerable by this study: its metrics are ones a trial of the study reports (the
names `check_feasible` collects: trainer, task and depth metrics, decoding metrics, the families'
diagnostics), its selector keys are fields of the cells' configs (a dotted path, a unique leaf, or
cell / family / task / baseline / seed), its selector values occur in the study (grid, zip, include,
baselines; a search's values are not known before it runs, so only its grid axes are checked), and a
failure rate is compared with a share in [0, 1]. A non-finite number never parses (the grammar). An entry's
`min_effect` and `margin` must fit the claim's scale (below the width of the metric's range, where it is known:
`_range`, the one place this module reads a metric's range); `~=` needs a margin, `<` and `>` take none.
Errors are one line naming the claim (`claims[i]`), its line in the file and how to mend it.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass

from .canonical import flatten_config
from .claims_grammar import EQUIVALENT, Number, Quantity, flip, parse_claim, selector_column, values_equal
from .compiled import CompiledStudy
from .levels import metric_range
from .spec_errors import spec_error


def check_claims(compiled: CompiledStudy, reports: Callable[[str], bool], reported: Callable[[], set[str]]) -> None:
    """Raise a SpecError for the first claim this study cannot answer. `reports(name)`: whether a trial
    reports the metric; `reported()`: every name, for the message."""
    study = compiled.study
    if not study.claims:
        return
    flat = [flatten_config(c.config) for c in compiled.cells]
    paths = list(dict.fromkeys(p for f in flat for p in f))
    varied = [p for p in paths if len({repr(f.get(p)) for f in flat}) > 1]
    searched = set(study.search.space) if study.search is not None else set()
    for i, text in enumerate(study.claim_texts):

        def fail(msg: str, i=i, text=text) -> None:
            raise spec_error(study.source, study._node, ("claims", i), f"{text!r}: {msg}")

        claim = parse_claim(text)
        for q in claim.quantities:
            if q.metric is not None and not reports(q.metric):
                names = sorted(reported())
                near = difflib.get_close_matches(q.metric, names, n=5, cutoff=0.6)
                near = near or [n for n in names if n.split("_")[0] == q.metric.split("_")[0]][:12]
                hint = f"; did you mean: {', '.join(near)}" if near else f"; reported: {', '.join(names[:20])}"
                fail(f"no trial of this study reports metric {q.metric!r}{hint}")
            for key, value in q.selector:
                column = _column(key, paths, varied, fail)
                if column == "baseline" or column in searched or (column == "cell" and searched):
                    continue  # derived per trial, or suggested by the search as it runs
                if column == "seed":
                    known = study.seed_values
                elif column == "cell":
                    known = [c.label for c in compiled.cells]
                else:
                    known = list(dict.fromkeys(f.get(column) for f in flat))
                if not any(values_equal(k, value) for k in known):
                    shown = ", ".join(repr(k) if isinstance(k, str) else str(k) for k in known[:12])
                    fail(f"no cell has {key}={value!r}; the study's values of {column}: {shown}")
        for side, other in ((claim.lhs, claim.rhs), (claim.rhs, claim.lhs)):
            if isinstance(other, Number) and getattr(side, "kind", None) == "failure_rate":
                if not 0 <= other.value <= 1:
                    fail(f"a failure rate is a share: compare it with a number in [0, 1], not {other.value:g}")
        if _same_quantity(claim, compiled, paths, varied):
            fail(
                "both sides are the same quantity of the same cells, so the claim can never be decided; "
                "compare two different cells (e.g. loops=4 against loops=1) or a quantity with a number"
            )
        _check_scale(compiled, i, claim, "min_effect")
        _check_margin(compiled, i, claim)


def _range(metric: str | None, compiled: CompiledStudy) -> tuple[float, float] | None:
    """The range a metric cannot leave in every cell of the study, as the cells' tasks declare it; None where
    it is not known (`study.levels.metric_range`, which the analysis reads too)."""
    return metric_range([cell.config for cell in compiled.cells], metric)


def _same_quantity(claim, compiled: CompiledStudy, paths: list[str], varied: list[str]) -> bool:
    """Both sides are one quantity (kind, metric, slope regressor) of the same cells and seeds."""
    lhs, rhs = claim.lhs, claim.rhs
    if not (isinstance(lhs, Quantity) and isinstance(rhs, Quantity)):
        return False
    if (lhs.kind, lhs.metric, lhs.x, lhs.log_x) != (rhs.kind, rhs.metric, rhs.x, rhs.log_x):
        return False
    if set(lhs.selector) == set(rhs.selector):
        return True
    seeds = lambda q: sorted(repr(v) for k, v in q.selector if k == "seed")  # noqa: E731
    if seeds(lhs) != seeds(rhs) or any(k in ("baseline",) for k, _ in lhs.selector + rhs.selector):
        return False
    return _cells_of(lhs, compiled, paths, varied) == _cells_of(rhs, compiled, paths, varied)


def _cells_of(q: Quantity, compiled: CompiledStudy, paths: list[str], varied: list[str]) -> set[str]:
    chosen = set()
    for cell in compiled.cells:
        flat = flatten_config(cell.config)
        ok = True
        for key, value in q.selector:
            column, _ = selector_column(key, paths, varied)
            if column == "cell":
                ok &= values_equal(cell.label, value)
            elif column not in ("seed", "baseline", None):
                ok &= values_equal(flat.get(column), value)
        if ok:
            chosen.add(cell.cell_hash)
    return chosen


def _check_margin(compiled: CompiledStudy, i: int, claim) -> None:
    """`~=` needs a margin; `<` and `>` take none (a margin reads `>=` / `<=` as non-inferiority); a margin between
    two failure rates has no exact test here; a margin must fit the scale (`_check_scale`)."""
    study = compiled.study
    entry = study.claims[i]
    margin = getattr(entry, "margin", None)

    def refuse(msg: str, field: str = "margin") -> None:
        raise spec_error(study.source, study._node, ("claims", i, field), msg)

    if claim.op == EQUIVALENT and margin is None:
        refuse(
            f"{claim.text!r} is an equivalence claim (~=): give its margin on the claim's scale, e.g. "
            f"{{claim: {claim.text!r}, margin: 0.02}} (equivalent when the 90% interval of the difference lies "
            "inside (-margin, margin))"
        )
    if claim.op == EQUIVALENT and getattr(entry, "min_effect", None) is not None:
        refuse("an equivalence claim's effect of interest is its margin: leave min_effect out", "min_effect")
    if margin is None:
        return
    if claim.op in ("<", ">"):
        refuse(
            f"a margin goes with >= or <= (non-inferiority: not worse by more than the margin) or ~= (equivalence); "
            f"write {claim.text.replace(claim.op, claim.op + '=', 1)!r} with this margin, or leave the margin out"
        )
    if all(q.kind == "failure_rate" for q in claim.quantities) and len(claim.quantities) == 2:
        refuse(
            "no exact test of a difference of failure rates within a margin is built; compare each rate with a "
            "number (failure_rate[...] < 0.2, with a margin), or leave the margin out"
        )
    _check_scale(compiled, i, claim, "margin")


def _check_scale(compiled: CompiledStudy, i: int, claim, field: str) -> None:
    """A `min_effect` or `margin` the claim's scale cannot hold (a difference of accuracies of 5) makes its
    seeds-needed, futility or equivalence meaningless: refused, naming the field, where the scale's bound is
    known."""
    study = compiled.study
    entry = study.claims[i]
    effect = getattr(entry, field, None)
    if effect is None:
        return
    sides = claim.quantities
    kinds = {q.kind for q in sides}
    if kinds == {"failure_rate"}:
        width, what = 1.0, "a difference of failure rates (shares)"
    elif kinds <= {"mean", "median", "iqm"}:
        spans = [_range(q.metric, compiled) for q in sides]
        if any(span is None for span in spans):
            return
        width = max(hi - lo for lo, hi in spans)
        what = f"a difference of {sides[0].metric}, which lies in [{spans[0][0]:g}, {spans[0][1]:g}]"
    else:  # a slope: per unit (or per ln) of its regressor, whose span the study file does not bound
        return
    if effect >= width:
        raise spec_error(
            study.source,
            study._node,
            ("claims", i, field),
            f"{effect:g} is {what}, so no effect can reach it; give an effect below {width:g} (e.g. {width / 20:g})",
        )


def _column(key: str, paths: list[str], varied: list[str], fail: Callable[[str], None]) -> str:
    """The flattened-config path (or cell / baseline / seed) a selector key names, as the analysis reads it."""
    column, leaves = selector_column(key, paths, varied)
    if column is not None:
        return column
    if leaves:
        fail(f"selector field {key!r} is ambiguous: write one of {', '.join(leaves)}")
    axes = ", ".join(p.rsplit(".", 1)[-1] for p in varied) or "none"
    near = difflib.get_close_matches(key, [p.rsplit(".", 1)[-1] for p in paths] + paths, n=3, cutoff=0.7)
    hint = f"; did you mean: {', '.join(dict.fromkeys(near))}" if near else ""
    fail(
        f"no config field {key!r} to select on{hint} (varied fields: {axes}; also a dotted path such as "
        "model.params.loops, or cell, family, task, baseline, seed)"
    )
    raise AssertionError  # fail raises


# --- what each claim's test can reach with the study's seeds ---------------------------------------------

ALPHA = 0.05  # = analysis.claims.ALPHA (the study layer does not import the analysis)


# Seeds per side from which a margin claim (equivalence, non-inferiority) is decided: below it two modes of
# seeds that fail or learn cannot be told apart (analysis/claims/decide.py `_margin_floor` holds it back).
MARGIN_FROM = 5


@dataclass(frozen=True)
class Reach:
    """The smallest one-sided p a claim's test can reach with the study's seeds, before any trial runs."""

    index: int
    claim: str
    test: str
    smallest_p: float  # 0.0: any (a t-test's p can be as small as the data make it)
    seeds: int  # seeds a side (a cell's seeds, or the trials a failure rate counts)
    needs: int | None = None  # seeds a side from which the smallest p is below ALPHA (None: already)
    fallback: str = ""  # the exact test bimodal or failure-split seeds get instead, and its smallest p
    # Seeds the fallback needs where it cannot decide with `seeds`, on a metric with a bound seeds can tie at
    # (an exact match of 1.0): likely enough there to warn about before anything runs. None otherwise.
    tie_needs: int | None = None

    @property
    def reaches(self) -> bool:
        return self.smallest_p < ALPHA

    def line(self) -> str:
        smallest = "any p" if self.smallest_p == 0 else f"smallest p {self.smallest_p:.3g}"
        text = f"claims[{self.index}] {self.claim}: {self.test}, {smallest}"
        if not self.reaches:
            text += f": cannot reach p < {ALPHA:g} with {self.seeds} seeds" + (
                f" (needs {self.needs})" if self.needs else ""
            )
        return text + (f"; {self.fallback}" if self.fallback else "")


def claim_reach(compiled: CompiledStudy) -> list[Reach]:
    """Per claim, the test `verify` will use and the smallest one-sided p it can reach with the study's
    seeds, at `max` for sequential seeds (exact tests and randomisation tests are discrete: McNemar's
    smallest p is 0.5^n, so it decides nothing below 5 seeds; a binomial `failure_rate < 0.3` needs 9).
    A search study's cells are not known before it runs: its claims are left out."""
    study = compiled.study
    if study.search is not None or not study.claims:
        return []
    flat = [flatten_config(c.config) for c in compiled.cells]
    paths = list(dict.fromkeys(p for f in flat for p in f))
    varied = [p for p in paths if len({repr(f.get(p)) for f in flat}) > 1]
    seeds = len(study.seed_values)  # a sequential design: the most seeds it can reach (`max`)
    labels = [c.label for c in compiled.cells]

    def span_of(metric: str | None) -> tuple[float, float] | None:  # as `analysis.claims.bounded.range_of` reads it
        span = _range(metric, compiled)
        return span if span is not None and all(map(math.isfinite, span)) else None

    def cells(q) -> list[int]:
        chosen = []
        for i, f in enumerate(flat):
            ok = True
            for key, value in q.selector:
                column, _ = selector_column(key, paths, varied)
                if column in ("cell",):
                    ok &= values_equal(labels[i], value)
                elif column in ("seed", "baseline") or column is None:
                    continue
                else:
                    ok &= values_equal(f.get(column), value)
            if ok:
                chosen.append(i)
        return chosen

    def seeds_of(q) -> int:
        picked = [v for k, v in q.selector if k == "seed"]
        return 1 if picked else seeds

    out = []
    for i, (text, entry) in enumerate(zip(study.claim_texts, study.claims, strict=True)):
        claim = parse_claim(text)
        lhs, op, rhs = claim.lhs, claim.op, claim.rhs
        if isinstance(lhs, Number):
            lhs, op, rhs = rhs, flip(op), lhs
        n = seeds_of(lhs)
        if getattr(entry, "margin", None) is not None and n < MARGIN_FROM:
            why = f"a margin claim is decided from {MARGIN_FROM} seeds a side"
            out.append(Reach(i, text, "margin test (equivalence or non-inferiority)", 1.0, n, MARGIN_FROM, why))
        elif lhs.kind == "failure_rate" and isinstance(rhs, Number):
            trials = n * max(len(cells(lhs)), 1)
            c = rhs.value
            worst = (1 - c) if op in ("<", "<=") else c  # k = 0 (or n) failures: p = (1 − c)^n (or c^n)
            reach = worst**trials
            needs = _first(lambda m, w=worst: w**m < ALPHA) if reach >= ALPHA else None
            out.append(Reach(i, text, "exact binomial test", reach, trials, needs))
        elif lhs.kind == "failure_rate":
            ca, cb = cells(lhs), cells(rhs)
            if len(ca) == 1 and len(cb) == 1 and ca != cb and seeds_of(lhs) == seeds_of(rhs):
                reach = 0.5**n
                needs = _first(lambda m: 0.5**m < ALPHA) if reach >= ALPHA else None
                out.append(Reach(i, text, "exact McNemar test", reach, n, needs))
            else:
                na, nb = n * max(len(ca), 1), seeds_of(rhs) * max(len(cb), 1)
                reach = 1 / math.comb(na + nb, na)
                needs = _first(lambda m: 1 / math.comb(2 * m, m) < ALPHA) if reach >= ALPHA else None
                out.append(Reach(i, text, "Fisher's exact test", reach, min(na, nb), needs))
        elif lhs.kind == "median" and isinstance(rhs, Number):
            reach = 0.5**n
            out.append(
                Reach(
                    i, text, "exact sign test", reach, n, _first(lambda m: 0.5**m < ALPHA) if reach >= ALPHA else None
                )
            )
        elif lhs.kind == "median" or (isinstance(rhs, Quantity) and rhs.kind != lhs.kind):
            out.append(
                Reach(i, text, "bootstrap (from 10 seeds a side)", 0.0 if n >= 10 else 1.0, n, 10 if n < 10 else None)
            )
        else:
            out.append(_continuous(i, text, lhs, op, rhs, n, study.failure is not None, len(cells(lhs)), span_of))
    return out


def _continuous(i: int, text: str, lhs, op: str, rhs, n: int, rule: bool, cells: int, span_of) -> Reach:
    """t-based claims: any p from 2 seeds; the exact fallback on bimodal or failure-split seeds."""
    if n < 2:
        return Reach(i, text, "t-test", 1.0, n, 2)
    if isinstance(rhs, Number) and lhs.kind != "slope":
        if rule:
            why = "not decided in a study with a failure rule (seeds may fail): claim a failure rate"
            return Reach(i, text, f"{lhs.kind} against a number", 1.0, n, None, why)
        span = span_of(lhs.metric)
        if span is None:
            why = (
                f"{lhs.metric} has no known range, and no test of a {lhs.kind} against a number holds on skewed "
                f"seeds without one: claim median({lhs.metric}) (the exact sign test) or compare two cells"
            )
            return Reach(i, text, f"{lhs.kind} against a number", 1.0, n, None, why)  # fmt: skip
        if lhs.kind == "iqm":
            span = None
        if span is not None and span[0] < rhs.value < span[1]:  # the distribution-free gate decides with it
            share = (rhs.value - span[0]) / (span[1] - span[0])
            worst = share if op in (">", ">=") else 1 - share  # every seed at the far end of the range
            needs = _first(lambda m, w=worst: w**m <= ALPHA) if worst**n > ALPHA else None
            return Reach(i, text, "one-sample t and the distribution-free bound", worst**n, n, needs,
                         "not decided on bimodal or tied seeds")  # fmt: skip
        return Reach(i, text, "one-sample t" if lhs.kind == "mean" else "one-sample Yuen", 0.0, n, None,
                     "not decided on bimodal or tied seeds")  # fmt: skip
    if lhs.kind == "slope":  # permutations of each seed's values over its cells (at most one per x value)
        perm = 1 / math.factorial(max(cells, 1)) ** n
        fallback = f"on bimodal, failure-split or tied seeds a permutation test within seeds: smallest p {perm:.3g}"
        if perm >= ALPHA:
            fallback += ", which decides nothing with these seeds"
        return Reach(i, text, "CR2 t by seed", 0.0, n, None, fallback)
    flip = 0.5**n
    fallback = f"on bimodal, failure-split or tied seeds the exact sign-flip test: smallest p {flip:.3g}"
    tie_needs = None
    if flip >= ALPHA:
        least = _first(lambda m: 0.5**m < ALPHA)
        fallback += f", which decides nothing below {least} seeds"
        tie_needs = least if span_of(lhs.metric) is not None else None
    return Reach(i, text, "paired t" if lhs.kind == "mean" else "paired Yuen", 0.0, n, None, fallback, tie_needs)


def _first(below) -> int:
    return next(m for m in range(1, 10_000) if below(m))
