"""Family `adaptive_layers`: per-layer PonderNet-style looping with gated memory banks (seed 000,
Frey et al., "Adaptive Loops and Memory in Transformers: Think Harder or Know More?").

Each of `n_layers` distinct layers loops up to `loops` times on its own, with its own halting router
and step scales:

    h_1 = Block(h_0)                                  (the layer's ordinary pass)
    h_t = h_{t-1} + softplus(alpha_t) * (Block(h_{t-1}) - h_{t-1})      t = 2..loops
    p_t = sigmoid(W_h [h_t ; t / loops] + b_h)                          per token
    out = sum_t p_halt(t) h_t,   p_halt(t) = p_t prod_{i<t} (1 - p_i)   (`halting.PonderNet`)

Readings of the paper's gaps (notes, seeds_000_003.md), each with the alternative as an option:
- The last step takes the remainder prod_{i<N} (1 - p_i), so the weights sum to 1 (PonderNet's
  rule; `halt_remainder: drop` is the literal equation).
- alpha_t (initialised at `loop_scale_init` = -7, softplus ~ 9e-4) scales the extra steps only, so
  each extra step starts as near identity while the layer itself is an ordinary layer
  (`scale_first_pass: true` scales the first pass too, starting the whole network near identity).
- f_theta(LN(h)) is read as the block's residual update Block(h) - h (the block has its own norms).
- E[n_l] = sum_t t p_halt(t); the ponder term is (n_bar - 1) / (loops - 1) with n_bar the mean of
  E[n_l] over layers and tokens, weighted by `train.ponder_lambda` (the paper: 0 in most runs).
- No threshold, no early exit: every step runs (this is why N_max = 3 is iso-FLOP with 3x layers).
- b_h is not stated; the router starts at zero weights and bias `halt_bias_init` (default 0, what a
  zero-initialised router gives; -3 is seed 003's deep start).

Memory (`memory_slots` local slots per layer, `memory_global_slots` shared by all layers):
`memory.GatedMemory`, h + g_L W_L m_L + g_G W_G m_G with gate biases starting at `gate_bias_init`
(paper: -3, 0, 3; +3 best). Where the read sits is not stated: by default once per layer, on the
looped output (`memory_read: every_step` reads after every loop step instead).

At evaluation with more steps than trained, step scales wrap modulo the trained steps and the
router's step feature t / loops keeps the trained `loops` as denominator (so it exceeds 1).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from .core import Block, CoreParams, Embedding, Head, init_weights, rotary_for
from .halting import HaltingRouter, PonderNet
from .memory import GatedMemory, MemoryBank
from .output import ModelOutput
from .registry import TaskFactsLike, register_family
from .representations import trace_step


class AdaptiveLayersParams(CoreParams):
    n_layers: int = Field(12, ge=1, le=256, description="Distinct layers, each looping on its own (paper: 12).")
    loops: int = Field(3, ge=1, le=1024, description="N_max: most steps per layer (paper: 3, 5, 7).")
    halt_bias_init: float = Field(
        0.0, ge=-30, le=30, description="Initial halting-router bias (weights start at 0); not stated by the paper."
    )
    halt_remainder: Literal["last", "drop"] = Field(
        "last", description="'last': the last step takes the leftover probability (weights sum to 1)."
    )
    loop_scale_init: float = Field(
        -7.0, ge=-30, le=30, description="alpha_t init; steps scale the block update by softplus(alpha_t)."
    )
    scale_first_pass: bool = Field(False, description="Also scale each layer's first pass by softplus(alpha_1).")
    memory_slots: int = Field(0, ge=0, le=65536, description="M_L: local memory-bank slots per layer (paper: 1024).")
    memory_global_slots: int = Field(
        0, ge=0, le=65536, description="M_G: slots of the global bank shared by all layers (paper: 512)."
    )
    gate_bias_init: float = Field(
        3.0, ge=-30, le=30, description="Initial memory-gate bias: sigmoid(-3/0/3) = 0.05/0.5/0.95 (paper best: 3)."
    )
    gate_granularity: Literal["scalar", "vector"] = Field(
        "scalar", description="One gate per token, or one per feature (the paper is ambiguous)."
    )
    memory_read: Literal["after_loop", "every_step"] = Field(
        "after_loop", description="Read memory once per layer after its loop, or after every loop step."
    )

    aux_term_sources = {"ponder": "model.params.loops > 1"}

    def aux_terms(self) -> set[str]:
        return {"ponder"} if self.loops > 1 else set()

    def baseline(self, kind: str) -> tuple[str, dict] | None:
        """iso_param: the same layers (and memory banks) run once; iso_flop: n_layers x loops layers run once."""
        if self.loops == 1:
            return None
        layers = self.n_layers if kind == "iso_param" else self.n_layers * self.loops
        return "adaptive_layers", {**self.model_dump(), "n_layers": layers, "loops": 1}

    def grad_norm_groups(self) -> set[str]:
        return {"router"} if self.loops > 1 else set()

    lr_group_names = ("router", "memory")

    def param_groups(self) -> dict[str, tuple[str, ...]]:
        groups = {"router": ("layers.*.router.*",)} if self.loops > 1 else {}
        if self.memory_slots or self.memory_global_slots:
            groups["memory"] = ("layers.*.memory.*", "global_bank.*")
        return groups

    def traced_steps(self) -> int:
        return self.n_layers * self.loops  # every layer's steps in turn: one per block application

    def diagnostic_names(self) -> set[str]:
        names: set[str] = set()
        layers = range(self.n_layers)
        if self.loops > 1:
            names |= {"ponder_steps_mean", "ponder_steps_fraction"}
            names |= {f"expected_steps_layer_{l}" for l in layers}  # noqa: E741
            names |= {f"halt_prob_step_{t}" for t in range(1, self.loops + 1)}
            names |= {f"halt_weight_step_{t}" for t in range(1, self.loops + 1)}
        first_scaled = 1 if self.scale_first_pass else 2
        names |= {f"loop_scale_step_{t}_layer_{l}" for t in range(first_scaled, self.loops + 1) for l in layers}  # noqa: E741
        if self.memory_slots:
            names |= {"gate_local_mean"} | {f"gate_local_mean_layer_{l}" for l in layers}  # noqa: E741
        if self.memory_global_slots:
            names |= {"gate_global_mean"} | {f"gate_global_mean_layer_{l}" for l in layers}  # noqa: E741
        return names


class AdaptiveLayer(nn.Module):
    """One layer: its block looped with step scales, a halting router and (optionally) gated memory."""

    def __init__(self, p: AdaptiveLayersParams, causal: bool, rotary, has_global: bool):
        super().__init__()
        self.p = p
        self.block = Block(p, causal, rotary)
        n_scales = p.loops if p.scale_first_pass else p.loops - 1
        self.loop_scale = nn.Parameter(torch.full((n_scales,), p.loop_scale_init)) if n_scales else None
        self.router = HaltingRouter(p.d_model + 1, p.halt_bias_init) if p.loops > 1 else None
        has_memory = p.memory_slots > 0 or has_global
        self.memory = (
            GatedMemory(p, p.memory_slots, has_global, p.gate_bias_init, p.gate_granularity) if has_memory else None
        )

    def init_mechanism(self) -> None:
        if self.loop_scale is not None:
            nn.init.constant_(self.loop_scale, self.p.loop_scale_init)

    def scale(self, t: int) -> torch.Tensor | None:
        """softplus(alpha) for 1-based step t, or None for an unscaled first pass; wraps beyond training."""
        if not self.p.scale_first_pass:
            if t == 1:
                return None
            return F.softplus(self.loop_scale[(t - 2) % (self.p.loops - 1)])
        return F.softplus(self.loop_scale[(t - 1) % self.p.loops])

    def forward(
        self, h: torch.Tensor, steps: int, global_bank: MemoryBank | None, record: dict | None, trace=None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(output state, E[n] per token or None without halting); `record` collects diagnostics and
        `trace` (a `representations.StepTrace`, when set) the state after every step."""
        if steps > 1 and self.router is None:
            raise ValueError("this model was trained with loops=1: it has no halting router to run more steps")
        gates = {} if record is not None else None
        halting = PonderNet(steps, self.p.halt_remainder) if self.router is not None else None
        for t in range(1, steps + 1):
            s = self.scale(t)
            h = self.block(h) if s is None else h + s * (self.block(h) - h)
            if self.memory is not None and self.p.memory_read == "every_step":
                h = self.memory(h, global_bank, gates)
            if trace is not None:
                trace(h)
            if halting is not None:
                step_feature = h.new_full((*h.shape[:-1], 1), t / self.p.loops)
                p = self.router(torch.cat([h, step_feature], dim=-1))
                halting.step(p, h)
                if record is not None:
                    record.setdefault("p", []).append(p.mean().item())
        if halting is not None:
            h = halting.output
            if record is not None:
                record["w"] = [w.mean().item() for w in halting.weights]
        if self.memory is not None and self.p.memory_read == "after_loop":
            h = self.memory(h, global_bank, gates)
        if record is not None and gates:
            record.update({k: sum(v) / len(v) for k, v in gates.items()})
        return h, (halting.expected_steps if halting is not None else None)


