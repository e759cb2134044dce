"""The built parts of one trial (`TrialSetup`), and what an engine that computes its steps must do
(`Engine`). Both sit below the trainer and its engines (engine.py, deepspeed_engine.py), so that each
of those imports this module and none imports another's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from ..tasks import Batch, Task
from .checkpoint import Checkpoints
from .config import EvalConfig, TrainConfig, TrialConfig
from .device import Runtime
from .flops import StepFlops
from .hooks import Fingerprinted
from .optim import lr_at
from .prefetch import Prefetcher, prefetch_enabled
from .trial_progress import Progress


class Engine(Protocol):
    """What `run_trial` asks of whatever computes a trial's steps."""

    # Does this process report? The plain engine's one process does; of DeepSpeed's workers, rank 0.
    leader: bool

    def step(self, trial: TrialSetup, progress: Progress) -> tuple[float, int]:
        """One optimizer step on the batch of `progress.step` (advancing `progress`); returns its learning
        rate and the tokens of the whole batch. Raises Diverged on a non-finite loss."""

    def save(self, store: Checkpoints, trial: TrialSetup, progress: Progress) -> None:
        """Write the checkpoint after `progress.step` steps to `store`."""

    def resume(self, store: Checkpoints, trial: TrialSetup) -> Progress:
        """Load the newest intact checkpoint in `store` into the trial; its progress (or a fresh one)."""

    def agree(self, stop: bool) -> bool:
        """Whether the trial stops here: `stop` is this process's view (its reporter raised Diverged);
        every process of the trial must reach the same answer, so a distributed engine combines them."""

    def facts(self) -> dict[str, str]:
        """How this engine runs the trial, added to the trial's runtime facts (MLflow `runtime.*`)."""


@dataclass
class TrialSetup:
    """The built parts of a trial: its config (the knobs the loop reads), task, model, optimizer and eval sets
    (on the device). `step_model` is what a training step calls: `model`, or it compiled (same weights)."""

    config: TrialConfig
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
    engine: Engine | None = None  # what computes steps and checkpoints (engine.py); build_trial sets it
    flops: StepFlops | None = None  # the training step's counted FLOPs (flops.py); build_trial sets it
    # the model's `set_train_step` (hooks.StepDependent: MELT's interpolation alpha), called before each step
    step_hook: Callable[[int], None] | None = None

    @property
    def train(self) -> TrainConfig:
        return self.config.train

    @property
    def ev(self) -> EvalConfig:
        return self.config.eval

    @property
    def steps(self) -> int:
        return self.config.train.steps

    def data_facts(self) -> dict[str, str]:
        """What the task's data is, for the trial's provenance: a task built on a corpus (charlm, text) says
        which (`fingerprint()`: sources with versions, SHA-256 of the exact documents, the tokenizer's), so a
        result names the text it was trained and scored on; a generated task has none (its config says all)."""
        if not isinstance(self.task, Fingerprinted):
            return {}
        meta = self.task.fingerprint()
        facts = {"data.sha256": str(meta.get("sha256", "")), "data.sources": json.dumps(meta.get("sources", {}))}
        if "tokenizer" in meta:
            facts["data.tokenizer"] = json.dumps(meta["tokenizer"], sort_keys=True)
        return facts

    def lr(self, step: int) -> float:
        t = self.train
        return lr_at(step, lr=t.lr, steps=t.steps, warmup_steps=t.warmup_steps, min_lr_ratio=t.min_lr_ratio)

    def record_due(self, done: int) -> bool:
        return done % self.train.log_every == 0 or done == self.steps

    def batch(self, step: int) -> Batch:
        """The train batch of `step` on the device: the prefetcher's when one runs, else made now."""
        if self.batches is not None:
            return self.batches.get(step)
        return self.runtime.to_device(self.task.train_batch(step, self.train.batch_size))

    def prefetch_from(self, step: int) -> None:
        """Make the batches of `step`..`steps - 1` ahead in a thread, where that pays (prefetch.py)."""
        if prefetch_enabled(self.runtime.device) and step < self.steps:
            size = self.train.batch_size
            make = lambda s: self.task.train_batch(s, size)  # noqa: E731
            self.batches = Prefetcher(make, step, self.steps, device=self.runtime.device)

    def stop_prefetch(self) -> None:
        if self.batches is not None:
            self.batches.close()
            self.batches = None
