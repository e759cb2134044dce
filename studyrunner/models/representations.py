"""Representation diagnostics per loop step, for every family.

The seam: a family hands its state to `trace_step(self, h)` once as it enters the loop (step 0) and
once after every loop step; nothing happens unless a diagnostic pass set a `StepTrace` on the
model (`tracing`). The evaluator does that for one forward on a fixed probe batch, so training
steps pay one attribute lookup per loop step and no family carries its own copy of the metrics.

Metrics, over the probe's token states X_t (N tokens x d, step t = 0..S, 0 = the loop's input):
- `repr_cos_step_{t}` (t >= 1): mean over tokens of cos(x_{t-1}, x_t) (platform, from the notes);
- `repr_update_step_{t}` (t >= 1): ||X_t - X_{t-1}||_F / ||X_{t-1}||_F, the relative update;
- `repr_erank_step_{t}` (t >= 0): effective rank of the centred X_t (Roy & Vetterli 2007:
  exp of the entropy of the normalised singular values; between 1 and d);
- `repr_cka_{i}_{j}` (0 <= i < j <= S): linear CKA (Kornblith et al. 2019) between steps, the
  paper's cross-step heatmap (its kernel is unstated: linear here);
- `repr_cka_adjacent_mean`: the mean of CKA(t-1, t) over t = 1..S (near 1: the steps stagnate);
- `repr_cka_adjacent_late_mean`: the same over the second half of the steps, t = floor(S/2)+1..S
  (LoopFormer's Fig. 5: the early-exit baselines stagnate, LoopFormer "exhibits progressive drift,
  especially toward the later steps"; the all-step mean is dominated by the first steps' large changes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

MAX_TOKENS = 4096  # rows of X_t kept (evenly strided), which bounds the SVDs at large batch x length


class StepTrace:
    """The states handed to `trace_step` during one forward, as detached (N, d) float64 matrices."""

    def __init__(self) -> None:
        self.states: list[torch.Tensor] = []

    def __call__(self, h: torch.Tensor) -> None:
        x = h.detach().reshape(-1, h.shape[-1])
        stride = max(1, -(-x.shape[0] // MAX_TOKENS))
        self.states.append(x[::stride].to(torch.float64))

    def result(self) -> dict[str, float]:
        return representation_diagnostics(self.states)


def trace_step(model: nn.Module, h: torch.Tensor) -> None:
    """Give the state at a loop boundary to the model's trace, when a diagnostic pass set one."""
    trace = getattr(model, "step_trace", None)
    if trace is not None:
        trace(h)


@contextlib.contextmanager
def tracing(model: nn.Module) -> Iterator[StepTrace]:
    """Collect the states `model` traces during the block."""
    trace = StepTrace()
    model.step_trace = trace
    try:
        yield trace
    finally:
        model.step_trace = None


def representation_names(steps: int) -> set[str]:
    """Every name `representation_diagnostics` can give for a loop of up to `steps` steps."""
    if steps < 1:
        return set()
    names = {"repr_cka_adjacent_mean", "repr_cka_adjacent_late_mean"}
    for t in range(steps + 1):
        names.add(f"repr_erank_step_{t}")
        if t:
            names |= {f"repr_cos_step_{t}", f"repr_update_step_{t}"}
        names |= {f"repr_cka_{t}_{j}" for j in range(t + 1, steps + 1)}
    return names


def effective_rank(x: torch.Tensor) -> float:
    s = torch.linalg.svdvals(x - x.mean(0))
    if s.sum() <= 0:
        return 0.0
    p = s / s.sum()
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F) on centred features (d x d Grams, cheap for many tokens)."""
    x, y = x - x.mean(0), y - y.mean(0)
    denom = torch.linalg.matrix_norm(x.T @ x) * torch.linalg.matrix_norm(y.T @ y)
    if denom <= 0:
        return 0.0
    return float(torch.linalg.matrix_norm(y.T @ x) ** 2 / denom)


def representation_diagnostics(states: list[torch.Tensor]) -> dict[str, float]:
    if len(states) < 2:
        return {}
    out: dict[str, float] = {}
    for t, x in enumerate(states):
        out[f"repr_erank_step_{t}"] = effective_rank(x)
        if t:
            prev = states[t - 1]
            out[f"repr_cos_step_{t}"] = float(torch.nn.functional.cosine_similarity(prev, x, dim=-1).mean())
            norm = torch.linalg.matrix_norm(prev)
            out[f"repr_update_step_{t}"] = float(torch.linalg.matrix_norm(x - prev) / norm) if norm > 0 else 0.0
    centred = [x - x.mean(0) for x in states]  # once per step, not once per pair
    self_norms = [torch.linalg.matrix_norm(x.T @ x) for x in centred]
    for i in range(len(states)):
        for j in range(i + 1, len(states)):
            denom = self_norms[i] * self_norms[j]
            cross = torch.linalg.matrix_norm(centred[j].T @ centred[i]) ** 2
            out[f"repr_cka_{i}_{j}"] = float(cross / denom) if denom > 0 else 0.0
    adjacent = [out[f"repr_cka_{t - 1}_{t}"] for t in range(1, len(states))]
    out["repr_cka_adjacent_mean"] = sum(adjacent) / len(adjacent)
    late = adjacent[len(adjacent) // 2 :]  # t = floor(S/2)+1 .. S
    out["repr_cka_adjacent_late_mean"] = sum(late) / len(late)
    return out