class AdaptiveLayers(nn.Module):
    def __init__(self, p: AdaptiveLayersParams, facts: TaskFactsLike):
        super().__init__()
        self.p = p
        self.loops = p.loops
        self.effective_depth: int = p.n_layers * p.loops
        # Every metric name this model adds to the trainer's vocabulary (see CoreParams.metric_names).
        self.diagnostic_names: set[str] = p.metric_names()
        rotary = rotary_for(p, facts.seq_len)
        self.embed = Embedding(p, facts.vocab_size, facts.seq_len)
        self.global_bank = MemoryBank(p, p.memory_global_slots) if p.memory_global_slots else None
        has_global = self.global_bank is not None
        self.layers = nn.ModuleList(AdaptiveLayer(p, facts.causal, rotary, has_global) for _ in range(p.n_layers))
        self.head = Head(p, facts.vocab_size)
        init_weights(self, p, self.effective_depth)

    def grad_norm_groups(self) -> dict[str, list[nn.Parameter]]:
        routers = [q for layer in self.layers if layer.router is not None for q in layer.router.parameters()]
        return {"router": routers} if routers else {}

    def forward(self, tokens: torch.Tensor, loops: int | None = None, *, diagnose: bool = False) -> ModelOutput:
        steps = self.loops if loops is None else loops
        if steps < 1:
            raise ValueError(f"loops must be >= 1, got {steps}")
        h = self.embed(tokens)
        records: list[dict] = []
        expected: list[torch.Tensor] = []
        trace_step(self, h)
        for layer in self.layers:
            record = {} if diagnose else None
            h, e = layer(h, steps, self.global_bank, record, getattr(self, "step_trace", None))
            if e is not None:
                expected.append(e.mean())
            if record is not None:
                records.append(record)
        out = ModelOutput(logits=self.head(h))
        if expected and steps > 1:
            n_bar = torch.stack(expected).mean()
            out.aux["ponder"] = (n_bar - 1) / (steps - 1)  # normalised expected steps, in [0, 1]
        if diagnose:
            out.diagnostics.update(self._diagnostics(records, expected, steps))
        return out

    def _diagnostics(self, records: list[dict], expected: list[torch.Tensor], steps: int) -> dict[str, float]:
        out: dict[str, float] = {}
        if expected:
            n_bar = torch.stack(expected).mean().item()
            out.update(ponder_steps_mean=n_bar, ponder_steps_fraction=n_bar / steps)
            out.update({f"expected_steps_layer_{l}": e.item() for l, e in enumerate(expected)})  # noqa: E741
            for key, name in (("p", "halt_prob_step"), ("w", "halt_weight_step")):
                for t in range(steps):
                    out[f"{name}_{t + 1}"] = sum(r[key][t] for r in records) / len(records)
        for l, (layer, record) in enumerate(zip(self.layers, records, strict=True)):  # noqa: E741
            first = 1 if self.p.scale_first_pass else 2
            for t in range(first, self.loops + 1):
                out[f"loop_scale_step_{t}_layer_{l}"] = layer.scale(t).item()
            for kind in ("local", "global"):
                if kind in record:
                    out[f"gate_{kind}_mean_layer_{l}"] = record[kind]
        for kind in ("local", "global"):
            values = [r[kind] for r in records if kind in r]
            if values:
                out[f"gate_{kind}_mean"] = sum(values) / len(values)
        return out


@register_family("adaptive_layers", AdaptiveLayersParams)
def build(params: AdaptiveLayersParams, facts: TaskFactsLike) -> AdaptiveLayers:
    return AdaptiveLayers(params, facts)
