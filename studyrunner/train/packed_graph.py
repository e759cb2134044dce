"""A pack's whole training step as one CUDA graph: forward, each member's objective, backward, clipping and
AdamW captured once and replayed every step, so a step costs one launch instead of thousands (small cells
are launch-bound on a GPU: the bare references in ../shared/reference/gpu/ give 11.5x per seed-step for 8
members as one graph, against 7.6x eager).

A pack has a `GraphedStep` where its step can be captured; `graph_problem` says why not where it cannot. A step
can be captured when it is the same device work every step, reading nothing from the host but what is copied into
fixed buffers before each replay (the batches, and the members' learning rates, `Pack.rates`):

- on a CUDA device (torch.cuda.graph), with AdamW `capturable` (the pack makes it so on a GPU);
- no random draw per step on the host (LoopFormer's short run with a non-`fixed` objective draws its length),
  no step-dependent model state (MELT's interpolation alpha), no aux weight that follows a schedule (a ponder
  warmup, MELT's alignment start): they would be frozen at their captured values;
- no injected fault (`nan_at`) and, while some member is held (an uneven resume), eager steps.

The first `WARMUP_STEPS` steps run eagerly on a side stream (CUDA's lazy initialisations happen there, as
torch.cuda.graph requires), the next step is captured and every later step replays it; a step whose batches
differ in shape from the captured ones (a task that draws its sequence length) runs eagerly. A capture that
fails leaves the pack eager, with a warning saying why. The replayed step's outputs (losses, gradient norms,
aux terms) are copied out after each replay: the next replay overwrites them.

Tested where CUDA is (tests/test_packed.py skips there without one; benchmarks/gpu_suite.py measures it);
on the CPU the pack never has a graph.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch

from ..tasks import Batch
from .hooks import DrawsInTraining, StepDependent

if TYPE_CHECKING:
    from .vectorized import Pack, PackBatch

WARMUP_STEPS = 3
SCHEDULED_WEIGHTS = ("ponder_lambda_warmup_steps", "align_start_step")  # knobs that make an aux weight move


def graph_problem(pack: Pack) -> str | None:
    """Why this pack's step cannot be one CUDA graph; None where it can (the device is asked last, so the
    other reasons show on a CPU too)."""
    if isinstance(pack.base, DrawsInTraining):
        with torch.random.fork_rng(devices=[]):  # asking must not move the members' streams
            if pack.base.draw_training() is not None:
                return "the model draws its training computation at random each step (LoopFormer's short run)"
    if isinstance(pack.base, StepDependent):
        return "the model's state changes with the step (MELT's interpolation)"
    for trial in pack.trials:
        scheduled = [k for k in SCHEDULED_WEIGHTS if getattr(trial.train, k, None)]
        if scheduled:
            return f"an aux weight follows a schedule (train.{scheduled[0]})"
    if any(n is not None for n in pack.nan_at):
        return "a fault is injected (nan_at)"
    if not pack.runtime.on_cuda:
        return "not on a CUDA device"
    return None


class DenseLoss:
    """A task whose loss is its `dense` form (no indexing by the mask): what the captured step scores with."""

    def __init__(self, task: Any) -> None:
        self.task = task

    def loss(self, logits: torch.Tensor, batch: Batch, weights: torch.Tensor | None = None) -> torch.Tensor:
        return self.task.loss(logits, batch, weights, dense=True)


class GraphedStep:
    """Runs a pack's steps: eager warm-up on a side stream, one capture, then replays."""

    def __init__(self, pack: Pack) -> None:
        self.pack = pack
        self.warmed = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: PackBatch | None = None
        self.outputs: Any = None
        self.failed: str | None = None

    def step(self, step: int, made: PackBatch, weights: list[dict[str, float]]):
        """The step's (losses, grad norms, aux) from the graph or its warm-up; None: run it eagerly."""
        pack = self.pack
        if self.failed is not None or pack.held or made.inputs is None:
            return None  # members held, or batches not stacked this step (their shapes differ): eager
        if self.graph is None and self.warmed < WARMUP_STEPS:
            self.warmed += 1
            return self._on_side_stream(lambda: self._eager(made, weights, step))
        if self.graph is None:
            try:
                self._capture(made, weights, step)
            except Exception as exc:  # noqa: BLE001 - any capture failure: the pack goes on eagerly
                self.failed = f"{type(exc).__name__}: {exc}"
                self.graph = None
                warnings.warn(f"the pack's step could not be captured as a CUDA graph ({self.failed}); "
                              "training on without one", RuntimeWarning, stacklevel=2)  # fmt: skip
                return None
        if made.inputs.shape != self.static.inputs.shape:
            return None
        for name in ("inputs", "targets", "loss_mask"):  # one device-to-device copy per field, whatever S
            getattr(self.static, name).copy_(getattr(made, name))
        self.graph.replay()
        losses, grad_norms, aux = self.outputs
        return (
            losses.clone(),
            [{k: v.clone() for k, v in member.items()} for member in grad_norms],
            [{k: v.clone() for k, v in member.items()} for member in aux],
        )

    def _eager(self, made, weights, step):
        self.pack.optimizer.zero_grad(set_to_none=True)
        return self.pack.step_body(made, [None] * self.pack.n, weights, step)

    @staticmethod
    def _on_side_stream(run):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = run()
        torch.cuda.current_stream().wait_stream(side)
        return out

    def _capture(self, made: PackBatch, weights: list[dict[str, float]], step: int) -> None:
        """Capture the step on fixed copies of `made` (replayed at once for this step by `step`)."""
        pack = self.pack
        self.static = PackBatch(made.inputs.clone(), made.targets.clone(), made.loss_mask.clone())
        pack.optimizer.zero_grad(set_to_none=True)  # backward in the graph allocates the grads in its pool
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.outputs = pack.step_body(self.static, [None] * pack.n, weights, step)
        self.graph = graph
