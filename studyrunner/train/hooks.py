"""The optional hooks of a model family and of a task, as protocols: the trainer asks
`isinstance(model, Configurable)`, never whether some attribute happens to exist.

models/registry.py says what a family's model must have (forward, effective_depth, loops, ...) and which of
these it may add; a task (tasks/base.py) may add `fingerprint`. A model or task has a hook when it defines
the method (runtime-checkable protocols: a check of the name, made once where the trainer decides).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Configurable(Protocol):
    """A family that reads train/eval knobs of its own (LoopFormer: `train.trajectory`; MELT: the
    distillation's), from the resolved `train` and `eval` sections; called once, before training."""

    def configure(self, train: Mapping[str, Any], evaluation: Mapping[str, Any]) -> None: ...


@runtime_checkable
class WatchesGradients(Protocol):
    """Parameter groups whose gradient norm is logged as `{group}_grad_norm`."""

    def grad_norm_groups(self) -> dict[str, list[torch.nn.Parameter]]: ...


@runtime_checkable
class StepDependent(Protocol):
    """State that depends on the training step (MELT's interpolation alpha), set before each step."""

    def set_train_step(self, step: int) -> None: ...


@runtime_checkable
class Decoder(Protocol):
    """Incremental decoding with a KV cache (`forward(tokens, kv_cache=cache)`), where its params allow it."""

    def new_cache(self) -> Any: ...


@runtime_checkable
class KeepsKVCache(Protocol):
    """The analytic KV cache bytes per token the model would keep decoding."""

    def kv_bytes_per_token(self, loops: int | None = None, dtype: torch.dtype = torch.float32) -> int: ...


@runtime_checkable
class DrawsCompute(Protocol):
    """A training forward whose compute is drawn at random (LoopFormer's short run): each draw's weight and the
    context that pins it (flops.py counts each)."""

    def compute_draws(self) -> list[tuple[float, contextlib.AbstractContextManager]]: ...


@runtime_checkable
class DrawsInTraining(Protocol):
    """A training forward that draws at random from torch's global generator (LoopFormer's short run): the
    draw made apart (`draw_training`), and a context in which the forward takes a given draw (`drawn`).
    Packed trials (vectorized.py) draw each member's from its own generator state."""

    def draw_training(self) -> Any: ...

    def drawn(self, draw: Any) -> contextlib.AbstractContextManager: ...


@runtime_checkable
class RealisesLoops(Protocol):
    """A halting model that computes loop steps it does not use: the steps it realised on `tokens`, or None."""

    def realised_loops(self, tokens: torch.Tensor) -> float | None: ...


@runtime_checkable
class Fingerprinted(Protocol):
    """A task built on a corpus: which text, for the trial's provenance (`setup.TrialSetup.data_facts`)."""

    def fingerprint(self) -> dict: ...
