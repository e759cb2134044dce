"""One text and one hash per config: what makes a cell's hash and a trial's key the same for two files that
mean the same thing. Pure functions of plain values, imported by every module of the study file."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any


def canonical_json(obj: Any) -> str:
    """One text per value: sorted keys, no whitespace, shortest float repr, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def flatten_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'model': {'params': {'loops': 4}}} -> {'model.params.loops': 4}; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_config(value, path + "."))
        else:
            flat[path] = value
    return flat


# Settings that change how a trial runs but not what it computes: left out of the hash, so turning
# checkpoints on for an existing study keeps its cells and trial keys.
UNHASHED = (("train", "checkpoint_every"),)


def config_hash(config: dict[str, Any], n: int = 12) -> str:
    hashed = copy.deepcopy(config)
    for section, name in UNHASHED:
        if isinstance(hashed.get(section), dict):
            hashed[section].pop(name, None)
    return hashlib.sha256(canonical_json(hashed).encode()).hexdigest()[:n]


def trial_key(study: str, cell_hash: str, seed: int) -> str:
    """Study name + hash of the canonical resolved config + seed: readable and unique per ledger."""
    return f"{study}-{cell_hash}-s{seed}"
