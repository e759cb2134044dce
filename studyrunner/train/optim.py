"""AdamW with decoupled weight decay on matrices only, and linear warmup + cosine decay."""

from __future__ import annotations

import math

import torch
from torch import nn


def make_optimizer(
    model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float], *, fused: bool = False
):
    """`fused`: one fused CUDA kernel per step (the trainer sets it on a GPU); else the foreach path."""
    # Norm gains and biases are not decayed: shrinking them toward 0 only fights the normalisation.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    if fused:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, foreach=True)


def lr_at(step: int, *, lr: float, steps: int, warmup_steps: int, min_lr_ratio: float) -> float:
    """Learning rate for 0-based `step`: linear warmup to `lr`, then cosine down to lr*min_lr_ratio."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, steps - warmup_steps - 1)
    floor = lr * min_lr_ratio
    return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
