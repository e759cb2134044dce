"""Train one trial from its resolved config. Knows models and tasks; nothing of Ray, MLflow or SQL.

Metric names are the product's vocabulary (see README): train_loss, eval_loss, eval_accuracy,
eval_exact_match, params, effective_depth, tokens_per_sec, step_time_ms, plus per-split suffixes
(eval_accuracy_n8) and whatever diagnostics the model family returns.

The family stays unnamed here: the model returns raw auxiliary terms by name (weighted by
`schedules.aux_weights`, logged as train_{term} and {term}_weight), may name parameter groups
whose gradient norm is worth watching (`grad_norm_groups()`, logged as {group}_grad_norm), and
fills its diagnostics when evaluated (`forward(..., diagnose=True)`).

With a checkpoint location, a trial writes checkpoints (checkpoint.py) and resumes from the newest
intact one: its later records and final metrics are those of a run that never stopped (wall-clock
timings aside).

A non-finite train loss (NaN or +-inf) ends the trial with `outcomes.Diverged`, which carries the
metrics known at that point (`summary_metrics`): a diverged seed is a data point, not a crash. A
reporter may raise `Diverged` too (the study's `divergence:` rule); `run_trial` fills in its metrics.

Device, precision and compile mode (`train.device`, `train.precision`, `train.compile`) are resolved
in device.py: the model is built on the CPU (so its initial weights do not depend on the device),
then moved; eval sets are generated once and kept on the device; each train batch is generated on
the CPU and copied, ahead of its step in a background thread where that pays (prefetch.py: on CUDA).
How the trial computed is sent once per attempt, before any record, to the reporter's optional
`facts` (device name, precision, compile mode, torch.backends switches).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..models import build_model, count_params
from ..models.output import AUX_TERMS, ModelOutput
from ..tasks import Batch, Task, build_task
from .checkpoint import (
    CheckpointMismatch,
    Checkpoints,
    CheckpointStorage,
    capture_rng,
    final_weights,
    open_storage,
    restore_rng,
)
from .device import Runtime
from .evaluation import EVAL_CHUNK, evaluate, evaluate_and_record
from .optim import lr_at, make_optimizer
from .outcomes import Diverged
from .prefetch import Prefetcher, prefetch_enabled
from .progress import Progress
from .reporter import (
    MemoryReporter,
    Reporter,
    send_checkpointed,
    send_facts,
    send_note,
    send_replay,
    send_start,
    send_tick,
)
from .schedules import aux_weights

__all__ = [
    "EVAL_CHUNK",
    "HALT_COLLAPSE_FRACTION",
    "Diverged",
    "TrialSetup",
    "build_trial",
    "evaluate",
    "run_trial",
    "summary_metrics",
]

# halt_collapsed = 1 when the final mean halting depth is below this fraction of the loops (the
# shallow-halt trap of seed 003: trapped runs halt at 5-7 of 18 steps, healthy ones at 11-18).
HALT_COLLAPSE_FRACTION = 0.5

CheckpointsArg = str | os.PathLike[str] | CheckpointStorage | Checkpoints | None


def run_trial(
    config: dict[str, Any],
    seed: int,
    reporter: Reporter | None = None,
    checkpoints: CheckpointsArg = None,
    *,
    device: str | torch.device | None = None,
    nan_at: int | None = None,
    teacher: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Train and evaluate one (cell config, seed); report records as it goes; return final metrics.

    On CPU the same (config, seed, thread count) gives the same final metrics. `checkpoints` (a
    folder, a pyarrow filesystem URI, or a storage object; one per trial) turns checkpointing on:
    every `train.checkpoint_every` steps (unset: about every tenth of the run) and after the last
    step, and a resume from the newest intact checkpoint found there. Records up to that checkpoint
    are not sent again.

    `device` is the device the caller assigned the trial (the Ray trainable: the GPU Ray gave it, or
    "cpu"); None = none assigned. With `train.device: auto` the trial trains there, or on a visible
    GPU when nothing was assigned (device.py has the rules).

    Raises `Diverged` (with the metrics so far) when the train loss is not finite, or when the
    reporter raises it. `nan_at` is a testing hook (STUDYRUNNER_INJECT_NAN): the loss of that step
    (1-based) is made NaN before its backward pass, so divergence handling runs for real.

    `teacher` (a `melt` cell whose `model.params.teacher` names a finished `looplm` trial): that trial's
    `config`, `seed` and `checkpoint` location, resolved by the orchestrator (which knows the ledger and
    the storage); the student starts from the weights of its final checkpoint and distils from it.
    """
    reporter = reporter or MemoryReporter()
    trial = build_trial(config, seed, device, teacher)
    trial.nan_at = nan_at
    send_facts(reporter, trial.runtime.facts())
    store = _open_checkpoints(checkpoints, config, seed, reporter)
    progress = _resume(store, trial) if store is not None else Progress()
    send_start(reporter, progress.step)
    if progress.step > 0:
        send_replay(reporter, progress.records)
    trial.prefetch_from(progress.step)
    try:
        _train(trial, progress, store, reporter)
    except Diverged as diverged:
        if diverged.metrics is None:  # raised by the reporter, which does not know the trial
            diverged.metrics = summary_metrics(trial, progress)
        raise
    finally:
        trial.stop_prefetch()
    return summary_metrics(trial, progress)


