"""LoopLM's (Ouro's) exit distribution over loop steps, as in the public `modeling_ouro.py`.

A shared gate reads each loop's final-normed hidden state: lambda_t = sigmoid(g(h_t)) per token. The
probability of exiting at step t is lambda_t times the probability of not having exited before,
p_t = lambda_t * prod_{j<t} (1 - lambda_j); the last step takes the remainder prod_{j<T} (1 - lambda_j),
so the T probabilities sum to 1 exactly and the last step's gate is never read.

Training minimises the expected loss sum_t p_t L_t with an entropy regulariser (Ouro's -beta H(p)); here
the regulariser is KL(p || uniform) = log T - H(p), the same gradient, as a non-negative aux term.
Inference exits at the first step whose cumulative probability reaches a threshold q, or at a fixed
step; every loop still runs (Ouro's too: later tokens need the last loop's keys and values).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class ExitGate(nn.Module):
    """lambda = sigmoid(w . h + b), one gate shared by every loop step (Ouro's `Linear(hidden, 1)`)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.linear = nn.Linear(d_model, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.linear(h)).squeeze(-1)


def exit_probabilities(lambdas: list[torch.Tensor]) -> list[torch.Tensor]:
    """p_1..p_T from lambda_1..lambda_T (each (B, S)); the last lambda is unused (remainder)."""
    probs: list[torch.Tensor] = []
    remaining = torch.ones_like(lambdas[0])
    for lam in lambdas[:-1]:
        probs.append(lam * remaining)
        remaining = remaining * (1 - lam)
    probs.append(remaining)
    return probs


def threshold_exit(probs: list[torch.Tensor], threshold: float) -> torch.Tensor:
    """0-based exit step per token: the first step whose cumulative probability is >= threshold (the
    last step when none is, since the CDF reaches 1 there)."""
    cdf = torch.cumsum(torch.stack(probs), dim=0)  # (T, B, S)
    reached = cdf >= threshold
    reached[-1] = True
    return reached.to(torch.int64).argmax(dim=0)


def kl_to_uniform(probs: list[torch.Tensor]) -> torch.Tensor:
    """Mean over tokens of KL(p || uniform over the T steps) = log T - H(p); 0 for a single step."""
    return (math.log(len(probs)) - entropy(probs)).mean()


def entropy(probs: list[torch.Tensor]) -> torch.Tensor:
    """H(p) per token (B, S), in nats."""
    p = torch.stack(probs)
    return -(p * torch.log(p.clamp_min(1e-12))).sum(0)
