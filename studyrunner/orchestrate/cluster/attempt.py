"""One attempt of one trial (or of a pack of trials trained together) on a worker: it trains and reports;
the driver records. `trainable.trainable`, the Ray Tune trainable, picks which kind of attempt to run.

Every attempt ends with exactly one final report (`"final": True`), whose `outcome` says how it ended,
so the driver never guesses from Tune's trial state:

- `succeeded`: `{"final", "outcome", "step", "metrics"}`;
- `diverged`: a non-finite train loss, or the study's `divergence:` rule held on a record. The seed is a
  data point: `{"final", "outcome", "step", "metrics", "reason"}`, and the attempt returns normally;
- `error`: any other Python exception from building or training the trial (a bug, a bad config, an
  injected fault): `{"final", "outcome", "step", "metrics", "error_type", "message", "traceback"}`
  (metrics: the latest value of everything reported, possibly {}); returns normally, not retried.

Infrastructure failures are not caught: out of memory (`torch.OutOfMemoryError`, `MemoryError`, a
CUDA "out of memory" error), a lost connection or a timeout (checkpoint storage), and anything that
kills the process. They reach Tune, which retries the trial (`retries:`); the retry resumes from the
trial's latest checkpoint.

Reports before the final one (all carry "step"):

- a record: `{"step", "metrics", "final": False}`;
- a note: `{"note": "..."}` (a resume, a corrupt checkpoint skipped: shown to the user and kept on the
  attempt); after each checkpoint is written, `{"note", "checkpoint_step"}`;
- a replay, once per resumed attempt before any record: `{"replay": [records], "step"}`, every record the
  trial made up to the checkpoint it resumed from (the checkpoint keeps them: train/trial_progress.py), so a
  driver that died before recording some loses none of them;
- a heartbeat: `{"heartbeat": True}` after an optimizer step when nothing was reported for
  `heartbeat_s` seconds.

The first report of an attempt, whatever it is, also carries `provenance` (studyrunner.provenance, with the
worker process's pid, start time and age: warm_workers.process_facts), `resumed_from_step` (0 = from scratch) and, as
before, the runtime `facts`.

Fault injection, for exercising all of this end to end (the driver reads the STUDYRUNNER_INJECT_*
variables, orchestrate/cluster/faults.py, and passes each trial's faults in its payload):

- `inject_fault: true` (STUDYRUNNER_INJECT_FAULT): raises InjectedFault before training (class error);
- `inject: {"kill_at": s}` (STUDYRUNNER_INJECT_KILL): after step s (its record and checkpoint included)
  the worker SIGKILLs itself, on the first attempt only: it leaves the marker `injected-kill.marker` in
  the trial's checkpoint location, and an attempt that finds it does not kill (without a checkpoint
  location every attempt dies, which exercises retries running out);
- `inject: {"nan_at": s}` (STUDYRUNNER_INJECT_NAN): the train loss of step s is NaN (class diverged).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import ray
import torch
from ray import tune

from ...provenance import provenance
from ...study.claims_grammar import Rule, parse_rule
from ...train import run_trial
from ...train.checkpoint import open_storage
from ...train.outcomes import Diverged
from .warm_workers import process_facts

HEARTBEAT_S = 10.0
KILL_MARKER = "injected-kill.marker"
# Failures of the machine, not of the trial: Tune retries them. Some CUDA allocation failures arrive as
# a plain RuntimeError (or torch.AcceleratorError), hence the message markers.
INFRASTRUCTURE = (MemoryError, torch.OutOfMemoryError, ConnectionError, TimeoutError)
INFRASTRUCTURE_MESSAGES = ("out of memory", "uncorrectable ECC error", "CUDA-capable device(s) is/are busy")

Report = Callable[[dict[str, Any]], None]


class InjectedFault(RuntimeError):
    """Raised on purpose (STUDYRUNNER_INJECT_FAULT) to exercise failure handling end to end."""


class _Sender:
    """Calls `report` for each queued result, in order, in a background thread.

    Why (docs/performance.md, platform utilisation): Tune's function API reports synchronously, so
    `tune.report` returns only once the driver has processed the result (its MLflow, ledger and curve
    writes) and asked for the next one: 20-100 ms a report, during which training waited. With the
    sender the training thread queues the result and goes on. `flush()` waits until every queued
    result was reported, so whatever the driver had before an attempt ended, it still has. An
    exception from `report` (SystemExit when Tune stops the trial, a lost driver) is kept and raised
    on the training thread by the next `__call__`, `check()` or `flush()`."""

    _DONE = object()

    def __init__(self, report: Report) -> None:
        self._report, self.error = report, None
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="tune-report", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not self._DONE:
            try:
                if self.error is None:
                    self._report(item)
            except BaseException as exc:  # noqa: BLE001 - raised on the training thread (check)
                self.error = exc
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def __call__(self, result: dict[str, Any]) -> None:
        self.check()
        self._queue.put(result)

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def flush(self, *, check: bool = True) -> None:
        self._queue.join()
        if check:
            self.check()

    def close(self, *, wait: bool = True) -> None:
        self._queue.put(self._DONE)
        if wait:
            self._thread.join()


class TuneReporter:
    """Sends each record, note and heartbeat to the driver through `report` (tune.report on a worker);
    the driver writes MLflow, Parquet and the ledger. Checks the `divergence:` rule on every record.

    The trial's facts (device, precision, ...) ride along with the next report, so they cost no report
    of their own; the driver logs them as MLflow params `runtime.<name>`.

    `background=True` (the Ray trainable): reports go through a `_Sender` thread, so training does not
    wait for the driver; `finish` (and `flush`) wait until all were delivered."""

    def __init__(
        self,
        report: Report | None = None,
        *,
        divergence: str | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        clock: Callable[[], float] = time.monotonic,
        on_step: Callable[[int], None] | None = None,
        background: bool = False,
    ) -> None:
        self._report = report or (lambda result: tune.report(result))  # looked up late: tests patch it
        self._sender = _Sender(self._report) if background else None
        self._clock, self._on_step = clock, on_step
        self.rule: Rule | None = parse_rule(divergence) if divergence else None
        self.heartbeat_s = heartbeat_s
        self.pending_facts: dict[str, str] = {}
        self.step = 0  # the latest step the attempt reached, as far as reported
        self.latest: dict[str, float] = {}  # latest value of every reported name, this attempt
        self.resumed_from: int | None = None  # None until the trainer says where it starts
        self._held_notes: list[str] = []  # notes before `start`: the first report must know the resume step
        self._first = True
        self._last_sent = clock()

    # ------------------------------------------------------------------ the trainer's Reporter methods

    def facts(self, values: dict[str, str]) -> None:
        self.pending_facts = dict(values)

    def start(self, step: int) -> None:
        self.resumed_from = self.step = step
        self._flush_notes()

    def note(self, message: str) -> None:
        if self.resumed_from is None:
            self._held_notes.append(message)
        else:
            self._send({"note": message, "step": self.step})

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.step = step
        self.latest.update(metrics)
        self._send({"step": step, "metrics": metrics, "final": False})
        if self.rule is not None and any(name in metrics for name in self.rule.metrics) and self.rule(self.latest):
            raise Diverged(step, self._rule_reason(step))

    def replay(self, records: list[dict[str, float]]) -> None:
        # One report for the whole history: the driver merges what it lacks (orchestrate/trial_log.py).
        self._send({"replay": records, "step": self.step})

    def checkpointed(self, step: int) -> None:
        # The driver flushes the trial's curve on this, so a retry loses no record it already has.
        self._send({"note": f"checkpoint written at step {step}", "step": step, "checkpoint_step": step})

    def tick(self, step: int) -> None:
        self.step = step
        if self._sender is not None:
            self._sender.check()  # Tune stopped the trial: stop within a step, as a blocking report would
        if self._clock() - self._last_sent >= self.heartbeat_s:
            self._send({"heartbeat": True, "step": step})
        if self._on_step is not None:
            self.flush()  # fault injection may kill this process now: the driver has everything first
            self._on_step(step)

    # ---------------------------------------------------------------------------------- the ending

    def finish(self, outcome: str, step: int, metrics: Mapping[str, float], **fields: str) -> None:
        """The attempt's one final report."""
        self._flush_notes()
        self._send({"final": True, "outcome": outcome, "step": step, "metrics": dict(metrics), **fields})
        try:
            self.flush()
        finally:
            self.close()  # the sender is idle by now (flush waited for it), so this returns at once

    def flush(self, *, check: bool = True) -> None:
        """Wait until every report so far was delivered (no-op without `background`)."""
        if self._sender is not None:
            self._sender.flush(check=check)

    def close(self, *, wait: bool = True) -> None:
        if self._sender is not None:
            self._sender.close(wait=wait)
            self._sender = None

    def _flush_notes(self) -> None:
        held, self._held_notes = self._held_notes, []
        for message in held:
            self._send({"note": message, "step": self.step})

    def _send(self, result: dict[str, Any]) -> None:
        # The attempt's facts go on its first report once the resume step is known (the trainer says
        # so before any record), or on its final report if it never got that far.
        if self._first and (self.resumed_from is not None or result.get("final")):
            result["provenance"] = {**provenance(), **process_facts(), **placement_facts()}
            result["resumed_from_step"] = self.resumed_from or 0
            self._first = False
        if self.pending_facts:
            result["facts"], self.pending_facts = self.pending_facts, {}
        (self._sender or self._report)(result)
        self._last_sent = self._clock()

    def _rule_reason(self, step: int) -> str:
        assert self.rule is not None
        values = ", ".join(f"{name}={self.latest[name]:.6g}" for name in self.rule.metrics if name in self.latest)
        return f"divergence rule '{self.rule.text}' holds at step {step} ({values})"


