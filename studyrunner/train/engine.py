"""How a trial's optimizer steps and checkpoints are computed: the engine behind `run_trial`'s loop.

`run_trial` (trainer.py) tells one story whatever computes the steps: build, resume, then step, record,
evaluate, checkpoint, until done. What differs between engines is behind `Engine`:

- `PlainEngine` (`train.engine` unset or `plain`): this process is the whole trial. A step is one
  forward and backward of the whole batch and a torch AdamW step; a checkpoint is the model's and the
  optimizer's state dicts and the RNG states.
- `DeepSpeedEngine` (`train.engine: deepspeed`, deepspeed_engine.py): this process is one of several
  data-parallel workers of a `torch.distributed` process group, each running the same `run_trial`;
  DeepSpeed ZeRO partitions the optimizer state (and gradients, and parameters) over them.

The methods each take the trial (`setup.TrialSetup`), so an engine holds only what it adds. The `Engine`
protocol lives in setup.py beside it; `trainer.make_engine` picks one.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from ..models.output import AUX_TERMS, ModelOutput
from ..tasks import Batch, Task
from .checkpoint import CheckpointMismatch, Checkpoints, capture_rng, restore_rng
from .config import TrainConfig
from .optim import set_lr
from .outcomes import Diverged
from .schedules import aux_weights, counts_task_loss
from .setup import TrialSetup
from .trial_progress import Progress

# ------------------------------------------------------------------------------------- the plain loop


class PlainEngine:
    leader = True

    def step(self, trial: TrialSetup, progress: Progress) -> tuple[float, int]:
        return train_step(trial, progress)

    def save(self, store: Checkpoints, trial: TrialSetup, progress: Progress) -> None:
        store.save(progress.step, capture_state(trial, progress))

    def resume(self, store: Checkpoints, trial: TrialSetup) -> Progress:
        state = store.latest()
        if state is None:
            return Progress()
        progress = Progress.from_state_dict(state["progress"])
        check_schedule(state, trial, progress.step)
        trial.model.load_state_dict(state["model"])
        trial.optimizer.load_state_dict(state["optimizer"])
        restore_rng(state["rng"])  # last: building the trial drew from the generators
        return progress

    def agree(self, stop: bool) -> bool:
        return stop

    def facts(self) -> dict[str, str]:
        return {}


def train_step(trial: TrialSetup, progress: Progress) -> tuple[float, int]:
    """The plain engine's optimizer step on the batch of `progress.step`; returns its learning rate and token
    count."""
    started = time.perf_counter()
    step, model, optimizer = progress.step, trial.model, trial.optimizer
    lr = trial.lr(step)
    set_lr(optimizer, lr)
    batch = trial.batch(step)
    if trial.step_hook is not None:  # step-dependent model state (MELT's interpolation alpha)
        trial.step_hook(step)
    trial.runtime.step_begin()
    with trial.runtime.autocast():
        result = trial.step_model(batch.inputs)
        for name, logits in result.aux_logits.items():  # extra predictions, scored like the main one
            result.aux[name] = trial.task.loss(logits, batch)
        weights = aux_weights(step, trial.train, result.aux)
        loss = objective(trial.task, result, batch, trial.train, weights)
        if trial.nan_at == step + 1:
            loss = loss * float("nan")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    # before clipping: the gradient the loss asked for
    grad_norms = {name: grad_norm(params) for name, params in trial.grad_groups.items()}
    if trial.train.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), trial.train.grad_clip)
    optimizer.step()
    loss_value = loss.item()
    check_finite(loss_value, step)
    elapsed = time.perf_counter() - started
    tokens = batch.inputs.numel()
    progress.window.add(loss_value, elapsed, result.aux, grad_norms, weights)
    progress.add_step(elapsed, tokens)
    return lr, tokens


def objective(
    task: Task, result: ModelOutput, batch: Batch, train: TrainConfig, weights: dict[str, float]
) -> torch.Tensor:
    """The loss a step minimises: the task loss (unless `schedules.counts_task_loss` drops it), plus every aux
    term at its weight."""
    loss = task_loss(task, result, batch) if counts_task_loss(train, weights) else None
    for name, term in result.aux.items():
        loss = weights[name] * term if loss is None else loss + weights[name] * term
    if loss is None:
        raise ValueError("the objective is empty: no task loss and no auxiliary term")
    return loss


def task_loss(task: Task, result: ModelOutput, batch: Batch) -> torch.Tensor:
    """The task loss of the model's output, or its expectation over the model's weighted exits."""
    if not result.exits:
        return task.loss(result.logits, batch)
    return torch.stack([task.loss(logits, batch, weights=w) for logits, w in result.exits]).sum()


def check_finite(loss_value: float, step: int) -> None:
    if not math.isfinite(loss_value):  # the weights are now poisoned: nothing later is worth computing
        raise Diverged(step + 1, f"train loss is {loss_value} at step {step + 1}")


def grad_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


# ------------------------------------------------------------------------------------- checkpoints


def schedule_state(trial: TrialSetup, done: int) -> dict[str, Any]:
    """The schedules' values at the last step taken (derived from the step; recorded as a check)."""
    last = done - 1
    return {"step": done, "lr": trial.lr(last), "aux_weights": aux_weights(last, trial.train, AUX_TERMS)}


def same_schedule(saved: dict[str, Any], now: dict[str, Any]) -> bool:
    """The schedule a checkpoint recorded is this code's: the step, lr and the weight of every aux term it
    knew (terms added to AUX_TERMS since it was written are new knobs, not a change)."""
    weights = now["aux_weights"]
    same_weights = all(weights.get(term) == value for term, value in saved["aux_weights"].items())
    rest = lambda schedule: {k: v for k, v in schedule.items() if k != "aux_weights"}  # noqa: E731
    return same_weights and rest(saved) == rest(now)


def check_schedule(state: dict[str, Any], trial: TrialSetup, step: int) -> None:
    if not same_schedule(state["schedule"], schedule_state(trial, step)):
        raise CheckpointMismatch(
            f"checkpoint at step {step} recorded schedule {state['schedule']}, but this code gives "
            f"{schedule_state(trial, step)}: the schedule code changed since it was written"
        )


def capture_state(trial: TrialSetup, progress: Progress) -> dict[str, Any]:
    """A plain trial's checkpoint (checkpoint.py lists what it holds)."""
    return {
        "model": trial.model.state_dict(),
        "optimizer": trial.optimizer.state_dict(),
        "progress": progress.state_dict(),
        "schedule": schedule_state(trial, progress.step),
        "rng": capture_rng(),
    }
