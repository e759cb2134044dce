"""Expand a study into cells (a config without the seed) and trials (cell x seed).

Every cell config is *resolved*: family and task params are validated against their registries and
filled with defaults, so two files that mean the same thing compile to the same hashes whatever
their key order, number formatting or YAML style.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import SpecError
from ..models import get_family
from ..tasks import build_task, get_task
from .baselines import add_baselines
from .canonical import canonical_json, config_hash, trial_key
from .compiled import Cell, CompiledStudy, Trial
from .feasibility import check_feasible
from .knobs import knob_problem, resources_problem
from .schema import EvalSection, Study, TrainSection
from .spec_errors import describe, dotted, spec_error

MAX_TRIALS = 1_000_000


class _Invalid(Exception):
    def __init__(self, loc: tuple, msg: str):
        self.loc, self.msg = loc, msg


def _validated(model: type[BaseModel], data: Any, prefix: tuple) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _Invalid(*describe(exc, model, prefix)) from None


def _validate(model: type[BaseModel], data: Any, prefix: tuple) -> dict[str, Any]:
    return _validated(model, data, prefix).model_dump(mode="json")


def resolve(raw: dict[str, Any]) -> dict[str, Any]:
    """Validate one cell's raw {task, model, train, eval} and fill every default."""
    for loc in (("task", "name"), ("model", "family")):
        if not isinstance(raw[loc[0]].get(loc[1]), str):
            raise _Invalid(loc, f"must be a name (a string), got {raw[loc[0]].get(loc[1])!r}")
    try:
        task = get_task(raw["task"]["name"])
    except KeyError as exc:
        raise _Invalid(("task", "name"), exc.args[0]) from None
    try:
        family = get_family(raw["model"]["family"])
    except KeyError as exc:
        raise _Invalid(("model", "family"), exc.args[0]) from None
    for section in ("task", "model"):
        if not isinstance(raw[section].get("params", {}), dict):
            raise _Invalid((section, "params"), "must be a mapping of parameter names to values")
    task_params = _validate(task.params_model, raw["task"].get("params", {}), ("task", "params"))
    model_params = _validated(family.params_model, raw["model"].get("params", {}), ("model", "params"))
    normalised = model_params.normalised(lambda: _task_facts(task.name, canonical_json(task_params)))
    resolved = {
        "task": {"name": task.name, "params": task_params},
        "model": {"family": family.name, "params": normalised.model_dump(mode="json")},
        "train": _validate(TrainSection, raw["train"], ("train",)),
        "eval": _validate(EvalSection, raw["eval"], ("eval",)),
    }
    if problem := knob_problem(family, resolved):  # e.g. train.ponder_lambda on a family without halting
        raise _Invalid(*problem)
    return resolved


@functools.lru_cache(maxsize=256)
def _task_facts(name: str, params_json: str):
    """A task's facts (sequence length, vocabulary), for params that depend on them (`normalised`)."""
    return build_task(name, json.loads(params_json), seed=0).facts


def _with_baselines(study: Study, cells: list[Cell]) -> list[Cell]:
    if not study.baselines:
        return cells

    def resolve_baseline(raw: dict[str, Any]) -> dict[str, Any]:
        for _ in range(8):  # drop train/eval knobs the unlooped model cannot take (a ponder weight, ...)
            try:
                return resolve(raw)
            except _Invalid as exc:
                section, *rest = exc.loc
                if section in ("train", "eval") and len(rest) == 1 and rest[0] in raw[section]:
                    del raw[section][rest[0]]
                    continue
                raise spec_error(
                    study.source, study._node, ("baselines",), f"the baseline config is invalid: {exc.msg}"
                ) from None
        raise spec_error(study.source, study._node, ("baselines",), "could not build a valid baseline config")

    def make_cell(config: dict[str, Any], label: str, tag: tuple[str, str]) -> Cell:
        return Cell(config_hash(config), config, {}, label, (tag,))

    with_baselines = add_baselines(study, cells, make_cell, resolve_baseline)
    if len(with_baselines) == len(cells) and not any(c.baseline_of for c in with_baselines):
        raise spec_error(
            study.source, study._node, ("baselines",), "no cell loops (loops > 1), so there is nothing to match"
        )
    return with_baselines