def _train(trial: TrialSetup, progress: Progress, store: Checkpoints | None, reporter: Reporter) -> None:
    if progress.step == 0:
        _log(reporter, progress, 0, dict(trial.static))
    trial.model.train()
    while progress.step < trial.steps:
        lr, tokens = train_step(trial, progress)
        done = progress.step
        record = progress.window.record(lr, tokens) if trial.record_due(done) else {}
        with trial.runtime.autocast():
            record.update(evaluate_and_record(trial.model, trial.task, trial.splits, done, trial.steps, trial.ev))
        if record:
            progress.last.update(record)
            _log(reporter, progress, done, record)
        if store is not None and store.due(done):  # after the record: it is never lost, at worst resent
            store.save(done, _capture(trial, progress))
            send_checkpointed(reporter, done)
        send_tick(reporter, done)


def _log(reporter: Reporter, progress: Progress, step: int, record: dict[str, float]) -> None:
    progress.records.append({"step": step, **record})  # before `log`, which may raise Diverged
    reporter.log(step, record)


@dataclass
class TrialSetup:
    """The built parts of a trial: task, model, optimizer, eval sets (on the device) and the knobs the
    loop reads. `step_model` is what a training step calls: `model`, or it compiled (same weights)."""

    train: dict[str, Any]
    ev: dict[str, Any]
    task: Task
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    splits: dict[str, Batch]
    static: dict[str, float]  # params, effective_depth
    grad_groups: dict[str, list[torch.nn.Parameter]]
    runtime: Runtime
    step_model: torch.nn.Module
    nan_at: int | None = None  # testing hook: the step whose loss is made NaN (see run_trial)
    batches: Prefetcher | None = None  # train batches made ahead, while one runs (prefetch.py)

    @property
    def steps(self) -> int:
        return self.train["steps"]

    def lr(self, step: int) -> float:
        t = self.train
        return lr_at(step, lr=t["lr"], steps=t["steps"], warmup_steps=t["warmup_steps"], min_lr_ratio=t["min_lr_ratio"])

    def record_due(self, done: int) -> bool:
        return done % self.train["log_every"] == 0 or done == self.steps

    def batch(self, step: int) -> Batch:
        """The train batch of `step` on the device: the prefetcher's when one runs, else made now."""
        if self.batches is not None:
            return self.batches.get(step)
        return self.runtime.to_device(self.task.train_batch(step, self.train["batch_size"]))

    def prefetch_from(self, step: int) -> None:
        """Make the batches of `step`..`steps - 1` ahead in a thread, where that pays (prefetch.py)."""
        if prefetch_enabled(self.runtime.device) and step < self.steps:
            size = self.train["batch_size"]
            make = lambda s: self.task.train_batch(s, size)  # noqa: E731
            self.batches = Prefetcher(make, step, self.steps, device=self.runtime.device)

    def stop_prefetch(self) -> None:
        if self.batches is not None:
            self.batches.close()
            self.batches = None


