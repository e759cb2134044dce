"""Long-format copies of final metrics and cell configs (tables trial_metrics and cell_params), so plain
SQL reads results across studies the same way on SQLite and PostgreSQL. Written by the ledger in the
same transaction as the JSON columns they mirror.

What a row holds:

- trial_metrics: one row per numeric final metric. Bools are 0/1. A non-finite number (NaN, inf) keeps
  its row with value NULL: SQLite cannot store NaN, and NULL is what SQL aggregates already skip, so
  `AVG(value)` means the same on both databases. Non-numbers (text, lists) are not metrics SQL can
  compare; they stay in trials.metrics only.
- cell_params: one row per leaf of the flattened resolved config (`model.params.loops`; lists and empty
  dicts are leaves). `value` is the canonical JSON text of the leaf (`4`, `"looped"`, `true`, `[1,2]`,
  `null`); `value_num` is the number when the leaf is one (bools 0/1), else NULL.

Migration 0003 fills both tables for ledgers written before they existed, with its own copy of these
rules (a migration must not change when this module does).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from sqlalchemy import delete, insert
from sqlalchemy.orm import Session

from ..study import canonical_json, flatten_config
from .db import CellParamRow, TrialMetricRow


def number(value: Any) -> float | None:
    """The value as a finite float when it is a number (bools as 0/1), else None."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None
    return None


def metric_values(metrics: dict[str, Any] | None) -> dict[str, float | None]:
    """The rows trial_metrics holds for `metrics`: name -> value (None for a non-finite number)."""
    return {
        name: number(value)
        for name, value in (metrics or {}).items()
        if isinstance(value, bool | numbers.Real)  # numpy numbers are registered as numbers.Real
    }


def param_values(config: dict[str, Any]) -> dict[str, tuple[str, float | None]]:
    """The rows cell_params holds for `config`: path -> (JSON text, number or None)."""
    return {path: (canonical_json(value), number(value)) for path, value in flatten_config(config).items()}


def write_metrics(session: Session, study: str, trial_key: str, metrics: dict[str, Any] | None) -> None:
    """Replace the trial's rows in trial_metrics with `metrics` (numbers only; None clears them)."""
    session.execute(delete(TrialMetricRow).where(TrialMetricRow.trial_key == trial_key))
    rows = [
        {"trial_key": trial_key, "name": name, "study": study, "value": value}
        for name, value in metric_values(metrics).items()
    ]
    if rows:  # an executemany with no parameter sets is an error
        session.execute(insert(TrialMetricRow), rows)


def write_params(session: Session, study: str, cell_hash: str, config: dict[str, Any]) -> None:
    """Replace the cell's rows in cell_params with its flattened resolved config."""
    session.execute(delete(CellParamRow).where(CellParamRow.study == study, CellParamRow.cell_hash == cell_hash))
    rows = [
        {"study": study, "cell_hash": cell_hash, "path": path, "value": text, "value_num": num}
        for path, (text, num) in param_values(config).items()
    ]
    if rows:
        session.execute(insert(CellParamRow), rows)
