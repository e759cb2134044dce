"""Matched baselines (`baselines: [iso_param, iso_flop]`): unlooped cells added for every looped cell.

Each family says what its unlooped match is (`CoreParams.baseline`); this module turns that into
cells. An iso-param baseline whose parameter count differs from its looped cell by more than 1%
(routers, step embeddings, loop scales the baseline lacks) gets a wider MLP: parameter counts are
linear in the MLP width, so two counts on the meta device give the width that matches. A baseline
that equals a cell already in the study (or another cell's baseline) is one cell, run once, tagged
with every cell it matches.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from ..models import build_model, count_params, get_family
from ..tasks import build_task

PARAM_TOLERANCE = 0.01


def _param_count(family: str, params: dict, facts) -> int:
    with torch.device("meta"):
        return count_params(build_model(family, params, facts))


def _match_params(family: str, params: dict, target: int, facts) -> dict:
    """Widen (or narrow) the MLP of `params` until its count is within 1% of `target`."""
    have = _param_count(family, params, facts)
    if abs(have - target) <= PARAM_TOLERANCE * target:
        return params
    base = get_family(family).params_model.model_validate(params).hidden
    wider = _param_count(family, {**params, "mlp_hidden": base + 64}, facts)
    per_unit = (wider - have) / 64
    hidden = max(1, round(base + (target - have) / per_unit))
    return {**params, "mlp_hidden": hidden}


def add_baselines(study, cells: list, make_cell, resolve_config) -> list:
    """`cells` plus the study's baseline cells; `make_cell(config, label, (kind, looped_hash))` builds a
    Cell and `resolve_config(raw)` validates a raw config (train/eval knobs a baseline cannot take, such
    as a ponder weight, are dropped)."""
    if not study.baselines:
        return cells
    by_hash = {c.cell_hash: c for c in cells}
    order = [c.cell_hash for c in cells]
    tasks: dict[str, Any] = {}
    for cell in list(cells):
        model = cell.config["model"]
        params = get_family(model["family"]).params_model.model_validate(model["params"])
        for kind in study.baselines:
            match = params.baseline(kind)
            if match is None:
                continue
            family, base_params = match
            task_key = repr(cell.config["task"])
            if task_key not in tasks:
                tasks[task_key] = build_task(cell.config["task"]["name"], cell.config["task"]["params"], seed=0)
            facts = tasks[task_key].facts
            if kind == "iso_param":
                target = _param_count(model["family"], model["params"], facts)
                base_params = _match_params(family, base_params, target, facts)
            raw = copy.deepcopy(cell.config)
            raw["model"] = {"family": family, "params": base_params}
            config = resolve_config(raw)
            tag = (kind, cell.cell_hash)
            baseline = make_cell(config, f"{kind} of {cell.label}", tag)
            known = by_hash.get(baseline.cell_hash)
            if known is None:
                by_hash[baseline.cell_hash] = baseline
                order.append(baseline.cell_hash)
            elif tag not in known.baseline_of:
                by_hash[baseline.cell_hash] = dataclasses.replace(known, baseline_of=(*known.baseline_of, tag))
    return [by_hash[h] for h in order]