def build_trial(
    config: dict[str, Any],
    seed: int,
    device: str | torch.device | None = None,
    teacher: dict[str, Any] | None = None,
) -> TrialSetup:
    train, ev = config["train"], config["eval"]
    runtime = Runtime.resolve(train, device)  # first: a trial that cannot run fails before any work
    runtime.apply_backends()
    torch.manual_seed(seed)
    task = build_task(config["task"]["name"], config["task"]["params"], seed)
    model = build_model(config["model"]["family"], config["model"]["params"], task.facts).to(runtime.device)
    if config["model"]["params"].get("teacher") is not None:
        if teacher is None:
            raise ValueError(
                f"model.params.teacher {config['model']['params']['teacher']!r} was not resolved to a checkpoint; "
                "submit the study through studyrunner, or pass run_trial(teacher=...)"
            )
        model.convert_from(load_teacher(teacher, task.facts, runtime.device))
    if hasattr(model, "configure"):  # a family that reads train/eval knobs of its own (train.trajectory)
        model.configure(train, ev)
    optimizer = make_optimizer(model, train["lr"], train["weight_decay"], tuple(train["betas"]), fused=runtime.on_cuda)
    splits = {name: runtime.to_device(batch) for name, batch in task.eval_sets(ev["examples"]).items()}
    static = {
        "params": float(count_params(model)),
        "effective_depth": float(model.effective_depth),
        "weights_bytes": float(weights_bytes(model)),
    }
    grad_groups = model.grad_norm_groups() if hasattr(model, "grad_norm_groups") else {}
    step_model = runtime.compiled(model)
    return TrialSetup(train, ev, task, model, optimizer, splits, static, grad_groups, runtime, step_model)


def train_step(trial: TrialSetup, progress: Progress) -> tuple[float, int]:
    """One optimizer step on the batch of `progress.step`; returns its learning rate and token count."""
    started = time.perf_counter()
    step, model, optimizer = progress.step, trial.model, trial.optimizer
    lr = trial.lr(step)
    for group in optimizer.param_groups:
        group["lr"] = lr
    batch = trial.batch(step)
    if hasattr(model, "set_train_step"):  # step-dependent model state (MELT's interpolation alpha)
        model.set_train_step(step)
    trial.runtime.step_begin()
    with trial.runtime.autocast():
        result = trial.step_model(batch.inputs)
        loss = task_loss(trial.task, result, batch)
        for name, logits in result.aux_logits.items():  # extra predictions, scored like the main one
            result.aux[name] = trial.task.loss(logits, batch)
        weights = aux_weights(step, trial.train, result.aux)
        for name, term in result.aux.items():
            loss = loss + weights[name] * term
        if trial.nan_at == step + 1:
            loss = loss * float("nan")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    # before clipping: the gradient the loss asked for
    grad_norms = {name: _grad_norm(params) for name, params in trial.grad_groups.items()}
    if trial.train["grad_clip"] > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), trial.train["grad_clip"])
    optimizer.step()
    loss_value = loss.item()
    if not math.isfinite(loss_value):  # the weights are now poisoned: nothing later is worth computing
        raise Diverged(step + 1, f"train loss is {loss_value} at step {step + 1}")
    elapsed = time.perf_counter() - started
    tokens = batch.inputs.numel()
    progress.window.add(loss_value, elapsed, result.aux, grad_norms, weights)
    progress.add_step(elapsed, tokens)
    return lr, tokens


def task_loss(task: Task, result: ModelOutput, batch: Batch) -> torch.Tensor:
    """The task loss of the model's output, or its expectation over the model's weighted exits."""
    if not result.exits:
        return task.loss(result.logits, batch)
    return torch.stack([task.loss(logits, batch, weights=w) for logits, w in result.exits]).sum()


