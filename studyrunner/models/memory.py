"""Memory mechanisms composed onto the core: a memory-token prefix (seed 003) and gated memory banks (seed 000).

- `MemoryTokens`: `slots` learned vectors prepended to the sequence, with a type embedding (memory
  vs sequence) and their own positions; every layer reads and writes them like any token, and their
  outputs are dropped before the head.
- `GatedMemory`: static learned key/value banks (one local bank per layer, one global bank shared
  by all layers), read with single-head QK-normed attention and added to the residual stream
  through input-dependent sigmoid gates.
- `AttentionMass`: the attention-mass quadrants between memory and sequence tokens (diagnostics).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from .core import Attention, CoreParams, ResidualProj, make_norm


class MemoryTokens(nn.Module):
    """A prefix of `slots` learned vectors, initialised N(0, init_std^2) as in the seed-003 code.

    A type embedding (row 0: sequence, row 1: memory) is added to every token, so the two kinds are
    told apart whatever the positions. Positions: under RoPE the slots are numbered 0..M-1 and the
    sequence 0..T-1, independently ("numbered registers", seed 003), so the sequence's relative
    positions are the same with or without memory. With learned absolute positions the sequence keeps
    its position embeddings and the slots get none: each slot's vector is already a learned, distinct
    embedding, so a position table for them would add parameters and no information.
    """

    def __init__(self, p: CoreParams, slots: int):
        super().__init__()
        self.slots = slots
        self.vectors = nn.Parameter(p.init_std * torch.randn(slots, p.d_model))
        self.types = nn.Embedding(2, p.d_model)  # normal(init_std) from init_weights, like every embedding

    def prepend(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, D) -> (B, M + T, D) and the (M + T,) position index of every token (for RoPE)."""
        b, t, _ = h.shape
        memory = (self.vectors + self.types.weight[1]).expand(b, -1, -1)
        positions = torch.cat([torch.arange(self.slots, device=h.device), torch.arange(t, device=h.device)])
        return torch.cat([memory, h + self.types.weight[0]], dim=1), positions

    def strip(self, h: torch.Tensor) -> torch.Tensor:
        """Drop the memory positions: the loss and metrics see only the sequence."""
        return h[:, self.slots :]


class AttentionMass:
    """Mean attention mass between memory (the first `slots` tokens) and sequence tokens.

    Set as `Attention.probe` during a diagnostic forward; it recomputes the softmax from the queries
    and keys it is handed (the fused kernel does not return it) and averages over batch, heads,
    query tokens and every call (layers and loop steps). Per query kind the pairs sum to 1:
    seq_to_mem + seq_to_seq = 1 and mem_to_mem + mem_to_seq = 1. (Under a causal mask the memory
    prefix sees no sequence token, so mem_to_seq is 0 there.)
    """

    NAMES = ("attn_seq_to_mem", "attn_seq_to_seq", "attn_mem_to_mem", "attn_mem_to_seq")

    def __init__(self, slots: int):
        self.slots = slots
        self.sums = [0.0, 0.0, 0.0, 0.0]
        self.calls = 0

    @torch.no_grad()
    def __call__(self, q: torch.Tensor, k: torch.Tensor, causal: bool) -> None:
        t = q.shape[-2]
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:
            scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        a = scores.softmax(-1)  # (B, H, T, T)
        m = self.slots
        quadrants = (a[..., m:, :m], a[..., m:, m:], a[..., :m, :m], a[..., :m, m:])
        for i, quadrant in enumerate(quadrants):
            self.sums[i] += quadrant.sum(-1).mean().item()
        self.calls += 1

    def result(self) -> dict[str, float]:
        return {name: total / max(1, self.calls) for name, total in zip(self.NAMES, self.sums, strict=True)}


