"""Submitting an edited study file again: what an edit may change.

Adding grid values, zip entries, seeds or baselines adds trials; the cells that already ran keep their
hashes and are skipped. An edit of a setting every cell shares (`train.steps`, a task parameter) gives
every cell a new hash, so the cells that ran would silently stop being part of the study: that is
refused, naming the fields, unless the edited file is submitted as a new study (`--as-new-study NAME`).
Dropping grid values is allowed (the dropped cells' trials stay in the ledger).
"""

from __future__ import annotations

from typing import Any

from .canonical import UNHASHED, flatten_config
from .compiled import CompiledStudy

_UNHASHED_PATHS = {f"{section}.{name}" for section, name in UNHASHED}


def _differences(old: dict[str, Any], new: dict[str, Any]) -> set[str]:
    a, b = flatten_config(old), flatten_config(new)
    return {p for p in set(a) | set(b) if a.get(p, _MISSING) != b.get(p, _MISSING)} - _UNHASHED_PATHS


_MISSING = object()


def changed_fields(ran: dict[str, dict[str, Any]], compiled: CompiledStudy) -> list[str]:
    """Fields an edit changed under cells that already ran (`ran`: cell_hash -> resolved config); empty
    when every such cell is still in the study or was only dropped from a grid axis."""
    new_hashes = {c.cell_hash for c in compiled.cells}
    axes = set(compiled.axes)
    changed: set[str] = set()
    for cell_hash, config in ran.items():
        if cell_hash in new_hashes or not compiled.cells:
            continue
        nearest = min((_differences(config, c.config) for c in compiled.cells), key=len)
        if not nearest <= axes:  # not merely a grid value dropped: a shared setting changed
            changed |= nearest - axes
    return sorted(changed)
