"""A study's `tune:` section: settings chosen per cell on the validation split before the seeds run.

The tuning runs as a study of its own, `<name>--tune`: every cell of the study (baselines included) times every
combination of the `tune.grid` values, one seed (`tune.seed`), measured on the validation split
(`eval.split: validation`). For each cell, the value whose tuning trial scores best on `tune.metric` (ties: the
first in the grid's order) becomes the cell's, and the study's own trials run with it: the cells' configs, so
their hashes and trial keys, carry the chosen values. Choosing on the validation split and scoring claims on
the test split keeps the choice from flattering the arm it was made for.

Everything here is a pure function of the study and the tuning trials' outcomes, so the same ledger gives the
same choices on any machine (orchestrate/commands/preflight.py runs the trials; `verify` shows the choices).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from typing import Any

from .canonical import canonical_json, config_hash, trial_key
from .compiled import CompiledStudy, Trial

SUFFIX = "--tune"


def tune_name(name: str) -> str:
    return f"{name}{SUFFIX}"


def tuned_paths(study) -> list[str]:
    return list(study.tune.grid) if study.tune is not None else []


def tune_study(study):
    """The tuning study of `study` (a Study with a `tune:` section): its cells times the tune grid, one seed, on
    the validation split, no claims; None where the study tunes nothing."""
    if study.tune is None:
        return None
    data = study.model_dump(mode="json")
    clash = [p for p in study.tune.grid if p in data.get("grid", {}) or any(p in z for z in data.get("zip", []))]
    if clash:
        from .spec_errors import spec_error

        raise spec_error(study.source, study._node, ("tune", "grid", clash[0]),
                         f"{clash[0]} is also an axis of the study: tune it or vary it, not both")  # fmt: skip
    points = [dict(zip(study.tune.grid, combo, strict=True)) for combo in _product(study.tune.grid)]
    data.update(
        name=tune_name(study.name),
        include=[{**extra, **point} for extra in data.get("include", []) for point in points],
        description=f"per-cell tuning of {', '.join(study.tune.grid)} for study {study.name}",
        grid={**data.get("grid", {}), **study.tune.grid},
        seeds=[study.tune.seed],
        claims=[],
        tune=None,
        failure=None,
        multiplicity=None,
        metric=(study.tune.metric or study.metric).model_dump(),
    )
    data["eval"] = {**data.get("eval", {}), "split": "validation"}
    import yaml

    from .loader import loads

    text = yaml.safe_dump(data, sort_keys=False)
    return loads(text, source=f"<tuning of {study.source}>")


def group_of(config: dict[str, Any], paths: list[str]) -> str:
    """A cell's identity apart from the tuned settings (and the eval split): what its tuning trials share."""
    config = copy.deepcopy(config)
    for path in paths:
        section, key = path.split(".", 1)
        config.get(section, {}).pop(key, None)
    config.get("eval", {}).pop("split", None)
    return canonical_json(config)


@dataclass(frozen=True)
class Choice:
    """What one cell's tuning chose: the values, the metric, and every point's score (None: failed)."""

    values: dict[str, Any]
    metric: str
    mode: str
    scores: tuple[tuple[str, float | None], ...]  # (the point's values as JSON, its score), in grid order

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.values, "metric": self.metric, "mode": self.mode,
                "scores": [{"values": json.loads(v), "score": s} for v, s in self.scores]}  # fmt: skip


def choose(tuning: CompiledStudy, paths: list[str], ended: dict[str, dict | None]) -> dict | None:
    """{group: Choice} from the tuning study's trials that ended ({trial_key: its metrics, None where it ended
    without succeeding}: the ledger's `store.status.ended_outcomes`) over the tuned `paths`; None while a tuning
    trial has not ended. A group whose every point failed gets an empty Choice."""
    metric = tuning.study.metric
    groups: dict[str, list[tuple[str, float | None]]] = {}
    points: dict[str, list[dict[str, Any]]] = {}
    for trial in tuning.trials:
        if trial.trial_key not in ended:
            return None
        metrics = ended[trial.trial_key]
        point = {p: _get(trial.config, p) for p in paths}
        score = metrics.get(metric.name) if metrics is not None else None
        key = group_of(trial.config, paths)
        groups.setdefault(key, []).append((canonical_json(point), score))
        points.setdefault(key, []).append(point)
    out = {}
    for key, scores in groups.items():
        ok = [(i, s) for i, (_, s) in enumerate(scores) if s is not None and s == s]
        if not ok:
            out[key] = Choice({}, metric.name, metric.mode, tuple(scores))
            continue
        best = (min if metric.mode == "min" else max)(ok, key=lambda item: item[1])[0]
        out[key] = Choice(points[key][best], metric.name, metric.mode, tuple(scores))
    return out


def tuning_of(compiled: CompiledStudy) -> CompiledStudy | None:
    """The compiled tuning study of a compiled study (None without `tune:`)."""
    from .compiler import compile_study

    sub = tune_study(compiled.study)
    return None if sub is None else compile_study(sub)


def with_choices(compiled: CompiledStudy, choices: dict[str, Choice]) -> CompiledStudy:
    """The study's cells (and trials) with each cell's chosen values; a cell without a choice keeps its own."""
    paths = tuned_paths(compiled.study)
    cells, renamed = [], {}
    for cell in compiled.cells:
        choice = choices.get(group_of(cell.config, paths))
        if choice is None or not choice.values:
            cells.append(cell)
            continue
        config = copy.deepcopy(cell.config)
        for path, value in choice.values.items():
            section, key = path.split(".", 1)
            config[section][key] = value
        new = replace(cell, cell_hash=config_hash(config), config=config)
        renamed[cell.cell_hash] = new.cell_hash
        cells.append(new)
    by_hash = {c.cell_hash: c for c in cells}
    trials = [
        Trial(
            trial_key(t.study, renamed.get(t.cell_hash, t.cell_hash), t.seed),
            t.study,
            renamed.get(t.cell_hash, t.cell_hash),
            t.seed,
            by_hash[renamed.get(t.cell_hash, t.cell_hash)].config,
            t.label,
        )  # fmt: skip
        for t in compiled.trials
    ]
    cells = [replace(c, baseline_of=tuple((k, renamed.get(h, h)) for k, h in c.baseline_of)) for c in cells]
    return replace(compiled, cells=cells, trials=trials)


def _product(grid: dict[str, list[Any]]):
    import itertools

    return itertools.product(*grid.values())


def _get(config: dict[str, Any], path: str) -> Any:
    section, key = path.split(".", 1)
    return config.get(section, {}).get(key)
