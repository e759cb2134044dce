"""Family `looped`: k distinct blocks applied L times (k x L), Saunshi et al. (seed 002).

The embedding and head run once; only the block stack repeats. The input is not re-injected between
loops: the paper's definition is Output o Block^L o Embed and says nothing of re-injection.
k x 1 and kL x 1 are the same family with other values, so iso-param and iso-FLOP baselines are
ordinary cells of a study.

Extensions, each off by default (and then left out of the resolved config, so existing cells keep
their hashes and compute exactly what they did):
- `memory_slots`: a memory-token prefix (seed 003's mechanism, `memory.MemoryTokens`), so loops x
  memory grids run on this family too.
- Middle looping, the paper's (4 x {1,4,1}): `prefix_layers` distinct layers run once, then the
  looped block, then `suffix_layers` distinct layers run once. Our reading of the notation (the
  paper gives only it and a figure): three distinct blocks, the middle one looped.
- The looping regulariser (`regularisers.py`) on the looped block's distinct layers, layer l vs
  l + `regulariser_k`, weighted by `train.regulariser_lambda`.
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from .core import Block, CoreParams, Embedding, Head, KVUpdate, init_weights, rotary_for
from .kv_cache import KVCache, kv_bytes_per_token
from .memory import AttentionMass, MemoryTokens, probing
from .output import ModelOutput
from .registry import TaskFactsLike, register_family
from .regularisers import block_distance, parameter_groups
from .representations import trace_step


class LoopedParams(CoreParams):
    block_layers: int = Field(1, ge=1, le=256, description="k: distinct layers in the looped block.")
    loops: int = Field(1, ge=1, le=1024, description="L: times the block is applied.")
    memory_slots: int = Field(
        0, ge=0, le=4096, description="Learned memory tokens prepended to the sequence (seed 003); 0 = none."
    )
    prefix_layers: int = Field(0, ge=0, le=256, description="Distinct layers run once before the looped block.")
    suffix_layers: int = Field(0, ge=0, le=256, description="Distinct layers run once after the looped block.")
    regulariser_k: int | None = Field(
        None,
        ge=1,
        le=255,
        description="Looping regulariser (seed 002): compare layer l of the looped block with layer l+k; "
        "unset = off. Weighted by train.regulariser_lambda.",
    )
    regulariser_distance: Literal["cosine", "l2"] = Field(
        "cosine", description="Regulariser distance: cosine (the paper's) or mean squared difference."
    )
    regulariser_params: Literal["matrices", "all"] = Field(
        "matrices", description="Parameter groups compared: weight matrices only, or norms and biases too."
    )

    omit_at_default = frozenset(
        {"memory_slots", "prefix_layers", "suffix_layers"}
        | {"regulariser_k", "regulariser_distance", "regulariser_params"}
    )
    aux_term_sources = {"regulariser": "model.params.regulariser_k"}

    @model_validator(mode="after")
    def _regulariser_fits(self) -> LoopedParams:
        if self.regulariser_k is None:
            for name in ("regulariser_distance", "regulariser_params"):
                if getattr(self, name) != type(self).model_fields[name].default:
                    raise ValueError(f"{name} has no effect without regulariser_k")
        elif self.regulariser_k >= self.block_layers:
            raise ValueError(
                f"regulariser_k ({self.regulariser_k}) must be smaller than block_layers ({self.block_layers}): "
                "it pairs layer l with layer l+k of the block"
            )
        return self

    def aux_terms(self) -> set[str]:
        return {"regulariser"} if self.regulariser_k is not None else set()

    lr_group_names = ("memory",)

    def param_groups(self) -> dict[str, tuple[str, ...]]:
        return {"memory": ("memory.*",)} if self.memory_slots else {}

    def baseline(self, kind: str) -> tuple[str, dict] | None:
        if self.loops == 1:
            return None
        k = self.block_layers if kind == "iso_param" else self.block_layers * self.loops  # k x 1, or kL x 1
        return "looped", {**self.model_dump(), "block_layers": k, "loops": 1}

    def supports_decoding(self) -> bool:
        return self.memory_slots == 0  # a memory prefix would need its own prefill into the cache

    def diagnostic_names(self) -> set[str]:
        names: set[str] = set()
        if self.memory_slots:
            names |= set(AttentionMass.NAMES)
        if self.regulariser_k is not None:
            with torch.device("meta"):
                groups = parameter_groups(Block(self, causal=True), self.regulariser_params)
            names |= {"block_cos_mean"} | {f"block_cos_{g}" for g in groups}
        return names


class LoopedTransformer(nn.Module):
    def __init__(self, p: LoopedParams, facts: TaskFactsLike):
        super().__init__()
        self.p = p
        self.loops = p.loops
        self.effective_depth: int = p.prefix_layers + p.block_layers * p.loops + p.suffix_layers
        # Every metric name this model adds to the trainer's vocabulary (see CoreParams.metric_names).
        self.diagnostic_names: set[str] = p.metric_names()
        rotary = rotary_for(p, max(facts.seq_len, p.memory_slots))
        # Construction order (embed, blocks, head) fixes the RNG order: the extensions (prefix, suffix,
        # memory) are built after it, so a cell without them draws the plain looped model's initial weights.
        self.embed = Embedding(p, facts.vocab_size, facts.seq_len)
        self.blocks = nn.ModuleList(Block(p, facts.causal, rotary) for _ in range(p.block_layers))
        self.head = Head(p, facts.vocab_size)
        self.prefix = nn.ModuleList(Block(p, facts.causal, rotary) for _ in range(p.prefix_layers))
        self.suffix = nn.ModuleList(Block(p, facts.causal, rotary) for _ in range(p.suffix_layers))
        self.memory = MemoryTokens(p, p.memory_slots) if p.memory_slots else None
        init_weights(self, p, self.effective_depth)

    def iterate(
        self,
        h: torch.Tensor,
        loops: int | None = None,
        positions: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Prefix layers once, the block `loops` times (default: the trained count), suffix layers once.
        With `kv_cache`, every block application reads and appends its own slot (decoding)."""
        applied = 0

        def update(kind: str) -> KVUpdate | None:
            return kv_cache.slot((kind, applied)).append if kv_cache is not None else None

        for block in self.prefix:
            h = block(h, positions, update("prefix"))
            applied += 1
        trace_step(self, h)
        for _ in range(self.loops if loops is None else loops):
            for block in self.blocks:
                h = block(h, positions, update("loop"))
                applied += 1
            trace_step(self, h)
        for block in self.suffix:
            h = block(h, positions, update("suffix"))
            applied += 1
        return h

    def new_cache(self) -> KVCache:
        return KVCache()

    def kv_bytes_per_token(self, loops: int | None = None, dtype: torch.dtype = torch.float32) -> int:
        """One key/value row per block application: prefix + k * L + suffix rows."""
        applications = self.p.prefix_layers + self.p.block_layers * (loops or self.loops) + self.p.suffix_layers
        return kv_bytes_per_token(applications, self.p.d_model, dtype)

    def forward(
        self,
        tokens: torch.Tensor,
        loops: int | None = None,
        *,
        diagnose: bool = False,
        kv_cache: KVCache | None = None,
    ) -> ModelOutput:
        """`loops` overrides the trained loop count (test-time depth); `diagnose` fills diagnostics;
        `kv_cache` continues the sequence it holds (incremental decoding, without memory tokens)."""
        if loops is not None and loops < 1:
            raise ValueError(f"loops must be >= 1, got {loops}")
        if kv_cache is not None:
            return self._decode(tokens, loops, kv_cache)
        h, positions = self.embed(tokens), None
        if self.memory is not None:
            h, positions = self.memory.prepend(h)
        probe = AttentionMass(self.p.memory_slots) if diagnose and self.memory is not None else None
        with probing(self, probe) if probe is not None else contextlib.nullcontext():
            h = self.iterate(h, loops, positions)
        if self.memory is not None:
            h = self.memory.strip(h)
        out = ModelOutput(logits=self.head(h))
        if probe is not None:
            out.diagnostics.update(probe.result())
        if self.p.regulariser_k is not None:
            term, cosines = block_distance(
                list(self.blocks), self.p.regulariser_k, self.p.regulariser_distance, self.p.regulariser_params
            )
            out.aux["regulariser"] = term
            if diagnose:
                out.diagnostics["block_cos_mean"] = torch.stack(list(cosines.values())).mean().item()
                out.diagnostics.update({f"block_cos_{g}": c.item() for g, c in cosines.items()})
        return out

    def _decode(self, tokens: torch.Tensor, loops: int | None, kv_cache: KVCache) -> ModelOutput:
        if self.memory is not None:
            raise ValueError("incremental decoding is not supported with memory_slots > 0")
        start = kv_cache.length
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        h = self.iterate(self.embed(tokens, start), loops, positions, kv_cache)
        kv_cache.length += tokens.shape[1]
        return ModelOutput(logits=self.head(h))


@register_family("looped", LoopedParams)
def build(params: LoopedParams, facts: TaskFactsLike) -> LoopedTransformer:
    return LoopedTransformer(params, facts)
