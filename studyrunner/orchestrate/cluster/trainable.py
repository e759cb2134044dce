"""The Ray Tune trainable: reads the trial's payload and runs one attempt of the kind it names.

The attempts themselves, and the reports every attempt sends, are described in attempt.py (one process)
and distributed.py (a DeepSpeed trial's Ray Train run); both sit below this module, so neither imports it.
"""

from __future__ import annotations

from typing import Any

from ray import tune

from .attempt import assigned_device, run_attempt, run_group_attempt


def trainable(config: dict[str, Any]) -> None:
    # payload: {trial_key, seed, cell, threads, checkpoint_dir, divergence, heartbeat_s, inject, inject_fault}
    # (+ workers, run_storage for a DeepSpeed trial)
    payload = config["trial"]
    if "group" in payload:
        run_group_attempt(payload, tune.report, device=assigned_device())
    elif payload.get("workers"):  # train.engine: deepspeed: this trial drives a Ray Train run (distributed.py)
        from .distributed import run_distributed_attempt  # imports Ray Train: only for these trials

        run_distributed_attempt(payload, tune.report)
    else:
        run_attempt(payload, tune.report, device=assigned_device(), background=True)
