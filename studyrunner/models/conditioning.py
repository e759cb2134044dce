"""Conditioning a looped block on where it is in loop time (LoopFormer, seed 004; TMLT).

- `FourierEmbedder`: a scalar τ -> [cos(τ ω_j), sin(τ ω_j)] with ω_j = max_period^(-j / (F/2)),
  j = 0..F/2-1, then Linear(F -> d), SiLU, Linear(d -> d) (the paper's Appendix A and the DiT
  timestep embedder the official code uses). LoopFormer sums two of them, φ_t(t) + φ_Δ(Δ); TMLT
  feeds the integer loop index to one (the official `tmlt.py` does exactly that, so it extends to
  any number of steps).
- `AdaLNZero`: per block, Linear(SiLU(c)) -> (gate_msa, gate_mlp, scale_msa, scale_mlp), in that
  order, with weights and bias zero-initialised (gates closed: the block starts as the identity).
  No shift: the paper's 4d outputs, not DiT's 6d.
- `ModulatedBlock`: the core's attention and MLP under those modulations,
  x + α_msa ⊙ Attn(norm(x) ⊙ (1 + γ_msa)), then + α_mlp ⊙ MLP(norm(x) ⊙ (1 + γ_mlp)),
  with norms without a learned affine (the paper's RMSNorm(elementwise_affine=False)).

Readings (see the family's docstring for the rest):
- τ is fed unscaled (the paper says nothing of scaling; cos(1/8) vs cos(2/8) differ by 2%):
  `time_scale` multiplies τ first, 1.0 by default (DiT-style embedders use 1000).
- The official code zeroes the modulator and then re-initialises every Linear of the model with
  normal(0, 0.02) (its `self.apply(self._init_weights)` runs after the blocks are built), so its gates
  start small but not at 0. `modulator_init: zero` (default) is what the paper and the code's comment
  mean ("start from identity updates"); `normal` reproduces what the code does.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from .core import MLP, Attention, CoreParams, Derf, Rotary


class FourierEmbedder(nn.Module):
    """τ (M,) -> (M, d): Fourier features of τ, then a two-layer SiLU MLP of width d."""

    def __init__(self, d_model: int, features: int, max_period: float, scale: float):
        super().__init__()
        half = features // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
        self.register_buffer("freqs", freqs, persistent=False)
        self.scale = scale
        self.mlp = nn.Sequential(nn.Linear(2 * half, d_model), nn.SiLU(), nn.Linear(d_model, d_model))

    def forward(self, tau: torch.Tensor) -> torch.Tensor:
        args = (tau.to(self.freqs.dtype) * self.scale)[:, None] * self.freqs[None]
        features = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return self.mlp(features.to(self.mlp[0].weight.dtype))


class AdaLNZero(nn.Module):
    """c (M, d) -> four (M, d) modulations: gate_msa, gate_mlp, scale_msa, scale_mlp."""

    def __init__(self, d_model: int, init: Literal["zero", "normal"], std: float):
        super().__init__()
        self.init, self.std = init, std
        self.linear = nn.Linear(d_model, 4 * d_model)
        self.init_mechanism()

    def init_mechanism(self) -> None:  # called again by core.init_weights, after the generic init
        if self.init == "zero":
            nn.init.zeros_(self.linear.weight)
        else:
            nn.init.normal_(self.linear.weight, 0.0, self.std)
        nn.init.zeros_(self.linear.bias)

    def forward(self, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.linear(F.silu(c)).chunk(4, dim=-1)


def unscaled_norm(p: CoreParams) -> nn.Module:
    """The core's norm kind without a learned gain: (1 + γ) from the modulator is the gain."""
    if p.norm == "rmsnorm":
        return nn.RMSNorm(p.d_model, elementwise_affine=False)
    if p.norm == "derf":
        return Derf(p.d_model)
    return nn.LayerNorm(p.d_model, elementwise_affine=False)


class ModulatedBlock(nn.Module):
    """A pre-norm block whose residual branches are gated and whose norms are scaled per loop step."""

    def __init__(self, p: CoreParams, causal: bool, rotary: Rotary | None, modulator_init: Literal["zero", "normal"]):
        super().__init__()
        self.norm1, self.attn = unscaled_norm(p), Attention(p, causal, rotary)
        self.norm2, self.mlp = unscaled_norm(p), MLP(p)
        self.drop = nn.Dropout(p.dropout)
        self.modulator = AdaLNZero(p.d_model, modulator_init, p.init_std)

    def forward(self, x: torch.Tensor, mod: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """`mod`: this step's (gate_msa, gate_mlp, scale_msa, scale_mlp), each (d,), shared by the batch."""
        gate_msa, gate_mlp, scale_msa, scale_mlp = mod
        x = x + gate_msa * self.drop(self.attn(self.norm1(x) * (1 + scale_msa)))
        return x + gate_mlp * self.drop(self.mlp(self.norm2(x) * (1 + scale_mlp)))
