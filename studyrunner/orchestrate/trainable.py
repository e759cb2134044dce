"""The Ray Tune trainable: one trial on a worker. It only trains and reports; the driver records."""

from __future__ import annotations

import os
from typing import Any

import ray
import torch
from ray import tune

from ..train import run_trial


class TuneReporter:
    """Sends each record to the driver through Tune; the driver writes MLflow, Parquet and the ledger.

    The trial's facts (device, precision, ...) ride along with the next report, so they cost no report
    of their own; the driver logs them as MLflow params `runtime.<name>`."""

    def __init__(self) -> None:
        self.pending_facts: dict[str, str] = {}

    def facts(self, values: dict[str, str]) -> None:
        self.pending_facts = dict(values)

    def report(self, step: int, metrics: dict[str, float], final: bool = False) -> None:
        result: dict[str, Any] = {"step": step, "metrics": metrics, "final": final}
        if self.pending_facts:
            result["facts"], self.pending_facts = self.pending_facts, {}
        tune.report(result)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.report(step, metrics)


class InjectedFault(RuntimeError):
    """Raised on purpose (STUDYRUNNER_INJECT_FAULT) to exercise failure handling end to end."""


def assigned_device() -> str:
    """The device Ray gave this trial: "cuda:N" for its first GPU (resources.gpu > 0), else "cpu".

    Ray lists the GPU ids it assigned (`ray.get_gpu_ids()`, physical ids) and sets CUDA_VISIBLE_DEVICES
    to them, so the first is visible as cuda:0; if CUDA_VISIBLE_DEVICES was left alone
    (RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES), the physical id is the ordinal."""
    ids = [str(i) for i in ray.get_gpu_ids()]
    if not ids:
        return "cpu"
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible:
        return f"cuda:{int(ids[0])}" if ids[0].isdigit() else "cuda:0"
    return f"cuda:{visible.index(ids[0])}" if ids[0] in visible else "cuda:0"


def trainable(config: dict[str, Any]) -> None:
    trial = config["trial"]  # {trial_key, seed, cell (resolved config), threads, inject_fault}
    if trial.get("inject_fault"):
        raise InjectedFault(f"injected fault in {trial['trial_key']} (STUDYRUNNER_INJECT_FAULT)")
    # Thread count is part of what makes a CPU run reproducible, so it comes from the study file.
    torch.set_num_threads(max(1, int(trial["threads"])))
    reporter = TuneReporter()
    final = run_trial(trial["cell"], trial["seed"], reporter, device=assigned_device())
    reporter.report(trial["cell"]["train"]["steps"], final, final=True)
