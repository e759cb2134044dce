"""Family `melt`: the Memory-Efficient Looped Transformer (seed 001, Conchello Vendrell et al.).

A LoopLM (looplm.py: N distinct layers looped T times) whose layers keep ONE key/value row per token,
shared by all loops. Each layer l carries a gated latent state per token (Eq. 1):

    z_t = sigmoid(u_t W_z + h_{t-1} U_z + b_z),   h_t = z_t * h_{t-1} + (1 - z_t) * u_t,
    k_t = h_t W_K,  v_t = h_t W_V,   q_t = u_t W_Q,

and attention at loop t sees the earlier tokens' FINAL keys and values (after all their loops) plus the
token's own current ones. A token's row is appended at its first loop and overwritten at every later
loop (in place when decoding), so the cache is L * N * 2 * d * bytes whatever T (models/kv_cache.py).

Readings taken where the paper is silent (seed_001_melt.md, section 1.6), each with its option:
- u_t is the layer's pre-norm input norm1(x_t) (this core is pre-norm; the paper's x_t^(l) is written
  without norms), so K/V come from the same normalised input a LoopLM layer projects and `gate: last`
  is exactly the LoopLM keys and values of the last loop.
- q comes from u_t (the paper does not say), and RoPE rotates q and k = h W_K at the token's position.
- h_0: `h0: input` (default) starts the latent at the first loop's input, h_1 = u_1, so the first loop
  is the LoopLM's first loop and a 1-loop MELT equals a 1-loop LoopLM; `h0: zeros` gates from
  h_0 = 0 (h_1 = (1 - z_1) u_1).
- The gate bias starts at `gate_bias_init` = logit(0.2) = -1.386 (the notes' suggestion: trained gates
  average ~0.2; the paper only says "initialized randomly"); W_z, U_z have the core's linear init.
- Gate variants (Table 3): `elementwise` (Eq. 1), `scalar` (one gate per token: W_z, U_z in R^{d x 1},
  the paper gives no shapes), `mean` (the average of the loop states so far, z = (t-1)/t), `ema`
  (z fixed at `ema_decay`, 0.2), `last` (z = 0: the final loop's state only).
- What the next loop reads (`loop_input`), inherited from LoopLM (looplm.py): `normed` (default, Ouro's
  model file, which MELT is converted from) = the previous loop's final-normed state; `residual` = the
  un-normed residual stream. Either way a converted MELT at alpha = 0 is its teacher exactly.

Chunk-wise training (section 3.3): a sequence is processed in chunks of `chunk_size` tokens, in order;
within a chunk all tokens run in parallel, attending at loop t to the earlier chunks' final rows and to
the chunk's own loop-t rows (causally); after the chunk's last loop its rows are final. `chunk_size: 1`
(the default) is exact token-serial (autoregressive) inference, so training sees what decoding does;
larger chunks are faster, one token at a time being ~T x N small sequential steps per token (measured
here: character LM at 64 characters, chunk 8 reached 2.81 bits per character teacher-forced but 3.85
decoded); a chunk as long as the sequence is the "fully parallel" training the paper reports as
collapsing. Gradients flow through earlier chunks' rows
(`chunk_grad: through`; `detached` stops them, the paper does not say). Training and decoding are the
same code: `forward(tokens, kv_cache=cache)` continues a sequence, chunk by chunk.

Conversion from a finished `looplm` trial (`teacher:` names its trial key; the orchestrator resolves
it to the trial's config and final checkpoint and `run_trial` attaches it, `convert_from`): the
student starts from the teacher's weights (gates new); the two phases of section 3.3, each switchable:
- interpolated transition: attention uses alpha * KV_MELT + (1 - alpha) * KV_base (per-loop LoopLM keys
  and values), alpha rising linearly from 0 to 1 over `interpolate_steps` (0 = direct switch);
- distillation at every loop (aux term `distill`: the mean over loops of a divergence between the
  teacher's and the student's logits of that loop, weighted by `train.distill_lambda`) and attention
  alignment (aux term `attn_align`, mean squared difference of each (layer, loop) attention output from
  the frozen teacher's, weighted by `train.align_beta` from `train.align_start_step`: the paper's phase 2
  with beta 0.1).
The objectives are the paper's (Table 6; `train.task_loss: unless_distilled`, the default): phase 1 is the
distillation alone, phase 2 the distillation plus beta times the alignment; the task cross-entropy is no
part of either, and trains only the ablation that removes the distillation ("reducing training to standard
SFT"). `train.task_loss: always` adds it to both. The divergence (`train.distill_divergence`): the paper
says GKD, trained with TRL, so by default the generalised JSD with TRL's beta 0.5 at temperature 1
(models/distillation.py); forward and reverse KL are the alternatives. The paper's gates learn at 5e-4 and
everything else at 8e-6: `train.lr_groups: {gates: 5.0e-4, rest: 8.0e-6}` (group `gates`).
Not done: GKD's on-policy half (the student's own samples scored by the teacher; TRL's lmbda, 0.5 by
default, unstated in the paper): distillation here is on the task's sequences only (the docs say why).
The reduction of the alignment norm (a mean over tokens and features) is not in the paper.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from .core import Block, CoreParams, Embedding, Head, KVUpdate, init_weights, rotary_for
from .distillation import divergence
from .kv_cache import KVCache, KVSlot, kv_bytes_per_token
from .looplm import LoopLM
from .output import ModelOutput
from .registry import TaskFactsLike, register_family
from .representations import trace_step

GATE_BIAS_LOGIT_02 = math.log(0.2 / 0.8)
LEARNED_GATES = ("elementwise", "scalar")
SATURATED = 0.05  # a gate value below this or above 1 - this counts as saturated
TRIAL_KEY = r"^[a-z0-9_-]+-[0-9a-f]{12}-s[0-9]+$"


class MeltParams(CoreParams):
    block_layers: int = Field(1, ge=1, le=256, description="N: distinct layers of the stack that loops.")
    loops: int = Field(4, ge=1, le=1024, description="T: times the whole stack runs (the paper: 4).")
    gate: Literal["elementwise", "scalar", "mean", "ema", "last"] = Field(
        "elementwise",
        description="Latent update: elementwise (Eq. 1), scalar (one gate per token), mean (average of the "
        "loop states), ema (gate fixed at ema_decay), last (the last loop's state).",
    )
    gate_bias_init: float = Field(
        GATE_BIAS_LOGIT_02,
        ge=-30,
        le=30,
        description="Initial gate bias b_z (elementwise and scalar gates); logit(0.2) = -1.386 starts the "
        "gates near the paper's trained mean of 0.2.",
    )
    ema_decay: float = Field(0.2, gt=0, lt=1, description="z of the `ema` gate (the paper's EMA-0.2).")
    h0: Literal["input", "zeros"] = Field(
        "input", description="Latent start: input (h_1 = the first loop's input) or zeros (h_0 = 0, gated)."
    )
    chunk_size: int = Field(
        1,
        ge=1,
        le=1_048_576,
        description="Tokens processed in parallel (chunk-wise training and evaluation): 1 (default) = exact "
        "token-serial inference; larger trades fidelity for speed (the paper: 500 of 10K tokens); the sequence "
        "length = fully parallel (a larger value is clipped to it when the study compiles).",
    )
    loop_input: Literal["normed", "residual"] = Field(
        "normed",
        description="What each loop after the first reads, as in looplm: normed (default, Ouro's model file) = "
        "the previous loop's final-normed state; residual = the un-normed residual stream.",
    )
    chunk_grad: Literal["through", "detached"] = Field(
        "through", description="Whether gradients flow into earlier chunks through their cached rows."
    )
    interpolate_steps: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="Interpolated transition: alpha rises from 0 to 1 over these training steps (0 = MELT "
        "from the start); must be shorter than train.steps.",
    )
    teacher: str | None = Field(
        None,
        pattern=TRIAL_KEY,
        description="Trial key of a finished `looplm` trial (any study of the ledger): the student starts from "
        "its weights and distils from it (aux terms distill, attn_align).",
    )

    aux_term_sources = {"distill": "model.params.teacher", "attn_align": "model.params.teacher"}

    @model_validator(mode="after")
    def _knobs_have_effect(self) -> MeltParams:
        defaults = type(self).model_fields
        if self.gate not in LEARNED_GATES and self.gate_bias_init != defaults["gate_bias_init"].default:
            raise ValueError(f"gate_bias_init has no effect with gate {self.gate!r} (only elementwise, scalar)")
        if self.gate != "ema" and self.ema_decay != defaults["ema_decay"].default:
            raise ValueError(f"ema_decay has no effect with gate {self.gate!r} (only ema)")
        return self

    def aux_terms(self) -> set[str]:
        return {"distill", "attn_align"} if self.teacher is not None else set()

    lr_group_names = ("gates",)

    def param_groups(self) -> dict[str, tuple[str, ...]]:
        """`gates`: W_z, U_z, b_z of every layer (Table 6 trains them at 5e-4, the rest at 8e-6)."""
        return {"gates": ("gates.*",)} if self.gate in LEARNED_GATES else {}

    def gated_steps(self) -> range:
        """1-based loop steps at which the gate acts (not the first with h0: input)."""
        return range(2 if self.h0 == "input" else 1, self.loops + 1)

    def diagnostic_names(self) -> set[str]:
        names: set[str] = set()
        if self.gate in LEARNED_GATES:
            for t in self.gated_steps():
                names |= {f"gate_mean_step_{t}", f"gate_std_step_{t}", f"gate_saturated_step_{t}"}
            if len(self.gated_steps()):
                names.add("gate_mean")
        if self.interpolate_steps:
            names.add("interp_alpha")
        return names

    def supports_decoding(self) -> bool:
        return True

    def normalised(self, facts: Callable[[], Any]) -> MeltParams:
        """`chunk_size` clipped to the task's sequence length (`facts().seq_len`, the longest input of any split):
        a chunk longer than every sequence processes each in one chunk, exactly as a chunk of its length does,
        so `chunk_size: 64` and `chunk_size: 128` on 32-token sequences are one cell, not two that train
        identically. Clipped rather than warned about: the resolved config then says what runs (and the cell's
        hash is the fully parallel cell's), a grid listing both values is refused as any two values resolving to
        one config are, a search's suggestions past the length reuse that cell's trials instead of training it
        again, and analysis never shows two "different" chunk sizes that are one. A study that ran such a cell
        before this rule compiles it to a new hash: `submit` refuses the edit (`--as-new-study NAME`)."""
        seq_len = facts().seq_len
        return self.model_copy(update={"chunk_size": seq_len}) if self.chunk_size > seq_len else self

    def facts_problem(self, facts: Any) -> str | None:
        if not facts.causal:
            return (
                "family melt is a decoder (a token's keys and values depend on the tokens before it); "
                "this task is bidirectional"
            )
        return None

    def baseline(self, kind: str) -> tuple[str, dict] | None:
        """iso_param: the N layers run once (`looped` N x 1, MLP widened to the gates' parameters);
        iso_flop: N * T distinct layers run once."""
        if self.loops == 1:
            return None
        core = {name: getattr(self, name) for name in CoreParams.model_fields}
        layers = self.block_layers if kind == "iso_param" else self.block_layers * self.loops
        return "looped", {**core, "block_layers": layers, "loops": 1}


class LatentGate(nn.Module):
    """One layer's latent update h_t = z * h_{t-1} + (1 - z) * u_t, for every gate variant."""

    def __init__(self, p: MeltParams):
        super().__init__()
        self.variant, self.bias_init, self.ema_decay = p.gate, p.gate_bias_init, p.ema_decay
        width = p.d_model if p.gate == "elementwise" else 1
        if p.gate in LEARNED_GATES:
            self.w = nn.Linear(p.d_model, width)  # W_z and b_z
            self.u = nn.Linear(p.d_model, width, bias=False)  # U_z
        self.init_mechanism()

    def init_mechanism(self) -> None:  # called again by core.init_weights, after the generic init
        if self.variant in LEARNED_GATES:
            nn.init.constant_(self.w.bias, self.bias_init)

    def forward(self, u: torch.Tensor, h: torch.Tensor, earlier: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The next latent from input u and latent h, which averages `earlier` loop states (for `mean`);
        also the gate (B, t, width) when it is learned."""
        if self.variant in LEARNED_GATES:
            z = torch.sigmoid(self.w(u) + self.u(h))
            return z * h + (1 - z) * u, z
        if self.variant == "mean":
            z_const = earlier / (earlier + 1)
        elif self.variant == "ema":
            z_const = self.ema_decay
        else:  # last
            return u, None
        return z_const * h + (1 - z_const) * u, None


class _Trace:
    """What one forward collects across chunks: gate statistics per loop step, and for distillation
    each loop's output state and each (loop, layer) attention output."""

    def __init__(self, loops: int, layers: int, gates: bool, teacher: bool):
        self.gates: dict[int, list[torch.Tensor]] | None = {} if gates else None  # 1-based step -> z values
        self.teacher = teacher
        self.states: list[list[torch.Tensor]] = [[] for _ in range(loops)]
        self.attn: list[list[torch.Tensor]] = [[] for _ in range(loops * layers)]

    def gate(self, step: int, z: torch.Tensor | None) -> None:
        if self.gates is not None and z is not None:
            self.gates.setdefault(step, []).append(z.detach().flatten())


class Melt(nn.Module):
    def __init__(self, p: MeltParams, facts: TaskFactsLike):
        super().__init__()
        if problem := p.facts_problem(facts):
            raise ValueError(problem)
        self.p = p
        self.loops = p.loops
        self.effective_depth: int = p.block_layers * p.loops
        self.diagnostic_names: set[str] = p.metric_names()
        self.rotary = rotary_for(p, facts.seq_len)
        # Parameter names as in looplm.py (embed, blocks, head), so a LoopLM's weights load by name.
        self.embed = Embedding(p, facts.vocab_size, facts.seq_len)
        self.blocks = nn.ModuleList(Block(p, facts.causal, self.rotary) for _ in range(p.block_layers))
        self.head = Head(p, facts.vocab_size)
        self.gates = nn.ModuleList(LatentGate(p) for _ in range(p.block_layers))
        init_weights(self, p, self.effective_depth)
        self.alpha = 0.0 if p.interpolate_steps else 1.0  # interpolated transition (set_train_step)
        self._teacher: list[nn.Module] = []  # a plain list: the frozen teacher is no submodule or parameter
        self.configure({}, {})  # the paper's distillation until the trainer passes the study's train section

    # ------------------------------------------------------------------------------ training hooks

    def set_train_step(self, step: int) -> None:
        """Called by the trainer before each training step (0-based): the interpolation's alpha."""
        if self.p.interpolate_steps:
            self.alpha = min(1.0, step / self.p.interpolate_steps)

    def convert_from(self, teacher: nn.Module) -> None:
        """Start from a trained LoopLM's weights (the gates stay as initialised) and keep it, frozen, as
        the teacher of the distillation terms."""
        if not isinstance(teacher, LoopLM) or teacher.loops != self.loops:
            raise ValueError(f"a melt student needs a looplm teacher with loops = {self.loops}")
        if teacher.p.loop_input != self.p.loop_input:
            raise ValueError(
                f"the teacher's loop_input is {teacher.p.loop_input!r}, this student's {self.p.loop_input!r}: "
                "they must read the same state between loops"
            )
        state = {k: v for k, v in teacher.state_dict().items() if not k.startswith("exit_gate.")}
        missing, unexpected = self.load_state_dict(state, strict=False)
        if unexpected or any(not k.startswith("gates.") for k in missing):
            raise ValueError(f"the teacher's weights do not fit (missing {missing}, unexpected {unexpected})")
        teacher.eval()
        teacher.requires_grad_(False)
        self._teacher = [teacher]

    # ------------------------------------------------------------------------------------ decoding

    def new_cache(self) -> KVCache:
        return KVCache()

    def kv_bytes_per_token(self, loops: int | None = None, dtype: torch.dtype = torch.float32) -> int:
        """N rows of keys and values per token, whatever the loops."""
        return kv_bytes_per_token(self.p.block_layers, self.p.d_model, dtype)

    # ------------------------------------------------------------------------------------- forward

    def forward(
        self,
        tokens: torch.Tensor,
        loops: int | None = None,
        *,
        diagnose: bool = False,
        kv_cache: KVCache | None = None,
    ) -> ModelOutput:
        """Chunk-wise over `tokens`, continuing the sequence `kv_cache` holds (a fresh one if None)."""
        steps = self.loops if loops is None else loops
        if steps < 1:
            raise ValueError(f"loops must be >= 1, got {steps}")
        cache = kv_cache if kv_cache is not None else KVCache()
        teacher = self._teacher[0] if self._teacher and self.training else None
        trace = _Trace(steps, len(self.blocks), diagnose and self.p.gate in LEARNED_GATES, teacher is not None)
        x_all = self.embed(tokens, cache.length)
        outputs = []
        # the state of every token at each loop boundary, gathered over chunks for the representation trace
        per_step = [[] for _ in range(steps + 1)] if getattr(self, "step_trace", None) is not None else None
        for begin in range(0, tokens.shape[1], self.p.chunk_size):
            x = x_all[:, begin : begin + self.p.chunk_size]
            positions = None
            if self.rotary is not None:
                positions = torch.arange(cache.length, cache.length + x.shape[1], device=tokens.device)
            outputs.append(self._chunk(x, positions, cache, steps, trace, per_step))
            cache.length += x.shape[1]
        for states in per_step or []:
            trace_step(self, torch.cat(states, dim=1))
        out = ModelOutput(logits=self.head(torch.cat(outputs, dim=1)))
        if teacher is not None:
            out.aux.update(self._distillation(teacher, tokens, trace, steps))
        if diagnose:
            out.diagnostics.update(self._diagnostics(trace))
        return out

    def _chunk(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None,
        cache: KVCache,
        steps: int,
        trace: _Trace,
        per_step: list[list[torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        latents: list[torch.Tensor | None] = [None] * len(self.blocks)
        if per_step is not None:
            per_step[0].append(x)
        for step in range(steps):
            for layer, (block, gate) in enumerate(zip(self.blocks, self.gates, strict=True)):
                u = block.norm1(x)
                if step == 0 and self.p.h0 == "input":
                    h = u
                else:
                    previous = latents[layer] if latents[layer] is not None else torch.zeros_like(u)
                    h, z = gate(u, previous, step)
                    trace.gate(step + 1, z)
                latents[layer] = h
                slot = cache.slot(layer)
                update: KVUpdate = slot.append if step == 0 else slot.replace_tail
                if self.alpha < 1:
                    update = _interpolated(update, cache.slot(("base", step, layer)), block, u, positions, self.alpha)
                o = block.attn(u, positions, update, kv_source=h)
                if trace.teacher:
                    trace.attn[step * len(self.blocks) + layer].append(o)
                x = x + block.drop(o)
                x = x + block.drop(block.mlp(block.norm2(x)))
            if trace.teacher:
                trace.states[step].append(x)
            if per_step is not None:
                per_step[step + 1].append(x)
            if self.p.loop_input == "normed" and step < steps - 1:  # the last loop's state goes to the head
                x = self.head.norm(x)
        if self.p.chunk_grad == "detached":
            for layer in range(len(self.blocks)):
                cache.slot(layer).detach_()
        return x

    def configure(self, train: dict[str, Any], evaluation: dict[str, Any]) -> None:
        """Read the distillation's divergence, its beta and temperature (train.distill_*; the trainer calls
        this once, before training): unset, the paper's reading (study/train_section.py DISTILL_DEFAULTS)."""
        self.distill = {
            "kind": train.get("distill_divergence") or "jsd",
            "beta": train.get("distill_jsd_beta") or 0.5,
            "temperature": train.get("distill_temperature") or 1.0,
        }

    def _distillation(self, teacher: nn.Module, tokens: torch.Tensor, trace: _Trace, steps: int) -> dict:
        teacher_logits, teacher_attn = teacher.trace(tokens, steps)
        kd = [
            divergence(self.head(torch.cat(states, dim=1)), target, **self.distill)
            for states, target in zip(trace.states, teacher_logits, strict=True)
        ]
        align = [
            F.mse_loss(torch.cat(mine, dim=1), theirs) for mine, theirs in zip(trace.attn, teacher_attn, strict=True)
        ]
        return {"distill": torch.stack(kd).mean(), "attn_align": torch.stack(align).mean()}

    def _diagnostics(self, trace: _Trace) -> dict[str, float]:
        out: dict[str, float] = {}
        if trace.gates is not None:
            every = []
            for step in self.p.gated_steps():
                if step not in trace.gates:
                    continue
                z = torch.cat(trace.gates[step])
                every.append(z)
                out[f"gate_mean_step_{step}"] = z.mean().item()
                out[f"gate_std_step_{step}"] = z.std(correction=0).item()
                out[f"gate_saturated_step_{step}"] = ((z < SATURATED) | (z > 1 - SATURATED)).float().mean().item()
            if every:
                out["gate_mean"] = torch.cat(every).mean().item()
        if self.p.interpolate_steps:
            out["interp_alpha"] = self.alpha
        return out


def _interpolated(
    update: KVUpdate, base: KVSlot, block: Block, u: torch.Tensor, positions: torch.Tensor | None, alpha: float
) -> KVUpdate:
    """The interpolated transition's keys and values: alpha * MELT's + (1 - alpha) * the LoopLM's (the
    loop's own keys and values of every token, kept in a per-(loop, layer) slot)."""

    def mixed(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = update(k, v)
        base_keys, base_values = base.append(*block.attn.project_kv(u, positions))
        return alpha * keys + (1 - alpha) * base_keys, alpha * values + (1 - alpha) * base_values

    return mixed


@register_family("melt", MeltParams)
def build(params: MeltParams, facts: TaskFactsLike) -> Melt:
    return Melt(params, facts)
