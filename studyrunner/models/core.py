"""The shared transformer core: attention, MLP, pre-norm block, embedding and head.

Every family composes these; a paper's mechanism (halting, memory, conditioning, KV sharing) is a
small module around them, never a copy of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator
from torch import nn

from ..params import StrictParams
from .output import aux_metric_names, grad_norm_metric_names
from .representations import representation_names

# A KV cache's update for one attention call (models/kv_cache.py): new keys, values (B, H, t, D) in,
# every key and value to attend to (B, H, S, D) out.
KVUpdate = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class CoreParams(StrictParams):
    """Knobs every family shares."""

    d_model: int = Field(64, ge=8, le=8192, description="Residual stream width.")
    n_heads: int = Field(4, ge=1, le=128, description="Attention heads; must divide d_model.")
    mlp_ratio: int = Field(4, ge=1, le=16, description="MLP hidden width = mlp_ratio * d_model.")
    mlp_hidden: int | None = Field(
        None,
        ge=1,
        le=262144,
        description="MLP hidden width, overriding mlp_ratio; iso-param baselines use it to match parameter counts.",
    )
    pos: Literal["learned", "rope"] = Field(
        "learned", description="Learned absolute positions, or rotary embeddings in every attention layer."
    )
    rope_base: float = Field(10000.0, gt=1, description="RoPE base; the CPU-scale notes used 100 for addition.")
    norm: Literal["layernorm", "rmsnorm", "derf"] = Field(
        "layernorm", description="Pre-norm type; 'derf' is erf(a*x + s) (seed 003, see `Derf`)."
    )
    bias: bool = Field(
        False,
        description="Biases in linears and LayerNorm. Off by default as in nanoGPT: no loss in quality, "
        "fewer parameters, slightly faster.",
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on attention and residual branches.")
    init_std: float = Field(
        0.02,
        gt=0,
        le=1,
        description="Std of the normal init of token/position embeddings (and of linears with linear_init=gpt2).",
    )
    linear_init: Literal["torch", "gpt2"] = Field(
        "torch",
        description="'torch': PyTorch's default (Kaiming-uniform) linears, as in the CPU-scale notes, where "
        "p-hop learned ~2x faster than with 'gpt2': normal(init_std) linears with residual projections "
        "scaled by 1/sqrt(2*depth).",
    )

    # Fields added after studies were run, left out of dumps (so of resolved configs and cell hashes)
    # while at their default: a cell that does not use a new knob keeps its cell_hash and trial keys.
    omit_at_default: ClassVar[frozenset[str]] = frozenset()
    # For each aux term the family can produce, the `model.params` setting that makes it do so: the
    # hint in the error when a study weights a term (train.ponder_lambda, ...) its config lacks.
    aux_term_sources: ClassVar[dict[str, str]] = {}
    # Every parameter group `param_groups()` may name for some config of the family (train.lr_groups may
    # name any of them; a config without the mechanism has no such parameters, and the rate goes unused).
    lr_group_names: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_new_knobs_at_default(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name in self.omit_at_default | {"mlp_hidden"}:
                if name in data and getattr(self, name) == type(self).model_fields[name].default:
                    del data[name]
        return data

    def aux_terms(self) -> set[str]:
        """Names of the raw aux terms (ModelOutput.aux) a model built from these params returns."""
        return set()

    def baseline(self, kind: str) -> tuple[str, dict] | None:
        """The unlooped model matching this looped one (`baselines:` in a study file), as (family,
        params): 'iso_param' keeps the distinct layers and runs them once, 'iso_flop' makes every block
        application a distinct layer. None where there is no loop to match (a family without loops,
        or loops == 1). The compiler widens an iso-param baseline's MLP to match parameter counts."""
        return None

    @property
    def hidden(self) -> int:
        return self.mlp_hidden if self.mlp_hidden is not None else self.mlp_ratio * self.d_model

    def grad_norm_groups(self) -> set[str]:
        """Parameter groups whose gradient norm the trainer records as `{group}_grad_norm`."""
        return set()

    def param_groups(self) -> dict[str, tuple[str, ...]]:
        """Named groups of a model's parameters that `train.lr_groups` can give learning rates of their own:
        group name -> `fnmatch` patterns over parameter names (`model.named_parameters()`). Every other
        parameter is in the group `rest`. A paper's mechanism is a group (MELT's gates, a halting router)."""
        return {}

    def diagnostic_names(self) -> set[str]:
        """Every name the model may put in ModelOutput.diagnostics (at the trained depth)."""
        return set()

    def traced_steps(self) -> int:
        """Loop steps the model hands to `representations.trace_step` at its trained depth (at most):
        the representation diagnostics the evaluator measures are named for these. Default: `loops`."""
        return getattr(self, "loops", 0)

    def supports_decoding(self) -> bool:
        """Whether a model built from these params decodes incrementally with a KV cache (`new_cache()`
        and `forward(tokens, kv_cache=cache)`, models/kv_cache.py). Tasks that ask for a decoding
        evaluation get one only from such models."""
        return False

    def normalised(self, facts: Callable[[], Any]) -> CoreParams:
        """These params as a task with these facts (`facts()`: vocab_size, seq_len, causal; called only where
        needed) makes them: a value that cannot act beyond what the task allows replaced by the one that acts
        the same, so two configs that train identically compile to one cell (the compiler calls this).
        Default: unchanged."""
        return self

    def facts_problem(self, facts: Any) -> str | None:
        """Why a model built from these params cannot serve a task with these facts (vocab_size, seq_len,
        causal), or None; `validate` reports it naming `model.family`."""
        return None

    def metric_names(self) -> set[str]:
        """Every metric this config adds to the trainer's vocabulary: its diagnostics, the evaluator's
        representation diagnostics of its loop steps, the trainer's records of its aux terms and
        gradient groups, and halt_collapsed for a halting model. A built
        model carries this set as its `diagnostic_names` attribute (what a study's metric.name is
        checked against)."""
        names = self.diagnostic_names() | representation_names(self.traced_steps())
        halting = {"halt_collapsed"} if "ponder_steps_fraction" in names else set()
        return names | halting | aux_metric_names(self.aux_terms()) | grad_norm_metric_names(self.grad_norm_groups())

    @model_validator(mode="after")
    def _heads_fit_width(self) -> CoreParams:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        head_dim = self.d_model // self.n_heads
        if self.pos == "rope" and head_dim % 2:
            raise ValueError(f"RoPE needs an even head size; d_model/n_heads = {head_dim}")
        return self


