"""A DeepSpeed trial's attempt (`train.engine: deepspeed`): a Ray Train `TorchTrainer` inside its Tune trial.

The Tune trial is the Train run's driver, as Ray's Train-in-Tune guide has it: it reserves no CPU
(`capacity.DRIVER_REQUEST`) and starts `resources.workers` Train workers, each with `resources.cpu` (also
its torch threads), `resources.gpu` and `resources.memory_gb`, in a process group (gloo on CPUs, nccl on
GPUs).
Every worker runs the same `run_trial`, whose DeepSpeed engine calls `deepspeed.initialize`
(train/deepspeed_engine.py). The run gets no retries of its own (`FailureConfig(max_failures=0)`):
a retry is a new attempt of the Tune trial, recorded like any other trial's, resuming from the trial's
checkpoint.

Reports. Rank 0 runs the plain trainable's `run_attempt`, its reports put on a Ray queue this trial
made; a thread here hands them to `tune.report` in order, so the driver reads the protocol of any trial
(attempt.py) and records it unchanged: records, notes, checkpoints, the replay of a resume, the final
report. The other workers report nothing; they stop with rank 0 on its divergence rule (the engine
agrees on it) and on a non-finite loss (every worker sees the same one).

How an attempt ends:
- rank 0 sent the final report (succeeded, diverged or error): that is the ending. After an error rank 0
  raises too, so Ray Train stops the other workers instead of leaving them waiting in a collective;
- no final report, and a worker died (killed, its node lost), or failed for want of memory or a broken
  connection (infrastructure): the failure is raised here, so Tune retries the trial;
- no final report, and a worker other than rank 0 raised a Python error: the final report (error) is
  sent from here, naming it.

Workers that finish leave the process group with a barrier and `destroy_process_group`: without them
about 2 in 7 DeepSpeed runs on gloo aborted at exit.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import torch

from .attempt import Report, _describe, assigned_device, is_infrastructure, run_attempt

# A collective failing is a peer or the network, not the trial's code (gloo's words for a lost peer).
COLLECTIVE_FAILURES = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Socket Timeout")


class AttemptEnded(RuntimeError):
    """Raised by rank 0 after it reported an error, so Ray Train stops the other workers."""


class WorkersFailed(RuntimeError):
    """The Train run of an attempt failed for the machine's reasons (Tune retries the trial); the message
    says what happened to each worker, in one line."""


def distributed_payload(resources, run_storage: str) -> dict[str, Any]:
    """What a DeepSpeed trial's payload adds (tune_fit.trial_payloads): its workers and where Train keeps its runs."""
    return {
        "workers": {
            "count": resources.workers,
            "cpu": resources.cpu,
            "gpu": resources.gpu,
            "memory": resources.memory_gb * 1024**3 if resources.memory_gb else None,
        },
        "run_storage": run_storage,
    }


# ---------------------------------------------------------------------------- the Tune trial's side


def run_distributed_attempt(trial: dict[str, Any], report: Report) -> str:
    """One attempt of a DeepSpeed trial; returns its outcome after its final report was sent. Infrastructure
    failures of the workers are raised (module docstring)."""
    from ray.train import TrainingFailedError
    from ray.util.queue import Queue

    reports: Queue = Queue(actor_options={"num_cpus": 0})
    forwarder = _Forwarder(reports, report)
    failure: BaseException | None = None
    try:
        _trainer(trial, reports).fit()
    except TrainingFailedError as exc:
        failure = exc
    finally:
        forwarder.close()
        reports.shutdown()
    if forwarder.final is not None:
        return str(forwarder.final.get("outcome", "succeeded"))
    if forwarder.error is not None:  # tune.report raised: Tune stopped the trial
        raise forwarder.error
    cause = _cause(failure)
    if cause is None:
        if failure is None:
            raise RuntimeError(f"the DeepSpeed workers of {trial['trial_key']} ended without a final report")
        raise WorkersFailed(_summary(failure)) from failure
    final = {"final": True, "outcome": "error", "step": forwarder.step, "metrics": forwarder.latest, **_describe(cause)}
    if forwarder.sent == 0:  # the attempt's first report carries what every first report does
        from ...provenance import provenance

        final.update(provenance=provenance(), resumed_from_step=0)
    report(final)
    return "error"


def _cause(failure: BaseException | None) -> BaseException | None:
    """The Python error of a failed run worth reporting as the trial's (class error), or None when the
    failure is the machine's: a worker died or ran out of memory, a collective broke, Ray Train failed."""
    from ray.exceptions import RayActorError
    from ray.train import WorkerGroupError

    if not isinstance(failure, WorkerGroupError) or not failure.worker_failures:
        return None
    errors = []
    for _, error in sorted(failure.worker_failures.items()):
        error = _unwrap(error)
        if isinstance(error, RayActorError) or is_infrastructure(error):
            return None
        if any(marker in str(error) for marker in COLLECTIVE_FAILURES):
            return None
        errors.append(error)
    return next((e for e in errors if not isinstance(e, AttemptEnded)), None)