# ---------------------------------------------------------------------------------- fault injection


def _sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_once(checkpoint_dir: str | None, kill: Callable[[], None]) -> None:
    """Kill this process unless an earlier attempt of the trial already did (its marker is there)."""
    if checkpoint_dir is not None:
        storage = open_storage(checkpoint_dir)
        if KILL_MARKER in storage.names():
            return
        storage.write_atomic(KILL_MARKER, b"an earlier attempt was killed on purpose (STUDYRUNNER_INJECT_KILL)\n")
    kill()


# ------------------------------------------------------------------------------------- the attempt


def placement_facts() -> dict[str, str]:
    """Where Ray placed the attempt: the resources it reserved for it (a fraction of a GPU where
    `resources.gpu` asks for one: several trials or packs share that GPU) and the GPU ids it assigned."""
    if not ray.is_initialized():  # a direct call, outside a Ray worker: nothing placed it (and no Ray to start)
        return {}
    try:
        assigned = ray.get_runtime_context().get_assigned_resources()
        gpus = ray.get_gpu_ids()
    except Exception:  # noqa: BLE001 - outside a Ray worker (a direct call): nothing placed it
        return {}
    return {"ray_resources": json.dumps(assigned, sort_keys=True), "ray_gpu_ids": ",".join(map(str, gpus))}


