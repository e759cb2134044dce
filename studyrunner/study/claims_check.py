"""What `validate` (and `submit`) check of a study's `claims:` beyond the grammar, once it is compiled.

Each claim must be answerable by this study: its metrics are ones a trial of the study reports (the
names `check_feasible` collects: trainer, task and depth metrics, decoding metrics, the families'
diagnostics), its selector keys are fields of the cells' configs (a dotted path, a unique leaf, or
cell / family / task / baseline / seed), its selector values occur in the study (grid, zip, include,
baselines; a search's values are not known before it runs, so only its grid axes are checked), and a
failure rate is compared with a share in [0, 1]. A non-finite number never parses (the grammar).
Errors are one line naming the claim (`claims[i]`), its line in the file and how to mend it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

from .canonical import flatten_config
from .claims_grammar import Number, parse_claim, selector_column, values_equal
from .compiled import CompiledStudy
from .errors import spec_error


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
                    known = list(study.seeds)
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