def weights_bytes(model: torch.nn.Module) -> int:
    """Bytes of the distinct parameters (a looped block counted once), in the dtype they are stored in."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def load_teacher(teacher: dict[str, Any], facts, device: torch.device) -> torch.nn.Module:
    """The teacher model of a conversion, with the weights of its trial's final checkpoint."""
    config = teacher["config"]
    with torch.random.fork_rng(devices=[]):  # building it must not move the student's random streams
        model = build_model(config["model"]["family"], config["model"]["params"], facts)
    model.load_state_dict(final_weights(teacher["checkpoint"], config, teacher["seed"]))
    return model.to(device)


def summary_metrics(trial: TrialSetup, progress: Progress) -> dict[str, float]:
    """The latest value of every reported name, the static facts and throughput, over the steps taken
    so far: a trial's final metrics once it finished. Throughput is left out while no step was timed."""
    final = {**progress.last, **trial.static}
    if progress.step > 0 and progress.total_time > 0:
        final["step_time_ms"] = 1000 * progress.total_time / progress.step
        final["tokens_per_sec"] = progress.total_tokens / progress.total_time
    final["train_time_s"] = progress.total_time
    final.pop("lr", None)
    if "ponder_steps_fraction" in progress.last:  # a halting model: did its halting depth collapse?
        threshold = trial.ev.get("halt_collapse_fraction") or HALT_COLLAPSE_FRACTION
        final["halt_collapsed"] = float(progress.last["ponder_steps_fraction"] < threshold)
    return final


def _grad_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


# ----------------------------------------------------------------------------------- checkpoints


def _open_checkpoints(
    checkpoints: CheckpointsArg, config: dict[str, Any], seed: int, reporter: Reporter
) -> Checkpoints | None:
    if checkpoints is None or isinstance(checkpoints, Checkpoints):
        return checkpoints
    return Checkpoints(
        open_storage(checkpoints),
        config=config,
        seed=seed,
        every=config["train"].get("checkpoint_every"),
        notify=lambda message: send_note(reporter, message),
    )


def _schedule(trial: TrialSetup, done: int) -> dict[str, Any]:
    """The schedules' values at the last step taken (derived from the step; recorded as a check)."""
    last = done - 1
    return {"step": done, "lr": trial.lr(last), "aux_weights": aux_weights(last, trial.train, AUX_TERMS)}


def _capture(trial: TrialSetup, progress: Progress) -> dict[str, Any]:
    return {
        "model": trial.model.state_dict(),
        "optimizer": trial.optimizer.state_dict(),
        "progress": progress.state_dict(),
        "schedule": _schedule(trial, progress.step),
        "rng": capture_rng(),
    }


def _same_schedule(saved: dict[str, Any], now: dict[str, Any]) -> bool:
    """The schedule a checkpoint recorded is this code's: the step, lr and the weight of every aux term it
    knew (terms added to AUX_TERMS since it was written are new knobs, not a change)."""
    weights = now["aux_weights"]
    same_weights = all(weights.get(term) == value for term, value in saved["aux_weights"].items())
    return same_weights and {k: v for k, v in saved.items() if k != "aux_weights"} == {
        k: v for k, v in now.items() if k != "aux_weights"
    }


def _resume(store: Checkpoints, trial: TrialSetup) -> Progress:
    state = store.latest()
    if state is None:
        return Progress()
    progress = Progress.from_state_dict(state["progress"])
    if not _same_schedule(state["schedule"], _schedule(trial, progress.step)):
        raise CheckpointMismatch(
            f"checkpoint at step {progress.step} recorded schedule {state['schedule']}, but this code gives "
            f"{_schedule(trial, progress.step)}: the schedule code changed since it was written"
        )
    trial.model.load_state_dict(state["model"])
    trial.optimizer.load_state_dict(state["optimizer"])
    restore_rng(state["rng"])  # last: building the trial drew from the generators
    return progress