def is_infrastructure(exc: BaseException) -> bool:
    """Is this a failure of the machine (retried by Tune) rather than of the trial?"""
    if isinstance(exc, INFRASTRUCTURE):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in INFRASTRUCTURE_MESSAGES)


def run_attempt(
    trial: dict[str, Any],
    report: Report,
    *,
    device: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    kill: Callable[[], None] = _sigkill,
    background: bool = False,
) -> str:
    """One attempt of a trial; returns its outcome after sending its final report. Infrastructure
    failures propagate (see the module docstring). `trial` is the payload tune_fit.fit_trials builds.
    `background`: reports are sent from a thread (TuneReporter), all delivered before this returns."""
    inject = trial.get("inject") or {}
    checkpoint_dir = trial.get("checkpoint_dir")
    kill_at = inject.get("kill_at")
    reporter = TuneReporter(
        report,
        divergence=trial.get("divergence"),
        heartbeat_s=float(trial.get("heartbeat_s") or HEARTBEAT_S),
        clock=clock,
        on_step=(lambda step: _kill_once(checkpoint_dir, kill) if step == kill_at else None) if kill_at else None,
        background=background,
    )
    try:
        if trial.get("inject_fault"):
            raise InjectedFault(f"injected fault in {trial['trial_key']} (STUDYRUNNER_INJECT_FAULT)")
        # Thread count is part of what makes a CPU run reproducible, so it comes from the study file.
        torch.set_num_threads(max(1, int(trial["threads"])))
        cell = trial["cell"]
        final = run_trial(
            cell,
            trial["seed"],
            reporter,
            checkpoints=checkpoint_dir,
            device=device,
            nan_at=inject.get("nan_at"),
            teacher=trial.get("teacher"),
        )
    except Diverged as diverged:
        reporter.finish("diverged", diverged.step, diverged.metrics or reporter.latest, reason=diverged.reason)
        return "diverged"
    except Exception as exc:
        if is_infrastructure(exc):
            reporter.flush(check=False)  # every record made before the failure reaches the driver first
            reporter.close()
            raise
        reporter.finish("error", reporter.step, reporter.latest, **_describe(exc))
        return "error"
    except BaseException:  # SystemExit (Tune stopped the trial) and the like: let the sender thread end too
        reporter.close(wait=False)
        raise
    reporter.finish("succeeded", int(cell["train"]["steps"]), final)
    return "succeeded"