def set_path(config: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = config
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise _Invalid(tuple(path.split(".")), f"{part!r} is not a mapping, so {path!r} cannot be set")
        node = child
    node[leaf] = value


def _label(overrides: dict[str, Any]) -> str:
    if not overrides:
        return "base"
    leaves = [p.rsplit(".", 1)[-1] for p in overrides]
    names = [leaf if leaves.count(leaf) == 1 else path for leaf, path in zip(leaves, overrides, strict=True)]
    return " ".join(f"{n}={v}" for n, v in zip(names, overrides.values(), strict=True))


def compile_study(study: Study) -> CompiledStudy:
    """The study's cells (grid x zip, minus exclude, plus include and baselines) and their first trials."""
    build = _CellConfigs(study)
    build({}, where=())  # the base config must be valid on its own
    axes = _axes(study, build)
    _check_size(study, axes)
    cells, seen, warnings = _grid_cells(study, axes, build)
    cells += _included_cells(study, build, seen)
    if not cells:
        raise spec_error(study.source, study._node, ("exclude",), "every cell is excluded; nothing would run")
    if study.search is not None:
        return _compile_search(study, cells, warnings)
    cells = _with_baselines(study, cells)
    if problem := resources_problem(study.resources, [c.config["train"] for c in cells]):
        raise spec_error(study.source, study._node, *problem)
    warnings += _sequential_without_claims(study)
    trials = [
        Trial(trial_key(study.name, c.cell_hash, s), study.name, c.cell_hash, s, c.config, c.label)
        for c in cells
        for s in study.first_seeds
    ]
    compiled = CompiledStudy(study, cells, trials, warnings)
    check_feasible(compiled)
    if study.tune is not None:
        _check_tunable(compiled)
    return compiled


class _CellConfigs:
    """A cell's resolved config from the study's base and the cell's overrides; an invalid one is a one-line
    error that names where in the study file it comes from (`where`: a grid value, a zip row, an include
    entry; None for a combination of valid axis values, which names the cell)."""

    def __init__(self, study: Study):
        self.source, self.node = study.source, study._node
        self.base = {
            "task": study.task.model_dump(),
            "model": study.model.model_dump(),
            "train": study.train.model_dump(),
            "eval": study.eval.model_dump(),
        }

    def __call__(self, overrides: dict[str, Any], where: tuple | None) -> dict[str, Any]:
        raw = copy.deepcopy(self.base)
        try:
            for path, value in overrides.items():
                set_path(raw, path, value)
            return resolve(raw)
        except _Invalid as exc:
            raise self._error(exc, overrides, where) from None

    def _error(self, exc: _Invalid, overrides: dict[str, Any], where: tuple | None) -> Exception:
        field_path = ".".join(map(str, exc.loc))
        msg = exc.msg if field_path in overrides else f"{field_path}: {exc.msg}"
        if where is not None and where[:1] == ("include",) and field_path in overrides:
            where = (*where, field_path)  # name the entry's path at fault
        elif where is not None and where[:1] == ("zip",) and field_path in overrides and field_path != where[2]:
            msg = f"{field_path}: {exc.msg}"  # the row is located by its first path: name the one at fault
        if where is None:  # a combination of valid axis values: name the cell
            where, msg = ("grid",), f"cell '{_label(overrides)}': {msg}"
        elif not overrides:
            where, msg = exc.loc, exc.msg
        return spec_error(self.source, self.node, where, msg)


def _axes(study: Study, build: _CellConfigs) -> list[list[dict[str, Any]]]:
    """One axis per grid path and per zip group, each value checked on its own first."""
    axes: list[list[dict[str, Any]]] = []
    for path, values in study.grid.items():
        for i, value in enumerate(values):
            build({path: value}, where=("grid", path, i))
        axes.append([{path: v} for v in values])
    for g, group in enumerate(study.zip):
        paths = list(group)
        rows = [dict(zip(paths, vals, strict=True)) for vals in zip(*group.values(), strict=True)]
        for i, row in enumerate(rows):
            build(row, where=("zip", g, paths[0], i))
        axes.append(rows)
    return axes


def _check_size(study: Study, axes: list[list[dict[str, Any]]]) -> None:
    combos = math.prod(len(axis) for axis in axes)
    seeds = len(study.seed_values)
    if combos * seeds > MAX_TRIALS:
        raise spec_error(
            study.source,
            study._node,
            ("grid",),
            f"{combos:,} cells x {seeds} seeds = {combos * seeds:,} trials; "
            f"a study holds at most {MAX_TRIALS:,}: split it or use fewer axis values",
        )


def _grid_cells(
    study: Study, axes: list[list[dict[str, Any]]], build: _CellConfigs
) -> tuple[list[Cell], dict[str, str], list[str]]:
    """The axes' product minus `exclude`; the hashes seen (label by hash) and a warning per unused exclude."""
    excluded = [{p: canonical_json(v) for p, v in partial.items()} for partial in study.exclude]
    used = [False] * len(excluded)
    cells: list[Cell] = []
    seen: dict[str, str] = {}
    for combo in itertools.product(*axes):
        overrides = {k: v for part in combo for k, v in part.items()}
        hits = [all(canonical_json(overrides[p]) == v for p, v in ex.items()) for ex in excluded]
        if any(hits):
            used = [u or h for u, h in zip(used, hits, strict=True)]
            continue
        cells.append(_new_cell(study, build(overrides, where=None), overrides, seen, ("grid",)))
    warnings = [
        str(spec_error(study.source, study._node, ("exclude", i), "matches no cell; check its values against the axes"))
        for i, hit in enumerate(used)
        if not hit
    ]
    return cells, seen, warnings


def _included_cells(study: Study, build: _CellConfigs, seen: dict[str, str]) -> list[Cell]:
    # after exclude, as in CI matrices: an included cell always runs
    return [
        _new_cell(study, build(extra, where=("include", i)), dict(extra), seen, ("include", i))
        for i, extra in enumerate(study.include)
    ]


def _new_cell(study: Study, config: dict[str, Any], overrides: dict[str, Any], seen: dict[str, str], where) -> Cell:
    """A cell, refused when it resolves to the config of one already made (two names for one experiment)."""
    h = config_hash(config)
    label = _label(overrides)
    if h in seen:
        msg = (
            f"cells '{seen[h]}' and '{label}' resolve to the same config; drop one value"
            if where == ("grid",)
            else f"resolves to the same config as cell '{seen[h]}'; drop one of them"
        )
        raise spec_error(study.source, study._node, where, msg)
    seen[h] = label
    return Cell(h, config, overrides, label)


def _sequential_without_claims(study: Study) -> list[str]:
    if study.sequential is None or study.claims:
        return []
    msg = (
        f"sequential seeds without claims: every cell runs its first {study.sequential.start} seeds and "
        "no more (no claim asks for more); add claims, or give the seeds to run as a list"
    )
    return [str(spec_error(study.source, study._node, ("seeds",), msg))]


def _check_tunable(compiled: CompiledStudy) -> None:
    """Every cell's task has a validation split apart from its test split (what a tuning chooses on)."""
    from ..tasks import build_task

    for cell in compiled.cells:
        task = build_task(cell.config["task"]["name"], cell.config["task"]["params"], seed=0)
        if not task.has_validation():
            raise spec_error(
                compiled.study.source, compiled.study._node, ("tune",),
                f"task {cell.config['task']['name']!r} (cell '{cell.label}') has no validation split apart from its "
                "test split, so nothing can be chosen on it without flattering the choice; drop `tune:`",
            )  # fmt: skip


# ------------------------------------------------------------------------------------------- searches


def _compile_search(study: Study, bases: list[Cell], warnings: list[str]) -> CompiledStudy:
    """A search study: every range must fit every grid cell it runs in (both ends and a point inside, each
    resolved as a grid value is); its cells come from suggestions, so it compiles to none yet."""
    search = study.search
    total = len(bases) * search.n_trials * len(study.seed_values)
    if total > MAX_TRIALS:
        raise spec_error(
            study.source, study._node, ("search", "n_trials"), f"{total:,} trials; a study holds at most {MAX_TRIALS:,}"
        )
    for base in bases:
        for path, domain in search.space.items():
            for value in domain.probes():
                try:
                    search_cell(study, base, {path: value})
                except SpecError as exc:
                    field_path, _, why = str(exc).partition(": ")
                    why = why if field_path == path else str(exc)
                    place = f" in grid cell '{base.label}'" if base.overrides else ""
                    hint = (
                        " (uniform and loguniform give floats; an integer path takes {int: [low, high]})"
                        if domain.kind in ("uniform", "loguniform") and "integer" in why
                        else ""
                    )
                    msg = f"{domain.kind} value {value!r}{place} is refused: {why}{hint}"
                    raise spec_error(study.source, study._node, ("search", "space", path), msg) from None
    compiled = CompiledStudy(study, [], [], warnings, bases=bases)
    check_feasible(CompiledStudy(study, bases, [], compiled.warnings))  # the metric, eval sizes: per grid cell
    return compiled


def search_cell(study: Study, base: Cell, params: dict[str, Any]) -> Cell:
    """The cell a search suggestion makes: grid cell `base` with the suggested values set, resolved and hashed
    as a grid cell is (so a suggestion equal to a grid cell has its hash). Raises SpecError when the values do
    not make a valid config together (ranges are checked one at a time)."""
    raw = {
        "task": study.task.model_dump(),
        "model": study.model.model_dump(),
        "train": study.train.model_dump(),
        "eval": study.eval.model_dump(),
    }
    overrides = {**base.overrides, **params}
    try:
        for path, value in overrides.items():
            set_path(raw, path, value)
        config = resolve(raw)
    except _Invalid as exc:
        raise SpecError(f"{dotted(exc.loc)}: {exc.msg}") from None
    shown = {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in overrides.items()}
    return Cell(config_hash(config), config, overrides, _label(shown))


def with_cells(compiled: CompiledStudy, cells: list[Cell]) -> CompiledStudy:
    """`compiled` with `cells` added (once each, in order) and their trials, one per seed."""
    known = {c.cell_hash for c in compiled.cells}
    added = [c for c in dict((c.cell_hash, c) for c in cells).values() if c.cell_hash not in known]
    study = compiled.study
    trials = [
        Trial(trial_key(study.name, c.cell_hash, s), study.name, c.cell_hash, s, c.config, c.label)
        for c in added
        for s in study.first_seeds
    ]
    return CompiledStudy(study, compiled.cells + added, compiled.trials + trials, compiled.warnings, compiled.bases)


def with_seeds(compiled: CompiledStudy, seeds: dict[str, int]) -> CompiledStudy:
    """`compiled` with each cell's trials of seeds 0 .. seeds[cell_hash]-1 (a sequential study's waves: seeds in
    order), those it lacks added after the others; cells not named keep theirs."""
    study = compiled.study
    have = {(t.cell_hash, t.seed) for t in compiled.trials}
    added = [
        Trial(trial_key(study.name, c.cell_hash, s), study.name, c.cell_hash, s, c.config, c.label)
        for c in compiled.cells
        for s in range(seeds.get(c.cell_hash, 0))
        if (c.cell_hash, s) not in have
    ]
    if not added:
        return compiled
    return CompiledStudy(study, compiled.cells, compiled.trials + added, compiled.warnings, compiled.bases)
