"""What a trial has accumulated besides its weights: the train window, run totals and last records.

All of it goes into a checkpoint (`state_dict`), so a resumed trial's records and final metrics are
the ones an uninterrupted run gives. The arithmetic of every reported value lives here, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


class TrainWindow:
    """Sums over the steps since the previous train record (`train.log_every`).

    Auxiliary terms and watched gradient norms stay tensors (no device sync per step)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss, self.time, self.steps = 0.0, 0.0, 0
        self.aux: dict[str, torch.Tensor] = {}
        self.grad: dict[str, torch.Tensor] = {}
        self.weights: dict[str, float] = {}  # of the aux terms, at the latest step

    def add(
        self,
        loss: float,
        elapsed: float,
        aux: dict[str, torch.Tensor],
        grad_norms: dict[str, torch.Tensor],
        weights: dict[str, float],
    ) -> None:
        self.loss, self.time, self.steps = self.loss + loss, self.time + elapsed, self.steps + 1
        for name, term in aux.items():
            self.aux[name] = self.aux.get(name, 0.0) + term.detach()
        for name, norm in grad_norms.items():
            self.grad[name] = self.grad.get(name, 0.0) + norm
        self.weights = weights

    def record(self, lr: float, tokens_per_step: int) -> dict[str, float]:
        """The train record for the window (means over its steps), then an empty window."""
        n = self.steps
        record = {
            "train_loss": self.loss / n,
            "lr": lr,
            "step_time_ms": 1000 * self.time / n,
            "tokens_per_sec": tokens_per_step * n / self.time,
        }
        for name, total in self.aux.items():
            record[f"train_{name}"] = float(total) / n
            record[f"{name}_weight"] = self.weights[name]
        record.update({f"{name}_grad_norm": float(total) / n for name, total in self.grad.items()})
        self.reset()
        return record

    def state_dict(self) -> dict[str, Any]:
        return {
            "loss": self.loss,
            "time": self.time,
            "steps": self.steps,
            "aux": dict(self.aux),
            "grad": dict(self.grad),
            "weights": dict(self.weights),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss, self.time, self.steps = state["loss"], state["time"], state["steps"]
        self.aux, self.grad, self.weights = dict(state["aux"]), dict(state["grad"]), dict(state["weights"])


@dataclass
class Progress:
    """Where a trial is: `step` optimizer steps done (also its data position, since train batches are
    a function of (task params, seed, step)), the open window, run totals and the latest records."""

    step: int = 0
    window: TrainWindow = field(default_factory=TrainWindow)
    total_time: float = 0.0  # wall-clock seconds of training steps, over every attempt
    total_tokens: int = 0
    last: dict[str, float] = field(default_factory=dict)  # latest value of every reported name
    # Every record reported so far ({"step": s, **metrics}), over every attempt: a checkpoint carries the
    # trial's whole curve, so an attempt resumed from it can send again what an earlier driver missed.
    records: list[dict[str, float]] = field(default_factory=list)
    # A halting model's realised loop depth as training went, [step, loops] (flops.py: its FLOP count is taken at
    # their mean); empty for every other model.
    flop_depths: list[list[float]] = field(default_factory=list)

    def add_step(self, elapsed: float, tokens: int) -> None:
        self.step += 1
        self.total_time, self.total_tokens = self.total_time + elapsed, self.total_tokens + tokens

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "window": self.window.state_dict(),
            "total_time": self.total_time,
            "total_tokens": self.total_tokens,
            "last": dict(self.last),
            "records": [dict(r) for r in self.records],
            "flop_depths": [list(d) for d in self.flop_depths],
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Progress:
        window = TrainWindow()
        window.load_state_dict(state["window"])
        records = [dict(r) for r in state.get("records", [])]  # none in checkpoints from before they were kept
        depths = [list(d) for d in state.get("flop_depths", [])]  # likewise
        return cls(
            state["step"], window, state["total_time"], state["total_tokens"], dict(state["last"]), records, depths
        )