class Derf(nn.Module):
    """Derf, a normalisation-free "norm": y = erf(a * x + s), per feature (Chen et al. 2025; seed 003).

    Read from the seed-003 authors' code (the paper's math was lost): a ~ 1 + N(0, 0.02^2), s = 0, and
    no affine gain/bias after the erf. erf saturates at +-1, so it bounds activations the way a norm
    bounds their scale, without computing statistics over the features."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(1 + 0.02 * torch.randn(dim))
        self.shift = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.erf(self.alpha * x + self.shift)


def make_norm(p: CoreParams) -> nn.Module:
    if p.norm == "rmsnorm":
        return nn.RMSNorm(p.d_model)
    if p.norm == "derf":
        return Derf(p.d_model)
    return nn.LayerNorm(p.d_model, bias=p.bias)


class ResidualProj(nn.Linear):
    """A linear that writes into the residual stream; `init_weights` shrinks it with depth.

    A class rather than a naming convention, so a new family's branches (memory reads, ...) opt in
    explicitly and wrapping a block cannot silently lose the scaling."""


class Rotary(nn.Module):
    """Rotary position embedding (per head, rotate-half form) with cos/sin cached up to `max_len`.

    One instance is shared by every attention layer; its caches are non-persistent buffers, so they
    follow `.to()` but stay out of state dicts and parameter counts."""

    def __init__(self, head_dim: int, max_len: int, base: float):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", torch.cat([angles.cos()] * 2, dim=-1), persistent=False)
        self.register_buffer("sin", torch.cat([angles.sin()] * 2, dim=-1), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, ..., D), time on dim 1 as the qkv projection lays it out: q and k rotate in one pass.

        `positions` (T,) gives each token's index; default 0..T-1. A memory-token prefix numbers its
        slots 0..M-1 and the sequence 0..T-1 independently (seed 003)."""
        shape = (x.shape[1],) + (1,) * (x.dim() - 3) + (x.shape[-1],)
        if positions is None:
            cos, sin = self.cos[: x.shape[1]].view(shape), self.sin[: x.shape[1]].view(shape)
        else:
            cos, sin = self.cos[positions].view(shape), self.sin[positions].view(shape)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """Multi-head self-attention, causal or bidirectional, through `scaled_dot_product_attention`."""

    def __init__(self, p: CoreParams, causal: bool, rotary: Rotary | None):
        super().__init__()
        self.n_heads, self.causal, self.dropout = p.n_heads, causal, p.dropout
        self.qkv = nn.Linear(p.d_model, 3 * p.d_model, bias=p.bias)  # one matmul instead of three
        self.proj = ResidualProj(p.d_model, p.d_model, bias=p.bias)
        self.rotary = rotary
        # Diagnostics hook: called with the (B, H, T, D) queries and keys when set (evaluation only;
        # the fused kernel does not return attention weights, so a probe recomputes what it needs).
        self.probe: Callable[[torch.Tensor, torch.Tensor, bool], None] | None = None
        # Seeds trained together (train/vectorized.py) run the model under torch.func.vmap, where the
        # fused CPU kernel has no batching rule (a slow per-example fallback): there `explicit` is set
        # and attention is written out as matmuls and a softmax (`explicit_attention`). Off (the
        # default) everywhere else, so every other path computes exactly what it did.
        self.explicit = False

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        kv_cache: KVUpdate | None = None,
        kv_source: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Self-attention over x; with `kv_cache` or `kv_source`, incremental attention (`attend_cached`).

        Without either (every family's training forward) this is the original computation, unchanged."""
        if kv_cache is not None or kv_source is not None:
            return self.attend_cached(x, positions, kv_cache, kv_source)
        b, t, d = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads)
        if self.rotary is not None:
            qk, v = self.rotary(qkv[:, :, :2], positions), qkv[:, :, 2]
            q, k = qk.unbind(2)
        else:
            q, k, v = qkv.unbind(2)
        if self.probe is not None:
            self.probe(q.transpose(1, 2), k.transpose(1, 2), self.causal)
        if self.explicit:
            dropout = self.dropout if self.training else 0.0
            y = explicit_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.causal, dropout)
            return self.proj(y.transpose(1, 2).reshape(b, t, d))
        # Strided (B, H, T, D) views, no copies: the CPU flash kernel takes them as they are.
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=self.causal,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.proj(y.transpose(1, 2).reshape(b, t, d))

    def project_kv(
        self, source: torch.Tensor, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, H, T, D) of `source` (B, T, d) through this layer's W_K, W_V (and RoPE at
        `positions`): what a KV cache stores for those tokens."""
        b, t, d = source.shape
        weight, bias = self.qkv.weight[d:], (self.qkv.bias[d:] if self.qkv.bias is not None else None)
        kv = F.linear(source, weight, bias).view(b, t, 2, self.n_heads, d // self.n_heads)
        k, v = kv.unbind(2)
        if self.rotary is not None:  # under autocast the rotation promotes k to float32: keep v's dtype
            k = self.rotary(k, positions).to(v.dtype)
        return k.transpose(1, 2), v.transpose(1, 2)

    def attend_cached(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None,
        kv_cache: KVUpdate | None,
        kv_source: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of the t tokens in x (the newest of the sequence) over every key the cache holds.

        Queries come from x; keys and values from `kv_source` when given (MELT's gated latent state),
        else from x. `kv_cache(k, v)` receives the new tokens' keys and values (B, H, t, D) and returns
        all keys and values to attend to (B, H, S, D), the new tokens' last: it appends them (a standard
        cache), overwrites the rows it appended at an earlier loop (MELT), or mixes two caches. Without a
        cache the new keys are the only ones. `positions` (t,) are the new tokens' indices in the sequence.
        """
        b, t, d = x.shape
        head = d // self.n_heads
        bias = self.qkv.bias[:d] if self.qkv.bias is not None else None
        q = F.linear(x, self.qkv.weight[:d], bias).view(b, t, self.n_heads, head)
        if self.rotary is not None:
            q = self.rotary(q, positions)
        k, v = self.project_kv(x if kv_source is None else kv_source, positions)
        keys, values = kv_cache(k, v) if kv_cache is not None else (k, v)
        offset = keys.shape[2] - t  # keys of earlier tokens come first
        mask = None
        if self.causal and t > 1:  # query i sees keys 0..offset+i; a lone newest token sees them all
            rows = torch.arange(t, device=x.device)[:, None] + offset
            mask = torch.arange(keys.shape[2], device=x.device)[None, :] <= rows
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