@contextlib.contextmanager
def probing(model: nn.Module, probe) -> Iterator[None]:
    """Attach `probe` to every attention layer of `model` for the duration of the block."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    for layer in layers:
        layer.probe = probe
    try:
        yield
    finally:
        for layer in layers:
            layer.probe = None


class MemoryBank(nn.Module):
    """Static learned keys and values (M, D) (seed 000): trained by backprop, fixed at inference."""

    def __init__(self, p: CoreParams, slots: int):
        super().__init__()
        self.keys = nn.Parameter(p.init_std * torch.randn(slots, p.d_model))
        self.values = nn.Parameter(p.init_std * torch.randn(slots, p.d_model))


class MemoryRead(nn.Module):
    """m = softmax(LN_q(h) LN_k(K)^T / sqrt(D)) V: single head, QK-normed (seed 000, eqs. 6-7).

    The paper names no query/key projection, so there is none: the norms alone set the scale.
    The norms follow the core's `norm` setting."""

    def __init__(self, p: CoreParams):
        super().__init__()
        self.norm_q, self.norm_k = make_norm(p), make_norm(p)

    def forward(self, h: torch.Tensor, bank: MemoryBank) -> torch.Tensor:
        q, k = self.norm_q(h), self.norm_k(bank.keys)
        return F.scaled_dot_product_attention(q, k.expand(h.shape[0], -1, -1), bank.values.expand(h.shape[0], -1, -1))


class Gate(nn.Module):
    """g = sigmoid(W_g h + b_g), a scalar or a vector per token; W_g starts at 0 and b_g at `bias_init`.

    Zero weights make the initial gate exactly sigmoid(bias_init) (-3/0/3 -> 0.047/0.5/0.953, the
    paper's three settings) for every token; the paper does not state W_g's init."""

    def __init__(self, d_model: int, granularity: Literal["scalar", "vector"], bias_init: float):
        super().__init__()
        self.bias_init = bias_init
        self.linear = nn.Linear(d_model, 1 if granularity == "scalar" else d_model)
        self.init_mechanism()

    def init_mechanism(self) -> None:
        nn.init.zeros_(self.linear.weight)
        nn.init.constant_(self.linear.bias, self.bias_init)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.linear(h))


class GatedMemory(nn.Module):
    """h + g_L * W_L m_L + g_G * W_G m_G (seed 000, eqs. 8-10), either term absent when its bank is.

    The local bank belongs to this layer; the global bank is shared by all layers and passed in.
    Each layer has its own reads, projections and gates for both. Gates read h, the state before
    the memory is added.

    The paper's eq. 9 writes the gate with an elementwise product (a vector) but its figure calls
    the gates "input-dependent scalars" and it reports scalar gate values: `granularity` picks
    ("scalar" by default, "vector" the other reading).
    """

    def __init__(
        self,
        p: CoreParams,
        local_slots: int,
        has_global: bool,
        gate_bias_init: float,
        granularity: Literal["scalar", "vector"],
    ):
        super().__init__()
        self.local = MemoryBank(p, local_slots) if local_slots else None
        self.local_read = MemoryRead(p) if local_slots else None
        self.local_proj = ResidualProj(p.d_model, p.d_model, bias=p.bias) if local_slots else None
        self.local_gate = Gate(p.d_model, granularity, gate_bias_init) if local_slots else None
        self.global_read = MemoryRead(p) if has_global else None
        self.global_proj = ResidualProj(p.d_model, p.d_model, bias=p.bias) if has_global else None
        self.global_gate = Gate(p.d_model, granularity, gate_bias_init) if has_global else None

    def forward(
        self, h: torch.Tensor, global_bank: MemoryBank | None, stats: dict[str, list[float]] | None = None
    ) -> torch.Tensor:
        """`stats`, when given, collects the mean gate value of this call under 'local'/'global'."""
        out = h
        if self.local is not None:
            g = self.local_gate(h)
            out = out + g * self.local_proj(self.local_read(h, self.local))
            if stats is not None:
                stats.setdefault("local", []).append(g.mean().item())
        if self.global_read is not None:
            g = self.global_gate(h)
            out = out + g * self.global_proj(self.global_read(h, global_bank))
            if stats is not None:
                stats.setdefault("global", []).append(g.mean().item())
        return out
