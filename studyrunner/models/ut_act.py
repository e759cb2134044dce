"""Family `ut_act`: a Universal Transformer with ACT halting and memory tokens (seed 003, Sapunov,
"Universal Transformers Need Memory").

One shared block is iterated up to `loops` times. Before each step a learned step embedding is
added (at evaluation beyond the trained depth the step index wraps modulo `loops`, as the paper
does). With `act: true` a router decides per token when to stop (Graves ACT, `halting.ACT`): halted
tokens keep their state but are still attended to, and the output is the ACT-weighted sum of each
token's states; the ponder cost N + R is returned as the aux term `ponder`, weighted by
`train.ponder_lambda` (with `train.ponder_lambda_warmup_steps`). With `act: false` the output is
the last state: a plain weight-tied transformer run `loops` times.

Memory tokens (`memory_slots`) are prepended with a type embedding and their own positions
(`memory.MemoryTokens`); they halt like any token (same router, included in the ponder cost, as in
the authors' code) and are dropped before the head.

Differences from the paper's model, all from the shared core: the FFN is the core's GELU MLP
(the paper's is SwiGLU with 8/3 d) and attention has no QK-norm. The norm defaults to Derf, the
paper's choice (`norm: rmsnorm` is its ablation), read as in the notes: erf(a*x + s), a ~ 1, no gain.
Measured here at CPU scale it learns far more slowly than LayerNorm: with the core's std-0.02
embeddings erf passes a ~0.02-scale signal where LayerNorm rescales to unit variance (4x4 Sudoku,
d=32, 1 layer, 300 steps: train loss 1.37 with Derf vs 0.57 with LayerNorm; the Derf paper itself
scales a, initialising it per layer type). Set `norm: layernorm` for CPU-sized studies.
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from .core import Block, CoreParams, Embedding, Head, init_weights, rotary_for
from .halting import ACT, HaltingRouter
from .memory import AttentionMass, MemoryTokens, probing
from .output import ModelOutput
from .registry import TaskFactsLike, register_family
from .representations import trace_step


class UTActParams(CoreParams):
    norm: Literal["layernorm", "rmsnorm", "derf"] = Field(
        "derf", description="Pre-norm type; Derf (erf(a*x + s)) is the paper's, rmsnorm its ablation."
    )
    loops: int = Field(18, ge=1, le=1024, description="N_max: most block applications per token (paper: 18).")
    memory_slots: int = Field(
        16, ge=0, le=4096, description="Learned memory tokens prepended to the sequence (paper: 0-64, 16 default)."
    )
    act: bool = Field(True, description="Adaptive halting (Graves ACT); false = always run `loops` steps.")
    halt_bias_init: float = Field(
        -3.0,
        ge=-30,
        le=30,
        description="Initial router bias (weights start at 0): -3 = 'deep start' (p~0.047, every token runs "
        "all 18 steps at init); 0 or Graves' +1 halt after ~2 steps, the shallow trap. Ignored when act is false.",
    )
    act_epsilon: float = Field(
        0.05, gt=0, lt=1, description="A token halts once its cumulative p reaches 1 - act_epsilon."
    )

    aux_term_sources = {"ponder": "model.params.act: true"}

    def aux_terms(self) -> set[str]:
        return {"ponder"} if self.act else set()

    def baseline(self, kind: str) -> tuple[str, dict] | None:
        """iso_param: the shared block run once, no halting; iso_flop: a plain (`looped`) transformer with
        `loops` distinct layers, same width, norm and memory tokens."""
        if self.loops == 1:
            return None
        core = {name: getattr(self, name) for name in CoreParams.model_fields}
        if kind == "iso_param":
            return "ut_act", {**self.model_dump(), "loops": 1, "act": False}
        return "looped", {**core, "block_layers": self.loops, "loops": 1, "memory_slots": self.memory_slots}

    def grad_norm_groups(self) -> set[str]:
        return {"router"} if self.act else set()

    lr_group_names = ("router", "memory")

    def param_groups(self) -> dict[str, tuple[str, ...]]:
        groups = {"router": ("router.*",)} if self.act else {}
        return groups | ({"memory": ("memory.*",)} if self.memory_slots else {})

    def diagnostic_names(self) -> set[str]:
        names: set[str] = set(AttentionMass.NAMES) if self.memory_slots else set()
        if self.act:
            names |= {"ponder_steps_mean", "ponder_steps_fraction"}
            names |= {f"halt_prob_step_{n}" for n in range(1, self.loops + 1)}
            names |= {f"halt_weight_step_{n}" for n in range(1, self.loops + 1)}
            if self.memory_slots:
                names.add("ponder_steps_mean_memory")
        return names


class UTAct(nn.Module):
    """Why the router starts at zero weights and bias `halt_bias_init` = -3 by default:

    at initialisation every token halts with p = sigmoid(bias). With bias 0 (p = 0.5) the cumulative
    probability reaches 1 - 0.05 at step 2, so every token halts after 2 steps before the model has
    learned anything; the paper found such runs settle into a shallow equilibrium (halting at 5-7 of
    18 steps) they cannot escape, and >70% of them failed. With -3 (p ~ 0.047) the cumulative p after
    18 steps is ~0.85 < 0.95, so every token runs all 18 steps: training starts deep, the output is a
    near-uniform blend of the steps, and the model learns to halt earlier ("deep start").
    """

    def __init__(self, p: UTActParams, facts: TaskFactsLike):
        super().__init__()
        self.p = p
        self.loops = p.loops
        self.effective_depth: int = p.loops
        # Every metric name this model adds to the trainer's vocabulary (see CoreParams.metric_names).
        self.diagnostic_names: set[str] = p.metric_names()
        rotary = rotary_for(p, max(facts.seq_len, p.memory_slots))
        self.embed = Embedding(p, facts.vocab_size, facts.seq_len)
        self.memory = MemoryTokens(p, p.memory_slots) if p.memory_slots else None
        self.step_embed = nn.Embedding(p.loops, p.d_model)
        self.block = Block(p, facts.causal, rotary)
        self.router = HaltingRouter(p.d_model, p.halt_bias_init) if p.act else None
        self.head = Head(p, facts.vocab_size)
        init_weights(self, p, p.loops)

    def grad_norm_groups(self) -> dict[str, list[nn.Parameter]]:
        return {"router": list(self.router.parameters())} if self.router is not None else {}

    def forward(self, tokens: torch.Tensor, loops: int | None = None, *, diagnose: bool = False) -> ModelOutput:
        """`loops` sets the most steps at this call (test-time depth; the step embedding wraps)."""
        steps = self.loops if loops is None else loops
        if steps < 1:
            raise ValueError(f"loops must be >= 1, got {steps}")
        h, positions = self.embed(tokens), None
        if self.memory is not None:
            h, positions = self.memory.prepend(h)
        act = ACT(h[..., 0], self.p.act_epsilon, steps) if self.router is not None else None
        probs: list[torch.Tensor] = []
        probe = AttentionMass(self.p.memory_slots) if diagnose and self.memory is not None else None
        with probing(self, probe) if probe is not None else contextlib.nullcontext():
            trace_step(self, h)
            for n in range(steps):
                h_new = self.block(h + self.step_embed.weight[n % self.loops], positions)
                if act is None:
                    h = h_new
                    trace_step(self, h)
                    continue
                p = self.router(h_new)
                h = act.step(p, h, h_new)
                trace_step(self, h)
                if diagnose:
                    probs.append(p.detach())
        y = h if act is None else act.output
        if self.memory is not None:
            y = self.memory.strip(y)
        out = ModelOutput(logits=self.head(y))
        if act is not None:
            out.aux["ponder"] = act.ponder.mean()  # over every token, memory included (authors' code)
        if diagnose:
            out.diagnostics.update(self._diagnostics(act, probs, steps))
            if probe is not None:
                out.diagnostics.update(probe.result())
        return out

    def realised_loops(self, tokens: torch.Tensor) -> float | None:
        """FLOP counting's hook (train/flops.py): the mean number of loop steps per position (memory slots
        included) whose results the output uses, ACT's N: each token's halting step. The block still runs on a
        halted token (its state frozen, its later weights 0), so the steps after halting are computed and
        unused. None without halting (every step is used)."""
        if self.router is None:
            return None
        d = self.forward(tokens, diagnose=True).diagnostics
        m, t = self.p.memory_slots, tokens.shape[1]
        return (d["ponder_steps_mean"] * t + d.get("ponder_steps_mean_memory", 0.0) * m) / (m + t)

    def _diagnostics(self, act: ACT | None, probs: list[torch.Tensor], steps: int) -> dict[str, float]:
        if act is None:
            return {}
        m = self.p.memory_slots  # sequence tokens are the ones after the memory prefix
        seq_steps = act.steps[:, m:].mean().item()
        out = {"ponder_steps_mean": seq_steps, "ponder_steps_fraction": seq_steps / steps}
        if m:
            out["ponder_steps_mean_memory"] = act.steps[:, :m].mean().item()
        for n, (p, w) in enumerate(zip(probs, act.weights, strict=True), start=1):
            out[f"halt_prob_step_{n}"] = p[:, m:].mean().item()
            out[f"halt_weight_step_{n}"] = w[:, m:].mean().item()
        return out


@register_family("ut_act", UTActParams)
def build(params: UTActParams, facts: TaskFactsLike) -> UTAct:
    return UTAct(params, facts)
