"""Checks that span several fields of a study (axes, zip groups, exclude entries).

They run after the schema has validated types, and name the exact entry at fault with its line, which
a pydantic model validator cannot do (it reports the whole document).
"""

from __future__ import annotations

from typing import Any

from .schema import AXIS_ROOTS, Study
from .spec_errors import spec_error


def axis_path_problem(path: str) -> str | None:
    parts = path.split(".")
    if parts[0] not in AXIS_ROOTS or len(parts) < 2 or not all(parts):
        return f"axis {path!r} is not a dotted path under {', '.join(AXIS_ROOTS)} (e.g. 'model.params.loops')"
    return None


def check_study(study: Study, source: str, node: Any) -> None:
    def fail(loc: tuple, msg: str):
        raise spec_error(source, node, loc, msg)

    seen: dict[str, str] = {}
    for path, values in study.grid.items():
        if problem := axis_path_problem(path):
            fail(("grid", path), problem)
        if not values:
            fail(("grid", path), "axis has no values; give at least one")
        seen[path] = "grid"
    for g, group in enumerate(study.zip):
        if not group:
            fail(("zip", g), "empty group; give at least one path with its values")
        lengths = {path: len(values) for path, values in group.items()}
        for path in group:
            if problem := axis_path_problem(path):
                fail(("zip", g, path), problem)
            if path in seen:
                fail(("zip", g, path), f"path is varied twice (also in {seen[path]}); vary it in one place")
            seen[path] = f"zip[{g}]"
        if len(set(lengths.values())) != 1 or 0 in lengths.values():
            counts = ", ".join(f"{p}: {n}" for p, n in lengths.items())
            fail(("zip", g), f"value lists must be non-empty and of equal length ({counts})")
    for i, extra in enumerate(study.include):
        if not extra:
            fail(("include", i), "empty entry would repeat the base cell; give the paths that make this cell")
        for path in extra:
            if problem := axis_path_problem(path):
                fail(("include", i, path), problem)
    for i, partial in enumerate(study.exclude):
        if not partial:
            fail(("exclude", i), "empty entry would exclude every cell; remove it")
        for path in partial:
            if path not in seen:
                varied = ", ".join(seen) or "none"
                fail(("exclude", i, path), f"no grid or zip axis varies this path; varied paths: {varied}")
    check_search(study, fail)


def check_search(study, fail) -> None:
    """Cross-field rules of `search:` (the paths, the sampler against the space), each naming its entry."""
    search = study.search
    if search is None:
        return
    if study.sequential is not None:
        fail(
            ("seeds",),
            "a search runs each configuration on a fixed list of seeds; give `seeds:` as a list (sequential seeds "
            "belong to grid studies with claims)",
        )
    varied = {path: "grid" for path in study.grid}
    varied.update({path: f"zip[{g}]" for g, group in enumerate(study.zip) for path in group})
    for path, domain in search.space.items():
        if problem := axis_path_problem(path):
            fail(("search", "space", path), problem.replace("axis", "path", 1))
        if path in varied:
            fail(
                ("search", "space", path),
                f"path is also varied in {varied[path]}; vary it in one place (a search runs in each grid cell)",
            )
        if search.sampler == "cmaes" and domain.kind == "choice":
            fail(
                ("search", "sampler"),
                f"cmaes samples numeric ranges only, and {path} is a choice; use sampler tpe, gp or random, "
                "or give the path an {int: [low, high]} or {uniform: [low, high]} range",
            )
    if study.baselines:
        fail(("baselines",), "matched baselines belong to grids, not searches; run them as a grid study")
