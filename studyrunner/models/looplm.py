"""Family `looplm`: Ouro's looped language model (seed 001's baseline, arXiv 2510.25741).

The whole stack of `block_layers` distinct layers (N) runs `loops` times (T); embedding once, the head
(final norm + projection) after every loop, and a shared exit gate on each loop's final-normed state
(`exits.py`): lambda_t = sigmoid(g), p_t = lambda_t * prod_{j<t} (1 - lambda_j), the remainder to T.

What the next loop reads (`loop_input`): Ouro's model file applies the final norm at the end of every
loop and carries that normed state into the next loop (`hidden_states = self.norm(hidden_states)` inside
the loop over `total_ut_steps`), so `normed` (the default) does the same: loop t + 1 starts from
norm(h_t), the state the head and the exit gate read. `residual` carries the un-normed residual stream
instead (the final norm only feeds the head and the gate), which is what this family did before; it
differs from `normed` from the second loop on, and a 1-loop model is the same either way. Ouro's layers
also have sandwich norms (a norm after attention and after the MLP), which the shared core does not.

Training minimises the expected task loss over exits, sum_t p_t L_t (through `ModelOutput.exits`, so the
trainer stays family-agnostic), plus `train.exit_entropy_beta` times KL(p || uniform) (aux term
`exit_kl_uniform`; Ouro's -beta H(p) up to a constant). The reading of "expected loss" is Ouro's paper
(stage I); the public model file instead takes the cross-entropy of the p-weighted logits, which is not
offered here. Without the regulariser the exits collapse: measured here (character LM, T = 4, 400 steps),
p_1 reached 0.998, so the last loop, where inference exits by default, was barely trained (4.03 bits per
character against 2.91 with beta = 0.05).

Inference (evaluation, decoding): every loop runs; each token's logits come from its exit step, the
first step whose cumulative exit probability reaches `exit_threshold`, or the fixed `exit_step`, or
(neither set, Ouro's released default, which "effectively disables" exiting) the last loop.
`forward(tokens, loops=M)` runs M loops and exits within them (the remainder goes to step M).

KV cache (`models/kv_cache.py`): one slot per (loop, layer), as Ouro's cache index loop * N + layer, so
a token keeps N * T key/value rows: L * N * 2 * d * bytes * T per sequence of L tokens.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from .core import Block, CoreParams, Embedding, Head, init_weights, rotary_for
from .exits import ExitGate, entropy, exit_probabilities, kl_to_uniform, threshold_exit
from .kv_cache import KVCache, kv_bytes_per_token
from .output import ModelOutput
from .registry import TaskFactsLike, register_family
from .representations import trace_step


class LoopLMParams(CoreParams):
    block_layers: int = Field(1, ge=1, le=256, description="N: distinct layers of the stack that loops.")
    loops: int = Field(4, ge=1, le=1024, description="T: times the whole stack runs (Ouro: 4).")
    exit_threshold: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Inference exit: the first step whose cumulative exit probability reaches this; unset = "
        "the last loop (or exit_step).",
    )
    exit_step: int | None = Field(
        None, ge=1, le=1024, description="Inference exit at this fixed step (capped at the loops run)."
    )
    loop_input: Literal["normed", "residual"] = Field(
        "normed",
        description="What each loop after the first reads: normed (default, Ouro's model file) = the previous "
        "loop's final-normed state, the one the head and exit gate see; residual = the un-normed residual stream.",
    )

    aux_term_sources = {"exit_kl_uniform": "family looplm"}

    @model_validator(mode="after")
    def _one_exit_rule(self) -> LoopLMParams:
        if self.exit_threshold is not None and self.exit_step is not None:
            raise ValueError("set exit_threshold or exit_step, not both")
        if self.exit_step is not None and self.exit_step > self.loops:
            raise ValueError(f"exit_step ({self.exit_step}) cannot exceed loops ({self.loops})")
        return self

    def aux_terms(self) -> set[str]:
        return {"exit_kl_uniform"}

    lr_group_names = ("exit_gate",)

    def param_groups(self) -> dict[str, tuple[str, ...]]:
        return {"exit_gate": ("exit_gate.*",)}

    def diagnostic_names(self) -> set[str]:
        steps = {f"exit_prob_step_{t}" for t in range(1, self.loops + 1)}
        return steps | {"exit_step_expected", "exit_step_mean", "exit_entropy"}

    def supports_decoding(self) -> bool:
        return True

    def baseline(self, kind: str) -> tuple[str, dict] | None:
        """iso_param: the N layers run once (a `looped` N x 1; the exit gate's d + 1 parameters are matched
        by the compiler's MLP widening); iso_flop: N * T distinct layers run once."""
        if self.loops == 1:
            return None
        core = {name: getattr(self, name) for name in CoreParams.model_fields}
        layers = self.block_layers if kind == "iso_param" else self.block_layers * self.loops
        return "looped", {**core, "block_layers": layers, "loops": 1}


class LoopLM(nn.Module):
    def __init__(self, p: LoopLMParams, facts: TaskFactsLike):
        super().__init__()
        self.p = p
        self.loops = p.loops
        self.effective_depth: int = p.block_layers * p.loops
        self.diagnostic_names: set[str] = p.metric_names()
        self.rotary = rotary_for(p, facts.seq_len)
        # The same construction order as `looped` (embed, blocks, head): a 1-loop LoopLM draws the same
        # initial weights as the equal `looped` cell, and MELT (melt.py) shares these parameter names.
        self.embed = Embedding(p, facts.vocab_size, facts.seq_len)
        self.blocks = nn.ModuleList(Block(p, facts.causal, self.rotary) for _ in range(p.block_layers))
        self.head = Head(p, facts.vocab_size)
        self.exit_gate = ExitGate(p.d_model)
        init_weights(self, p, self.effective_depth)

    # ------------------------------------------------------------------------------------ decoding

    def new_cache(self) -> KVCache:
        return KVCache()

    def kv_bytes_per_token(self, loops: int | None = None, dtype: torch.dtype = torch.float32) -> int:
        """N * T rows of keys and values per token."""
        return kv_bytes_per_token(self.p.block_layers * (loops or self.loops), self.p.d_model, dtype)

    # ------------------------------------------------------------------------------------- forward

    def run(
        self, tokens: torch.Tensor, loops: int, kv_cache: KVCache | None = None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Logits and exit-gate values (B, S) after every loop."""
        start = kv_cache.length if kv_cache is not None else 0
        positions = None
        if kv_cache is not None and self.rotary is not None:
            positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        h = self.embed(tokens, start)
        trace_step(self, h)
        logits, lambdas = [], []
        for step in range(loops):
            for layer, block in enumerate(self.blocks):
                update = kv_cache.slot((step, layer)).append if kv_cache is not None else None
                h = block(h, positions, update)
            trace_step(self, h)
            normed = self.head.norm(h)
            logits.append(self.head.out(normed))
            lambdas.append(self.exit_gate(normed))
            if self.p.loop_input == "normed":
                h = normed
        if kv_cache is not None:
            kv_cache.length += tokens.shape[1]
        return logits, lambdas

    def forward(
        self,
        tokens: torch.Tensor,
        loops: int | None = None,
        *,
        diagnose: bool = False,
        kv_cache: KVCache | None = None,
    ) -> ModelOutput:
        """`loops` runs another depth than trained; `kv_cache` continues the sequence it holds."""
        steps = self.loops if loops is None else loops
        if steps < 1:
            raise ValueError(f"loops must be >= 1, got {steps}")
        logits, lambdas = self.run(tokens, steps, kv_cache)
        probs = exit_probabilities(lambdas)
        chosen = self._exit_steps(probs, tokens)
        stacked = torch.stack(logits)  # (T, B, S, V)
        index = chosen[None, ..., None].expand(1, *stacked.shape[1:])
        out = ModelOutput(logits=stacked.gather(0, index).squeeze(0))
        if self.training:
            out.exits = list(zip(logits, probs, strict=True))
        out.aux["exit_kl_uniform"] = kl_to_uniform(probs)
        if diagnose:
            out.diagnostics.update(self._diagnostics(probs, chosen))
        return out

    def _exit_steps(self, probs: list[torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
        """0-based exit step per token (B, S) under the inference rule."""
        if self.p.exit_threshold is not None:
            return threshold_exit(probs, self.p.exit_threshold)
        last = len(probs) if self.p.exit_step is None else min(self.p.exit_step, len(probs))
        return torch.full(tokens.shape, last - 1, dtype=torch.int64, device=tokens.device)

    def _diagnostics(self, probs: list[torch.Tensor], chosen: torch.Tensor) -> dict[str, float]:
        out = {f"exit_prob_step_{t}": p.mean().item() for t, p in enumerate(probs, start=1)}
        out["exit_step_expected"] = sum(t * p for t, p in enumerate(probs, start=1)).mean().item()
        out["exit_step_mean"] = (chosen + 1).float().mean().item()
        out["exit_entropy"] = entropy(probs).mean().item()
        return out

    @torch.no_grad()
    def trace(self, tokens: torch.Tensor, loops: int | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-loop logits and every attention output (before the residual add), loop-major, layer-minor:
        what a MELT student distils from (melt.py)."""
        outputs: list[torch.Tensor] = []
        hooks = [b.attn.register_forward_hook(lambda m, a, o: outputs.append(o)) for b in self.blocks]
        try:
            logits, _ = self.run(tokens, loops or self.loops)
        finally:
            for hook in hooks:
                hook.remove()
        return logits, outputs


@register_family("looplm", LoopLMParams)
def build(params: LoopLMParams, facts: TaskFactsLike) -> LoopLM:
    return LoopLM(params, facts)