def explicit_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, dropout: float = 0.0
) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + causal mask) v on (B, H, T, D) tensors: what
    `scaled_dot_product_attention` computes (up to float rounding), in ops torch.func.vmap batches."""
    scores = torch.matmul(q * (1.0 / math.sqrt(q.shape[-1])), k.transpose(-2, -1))
    if causal:
        t = q.shape[-2]
        scores = scores.masked_fill_(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    weights = scores.softmax(-1)
    if dropout:
        weights = F.dropout(weights, dropout)
    return torch.matmul(weights, v)


class MLP(nn.Module):
    def __init__(self, p: CoreParams):
        super().__init__()
        self.fc = nn.Linear(p.d_model, p.hidden, bias=p.bias)
        self.proj = ResidualProj(p.hidden, p.d_model, bias=p.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, p: CoreParams, causal: bool, rotary: Rotary | None = None):
        super().__init__()
        self.norm1, self.attn = make_norm(p), Attention(p, causal, rotary)
        self.norm2, self.mlp = make_norm(p), MLP(p)
        self.drop = nn.Dropout(p.dropout)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, kv_cache: KVUpdate | None = None
    ) -> torch.Tensor:
        """`kv_cache`: incremental decoding, x being the newest tokens (see `Attention.attend_cached`)."""
        x = x + self.drop(self.attn(self.norm1(x), positions, kv_cache))
        return x + self.drop(self.mlp(self.norm2(x)))


class Embedding(nn.Module):
    """Token embedding plus learned absolute positions (when pos == 'learned')."""

    def __init__(self, p: CoreParams, vocab_size: int, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.tokens = nn.Embedding(vocab_size, p.d_model)
        self.positions = nn.Embedding(max_len, p.d_model) if p.pos == "learned" else None
        self.drop = nn.Dropout(p.dropout)

    def forward(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """`start`: the position of the first token (incremental decoding feeds a sequence piecewise)."""
        t = tokens.shape[1]
        if start + t > self.max_len:
            raise ValueError(f"sequence of {start + t} tokens exceeds the model's max length {self.max_len}")
        h = self.tokens(tokens)
        if self.positions is not None:
            h = h + (self.positions.weight[:t] if start == 0 else self.positions.weight[start : start + t])
        return self.drop(h)


class Head(nn.Module):
    """Final norm and a projection to the vocabulary, untied from the token embedding."""

    def __init__(self, p: CoreParams, vocab_size: int):
        super().__init__()
        self.norm = make_norm(p)
        self.out = nn.Linear(p.d_model, vocab_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(h))


def rotary_for(p: CoreParams, max_len: int) -> Rotary | None:
    return Rotary(p.d_model // p.n_heads, max_len, p.rope_base) if p.pos == "rope" else None


def init_weights(model: nn.Module, p: CoreParams, depth: int) -> None:
    """Initialise a model built from the core; `depth` is the number of block applications (k*L).

    Embeddings ~ normal(0, init_std) always: nn.Embedding's default std of 1 swamps learned positions,
    which decided whether tasks learned at all in the CPU-scale notes. Linears keep PyTorch's default
    init (`linear_init: torch`, the notes' setting; at d_model=64 its std is ~0.07, and p-hop learned
    about twice as fast as with GPT-2 init here), or with `linear_init: gpt2` are normal(0, init_std),
    biases zero, `ResidualProj` weights further scaled by 1/sqrt(2*depth) so the residual stream's
    variance does not grow with depth.

    Mechanism modules whose paper prescribes an init (halting routers, memory gates: zero weights and
    a set bias) define `init_mechanism()`; it runs last, so neither rule above overrides it."""
    std = p.init_std
    residual_std = std / math.sqrt(2 * depth)
    for module in model.modules():
        if isinstance(module, nn.Linear) and p.linear_init == "gpt2":
            nn.init.normal_(module.weight, 0.0, residual_std if isinstance(module, ResidualProj) else std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, std)
    for module in model.modules():
        if hasattr(module, "init_mechanism"):
            module.init_mechanism()
