"""AdamW with decoupled weight decay on matrices only, and linear warmup + cosine decay; optionally a peak
learning rate per named group of parameters (`train.lr_groups`)."""

from __future__ import annotations

import math
from fnmatch import fnmatchcase

import torch
from torch import nn

REST = "rest"  # the lr group of every parameter no named group claims


def group_of(name: str, patterns: dict[str, tuple[str, ...]]) -> str:
    """The lr group of parameter `name`: the first named group with a matching pattern, else `rest`."""
    return next((group for group, globs in patterns.items() if any(fnmatchcase(name, g) for g in globs)), REST)


def make_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    *,
    fused: bool = False,
    lr_groups: dict[str, float] | None = None,
    param_groups: dict[str, tuple[str, ...]] | None = None,
):
    """`fused`: one fused CUDA kernel per step (the trainer sets it on a GPU); else the foreach path.

    `lr_groups` (group -> peak learning rate; `rest` defaults to `lr`) over the family's `param_groups`
    (group -> parameter-name patterns, `CoreParams.param_groups`): each torch param group carries its
    `lr_scale` = its peak / `lr`, and `set_lr` sets every group to the schedule's rate times that scale, so
    warmup and cosine decay shape every group alike (MELT's gates at 5e-4 and the rest at 8e-6 keep their
    ratio through the whole run). Without `lr_groups` the groups are exactly the two below."""
    peaks = {REST: lr, **(lr_groups or {})}
    patterns = {g: p for g, p in (param_groups or {}).items() if g in peaks} if lr_groups else {}
    # Norm gains and biases are not decayed: shrinking them toward 0 only fights the normalisation.
    buckets: dict[tuple[str, bool], list[nn.Parameter]] = {(REST, True): [], (REST, False): []}
    for group in patterns:
        buckets[(group, True)], buckets[(group, False)] = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            buckets[(group_of(name, patterns), p.dim() >= 2)].append(p)
    empty = [g for g in patterns if not buckets[(g, True)] and not buckets[(g, False)]]
    if empty:
        raise ValueError(f"train.lr_groups: group {empty[0]!r} holds no parameter of this model")
    groups = [
        {"params": params, "weight_decay": weight_decay if decay else 0.0, "lr_scale": peaks[g] / lr, "lr_group": g}
        for (g, decay), params in buckets.items()
        if params or g == REST
    ]
    if fused:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, foreach=True)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every param group at the schedule's rate `lr` (that of `train.lr`) times its group's `lr_scale`."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def lr_at(step: int, *, lr: float, steps: int, warmup_steps: int, min_lr_ratio: float) -> float:
    """Learning rate for 0-based `step`: linear warmup to `lr`, then cosine down to lr*min_lr_ratio."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, steps - warmup_steps - 1)
    floor = lr * min_lr_ratio
    return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