def _describe(exc: BaseException) -> dict[str, str]:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return {
        "error_type": type(exc).__name__,
        "message": lines[0] if lines else type(exc).__name__,
        "traceback": "".join(traceback.format_exception(exc)),
    }


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


def run_group_attempt(group: dict[str, Any], report: Report, *, device: str | None = None) -> list[str]:
    """One attempt of a pack (`train.pack`: trials trained together as one batched model): each member reports
    as its own trial (every result names its `trial_key`), resumes from and writes its own checkpoints, and
    ends with its own final report. A Python error fails every member (class error); infrastructure failures
    propagate (Tune retries the pack; each member resumes from its checkpoint). Reports are sent on the
    training thread: a sender thread per member would call `report` concurrently."""
    from ...train.vectorized import run_trials_together

    members = group["group"]
    reporters = [
        TuneReporter(
            lambda result, key=m["trial_key"]: report({**result, "trial_key": key}),
            divergence=group.get("divergence"),
            heartbeat_s=float(group.get("heartbeat_s") or HEARTBEAT_S),
        )
        for m in members
    ]
    checkpoints = [m.get("checkpoint_dir") for m in members]
    try:
        torch.set_num_threads(max(1, int(group["threads"])))
        finals = run_trials_together(
            [m["cell"] for m in members],
            [m["seed"] for m in members],
            reporters,
            device=device,
            checkpoints=checkpoints if all(checkpoints) else None,
        )
    except Exception as exc:
        if is_infrastructure(exc):
            raise
        for reporter in reporters:
            reporter.finish("error", reporter.step, reporter.latest, **_describe(exc))
        return ["error"] * len(members)
    outcomes = []
    for member, reporter, final in zip(members, reporters, finals, strict=True):
        if isinstance(final, Diverged):  # one member diverged; the others trained on
            reporter.finish("diverged", final.step, final.metrics or reporter.latest, reason=final.reason)
            outcomes.append("diverged")
        else:
            reporter.finish("succeeded", int(member["cell"]["train"]["steps"]), final)
            outcomes.append("succeeded")
    return outcomes
