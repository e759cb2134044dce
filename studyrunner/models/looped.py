"""Family `looped`: k distinct blocks applied L times (k x L), Saunshi et al. (seed 002).

The embedding and head run once; only the block stack repeats. The input is not re-injected between
loops: the paper's definition is Output o Block^L o Embed and says nothing of re-injection.
k x 1 and kL x 1 are the same family with other values, so iso-param and iso-FLOP baselines are
ordinary cells of a study.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from .core import Block, CoreParams, Embedding, Head, init_weights, rotary_for
from .output import ModelOutput
from .registry import TaskFactsLike, register_family


class LoopedParams(CoreParams):
    block_layers: int = Field(1, ge=1, le=256, description="k: distinct layers in the looped block.")
    loops: int = Field(1, ge=1, le=1024, description="L: times the block is applied.")


class LoopedTransformer(nn.Module):
    def __init__(self, p: LoopedParams, facts: TaskFactsLike):
        super().__init__()
        self.loops = p.loops
        self.effective_depth: int = p.block_layers * p.loops
        rotary = rotary_for(p, facts.seq_len)
        self.embed = Embedding(p, facts.vocab_size, facts.seq_len)
        self.blocks = nn.ModuleList(Block(p, facts.causal, rotary) for _ in range(p.block_layers))
        self.head = Head(p, facts.vocab_size)
        init_weights(self, p, self.effective_depth)

    def iterate(self, h: torch.Tensor) -> torch.Tensor:
        """The loop, kept separate so families with halting or memory can wrap or replace it."""
        for _ in range(self.loops):
            for block in self.blocks:
                h = block(h)
        return h

    def forward(self, tokens: torch.Tensor) -> ModelOutput:
        logits = self.head(self.iterate(self.embed(tokens)))
        return ModelOutput(logits=logits, aux_loss=logits.new_zeros(()), diagnostics={})


@register_family("looped", LoopedParams)
def build(params: LoopedParams, facts: TaskFactsLike) -> LoopedTransformer:
    return LoopedTransformer(params, facts)
