"""Halting as two small, explicit state machines: Graves' ACT (seed 003) and PonderNet weights (seed 000).

Each is fed one loop step at a time with the router's halting probability `p` (B, T) for the state
`h_new` (B, T, D) that step just computed, and keeps only the bookkeeping: the weight of each step,
the weighted output, the ponder quantities. The caller owns the loop, the block and the router, so a
family composes halting onto the core instead of copying a model, and every invariant (weights sum
to 1, remainder on the halting step, frozen states) lives in one short place.

A router is a `HaltingRouter`: Linear(in -> 1) + sigmoid with zero weights and a set bias, so at
initialisation every token halts with the same probability sigmoid(bias), whatever its state.
"""

from __future__ import annotations

import torch
from torch import nn


class HaltingRouter(nn.Module):
    """p = sigmoid(w . x + b), per token; w starts at 0 and b at `bias_init`.

    Zero weights make the initial halting probability exactly sigmoid(bias_init) for every token, so
    the halting depth at initialisation is a property of the config, not of the random draw. The
    gradient still reaches w (it is x times the error), so the router learns to depend on the state.
    """

    def __init__(self, in_features: int, bias_init: float):
        super().__init__()
        self.bias_init = bias_init
        self.linear = nn.Linear(in_features, 1)
        self.init_mechanism()

    def init_mechanism(self) -> None:  # called again by core.init_weights, after the generic init
        nn.init.zeros_(self.linear.weight)
        nn.init.constant_(self.linear.bias, self.bias_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.linear(x)).squeeze(-1)


class ACT:
    """Graves (2016) adaptive computation time, per token, as in the seed-003 authors' code.

    Before step n a token is *running* unless it has halted. At step n the cumulative halting
    probability of a running token becomes P_n = P_{n-1} + p_n; the token halts at the first n with
    P_n >= 1 - epsilon, and every token still running halts at the last step. The halting step gets
    the remainder R = 1 - P_{N-1}; earlier steps get p_n; steps after halting get 0. So each token's
    weights sum to exactly 1, and the output is the weighted sum of the states.

    A halted token's state is frozen (`step` returns it unchanged) but stays in the sequence, so
    running tokens still attend to it. Ponder cost per token is N + R (Graves' rho): N, the number of
    steps taken, is a count with no gradient; the router learns to halt earlier through R, which is a
    differentiable function of p_1..p_{N-1}. (A first version of the seed-003 code had no R and hence
    no ponder gradient at all; tests check the gradient is there.)
    """

    def __init__(self, like: torch.Tensor, epsilon: float, max_steps: int):
        """`like`: any (B, T) tensor giving the shape, device and dtype of the per-token state."""
        self.threshold = 1.0 - epsilon
        self.max_steps = max_steps
        self.n = 0  # steps taken so far
        self.cum = torch.zeros_like(like)  # P_{n}: cumulative p of each running token
        self.running = torch.ones_like(like, dtype=torch.bool)
        self.steps = torch.zeros_like(like)  # N: steps each token has taken (its halting step once halted)
        self.remainder = torch.zeros_like(like)  # R, set at the halting step
        self.output: torch.Tensor | None = None  # sum_n weight_n * h_n
        self.weights: list[torch.Tensor] = []  # weight_n per step, (B, T) each

    def step(self, p: torch.Tensor, h: torch.Tensor, h_new: torch.Tensor) -> torch.Tensor:
        """Account for one step; returns the next state (h_new for running tokens, h for halted ones)."""
        self.n += 1
        running = self.running
        cum_after = self.cum + p
        halting = running & ((cum_after >= self.threshold) | (self.n >= self.max_steps))
        weight = torch.where(halting, 1.0 - self.cum, torch.where(running, p, torch.zeros_like(p)))
        self.remainder = torch.where(halting, 1.0 - self.cum, self.remainder)
        self.steps = self.steps + running.to(self.steps.dtype)
        self.cum = torch.where(running & ~halting, cum_after, self.cum)
        self.running = running & ~halting
        contribution = weight.unsqueeze(-1) * h_new
        self.output = contribution if self.output is None else self.output + contribution
        self.weights.append(weight)
        # Tokens that were running this step take the new state, including the one halting now:
        # its state is frozen at the value it halted with.
        return torch.where(running.unsqueeze(-1), h_new, h)

    @property
    def ponder(self) -> torch.Tensor:
        """Per-token ponder cost N + R, (B, T); gradient flows through R only."""
        return self.steps + self.remainder


class PonderNet:
    """PonderNet-style halting weights (Banino et al. 2021), as seed 000 uses them per layer.

    p_halt(t) = p_t * prod_{i<t} (1 - p_i). There is no threshold and no early exit: every step runs
    and the output is the expected state sum_t p_halt(t) h_t. The paper does not say whether the last
    step takes the remainder prod_{i<N} (1 - p_i); without it the weights do not sum to 1. We give it
    to the last step (`remainder="last"`, as PonderNet does by forcing p_N = 1); `remainder="drop"` is
    the literal reading, whose weights sum to 1 - prod_{i<=N} (1 - p_i).
    """

    def __init__(self, max_steps: int, remainder: str = "last"):
        if remainder not in ("last", "drop"):
            raise ValueError(f"remainder must be 'last' or 'drop', got {remainder!r}")
        self.max_steps, self.remainder = max_steps, remainder
        self.n = 0
        self.not_halted: torch.Tensor | float = 1.0  # prod_{i<t} (1 - p_i)
        self.expected_steps: torch.Tensor | float = 0.0  # sum_t t * p_halt(t), per token
        self.output: torch.Tensor | None = None
        self.weights: list[torch.Tensor] = []

    def step(self, p: torch.Tensor, h_new: torch.Tensor) -> torch.Tensor:
        """Account for one step's state; returns its weight p_halt(t), (B, T)."""
        self.n += 1
        if self.n >= self.max_steps and self.remainder == "last":
            weight = self.not_halted * torch.ones_like(p)
        else:
            weight = p * self.not_halted
        self.not_halted = self.not_halted * (1.0 - p)
        self.expected_steps = self.expected_steps + self.n * weight
        contribution = weight.unsqueeze(-1) * h_new
        self.output = contribution if self.output is None else self.output + contribution
        self.weights.append(weight)
        return weight
