"""The Ray Tune trainable: one trial on a worker. It only trains and reports; the driver records."""

from __future__ import annotations

from typing import Any

import torch
from ray import tune

from ..train import run_trial


class TuneReporter:
    """Sends each record to the driver through Tune; the driver writes MLflow, Parquet and the ledger."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        tune.report({"step": step, "metrics": metrics, "final": False})


class InjectedFault(RuntimeError):
    """Raised on purpose (STUDYRUNNER_INJECT_FAULT) to exercise failure handling end to end."""


def trainable(config: dict[str, Any]) -> None:
    trial = config["trial"]  # {trial_key, seed, cell (resolved config), threads, inject_fault}
    if trial.get("inject_fault"):
        raise InjectedFault(f"injected fault in {trial['trial_key']} (STUDYRUNNER_INJECT_FAULT)")
    # Thread count is part of what makes a CPU run reproducible, so it comes from the study file.
    torch.set_num_threads(max(1, int(trial["threads"])))
    final = run_trial(trial["cell"], trial["seed"], TuneReporter())
    tune.report({"step": trial["cell"]["train"]["steps"], "metrics": final, "final": True})