def _unwrap(error: BaseException) -> BaseException:
    from ray.exceptions import RayTaskError

    return error.cause if isinstance(error, RayTaskError) and error.cause is not None else error


def _summary(failure: BaseException) -> str:
    """`DeepSpeed workers failed: rank 0: ActorDiedError: ...; rank 1: ...`, each worker's first line."""
    from ray.train import WorkerGroupError

    def first_line(error: BaseException) -> str:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]

    if isinstance(failure, WorkerGroupError) and failure.worker_failures:
        parts = [f"rank {rank}: {first_line(_unwrap(e))}" for rank, e in sorted(failure.worker_failures.items())]
        return "DeepSpeed workers failed: " + "; ".join(parts)
    return f"the DeepSpeed run failed: {first_line(failure)}"


def _trainer(trial: dict[str, Any], reports):
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    workers = trial["workers"]
    per_worker = {"CPU": float(workers["cpu"])}
    if workers["gpu"]:
        per_worker["GPU"] = float(workers["gpu"])
    if workers["memory"]:
        per_worker["memory"] = float(workers["memory"])
    return TorchTrainer(
        _train_worker,
        train_loop_config={"trial": trial, "reports": reports},
        scaling_config=ScalingConfig(
            num_workers=int(workers["count"]), use_gpu=bool(workers["gpu"]), resources_per_worker=per_worker
        ),
        torch_config=TorchConfig(backend="nccl" if workers["gpu"] else "gloo"),
        run_config=RunConfig(
            # A new name per attempt: Ray Train would otherwise restore the run of the same name.
            name=f"{trial['trial_key']}-{uuid.uuid4().hex[:8]}",
            storage_path=trial["run_storage"],
            failure_config=FailureConfig(max_failures=0),
        ),
    )


class _Forwarder:
    """Hands what rank 0 put on the queue to `report` (tune.report), in order, from a thread: the Tune
    trial's own thread stays in `fit()`, so Tune cannot reuse this actor while the Train run lives."""

    def __init__(self, reports, report: Report) -> None:
        self._reports, self._report = reports, report
        self._closing = threading.Event()
        self.final: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.sent, self.step, self.latest = 0, 0, {}
        self._thread = threading.Thread(target=self._run, name="deepspeed-reports", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from ray.util.queue import Empty

        while True:
            try:
                result = self._reports.get(timeout=0.5)
            except Empty:
                if self._closing.is_set():  # fit() returned: every put had finished, and none is left
                    return
                continue
            if self.error is not None:
                continue
            try:
                self._report(result)
            except BaseException as exc:  # noqa: BLE001 - SystemExit when Tune stops the trial
                self.error = exc
                continue
            self.sent += 1
            self.step = int(result.get("step", self.step))
            if result.get("final"):
                self.final = result
            elif isinstance(result.get("metrics"), dict):
                self.latest.update(result["metrics"])

    def close(self) -> None:
        self._closing.set()
        self._thread.join()


# ------------------------------------------------------------------------------- each worker's side


def _train_worker(config: dict[str, Any]) -> None:
    """Runs on every Train worker: rank 0 trains and reports; the others train silently."""
    import ray.train

    trial, reports = config["trial"], config["reports"]
    device = assigned_device()
    if ray.train.get_context().get_world_rank() == 0:
        if run_attempt(trial, reports.put, device=device, background=True) == "error":
            raise AttemptEnded(f"{trial['trial_key']}: rank 0 reported an error; stopping the other workers")
    else:
        _follow(trial, device)
    _leave_process_group()


def _follow(trial: dict[str, Any], device: str) -> None:
    """A worker other than rank 0: the same training, reports dropped (run_trial silences it). A diverged
    trial is rank 0's to report; any other exception fails the run, so rank 0 does not wait for this one."""
    from ...train import run_trial
    from ...train.outcomes import Diverged
    from .attempt import InjectedFault

    torch.set_num_threads(max(1, int(trial["threads"])))
    if trial.get("inject_fault"):
        raise InjectedFault(f"injected fault in {trial['trial_key']} (STUDYRUNNER_INJECT_FAULT)")
    nan_at = (trial.get("inject") or {}).get("nan_at")
    try:
        run_trial(trial["cell"], trial["seed"], None, trial.get("checkpoint_dir"), device=device, nan_at=nan_at)
    except Diverged:
        pass


def _leave_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
