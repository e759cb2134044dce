"""Run compiled studies on Ray Tune; record them in the ledger, MLflow and Parquet.

The names below load on first use (PEP 562), not when the package is imported: every Ray worker
imports `studyrunner.orchestrate.trainable`, and loading the driver's side with it (MLflow,
SQLAlchemy, pandas) cost each worker about a second of start-up (docs/performance.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "RunOptions": "runner",
    "SubmitResult": "runner",
    "cancel": "runner",
    "ensure_ray": "ray_runtime",
    "rerun": "runner",
    "resume": "runner",
    "submit": "runner",
    "RerunSelection": "selection",
}

__all__ = ["RerunSelection", "RunOptions", "SubmitResult", "cancel", "ensure_ray", "rerun", "resume", "submit"]

if TYPE_CHECKING:
    from .ray_runtime import ensure_ray
    from .runner import RunOptions, SubmitResult, cancel, rerun, resume, submit
    from .selection import RerunSelection


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value
