"""Run compiled studies on Ray Tune; record them in the ledger, MLflow and Parquet.

`commands/` holds the commands' flow (submit, resume, rerun, cancel), `cluster/` the Ray side (Ray itself,
the Tune run and its driver callbacks, the trial processes), `feeds/` the trials that arrive while a study
runs (searches, sequential waves, tuning). The modules at this level are the few both sides share: what a
command is asked and reports (`run_types`), a running command's lease (`submission`), signal handling
(`signals`) and conversion teachers (`teachers`). MLflow is `studyrunner.tracking`'s.

The names below load on first use (PEP 562), not when the package is imported: every Ray worker
imports `studyrunner.orchestrate.cluster.trainable`, and loading the driver's side with it (MLflow,
SQLAlchemy, pandas) would cost each worker about a second of start-up (docs/performance.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "RunOptions": "run_types",
    "SubmitResult": "run_types",
    "cancel": "commands.runner",
    "ensure_ray": "cluster.ray_runtime",
    "rerun": "commands.runner",
    "resume": "commands.runner",
    "submit": "commands.runner",
    "RerunSelection": "commands.selection",
}

__all__ = ["RerunSelection", "RunOptions", "SubmitResult", "cancel", "ensure_ray", "rerun", "resume", "submit"]

if TYPE_CHECKING:
    from .cluster.ray_runtime import ensure_ray
    from .commands.runner import cancel, rerun, resume, submit
    from .commands.selection import RerunSelection
    from .run_types import RunOptions, SubmitResult


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value
