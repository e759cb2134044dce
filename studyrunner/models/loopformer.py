"""Family `loopformer`: a looped block conditioned on loop time, trained for every budget at once
(Jeddi, Ciccone, Taati, "LoopFormer", seed 004; official code `armenjeddi/loopformer`).

k distinct blocks (`block_layers`) run once per loop step; `loops` (L) steps at full depth. Step i
of a trajectory Δ_1..Δ_M (sum 1) is conditioned on c = φ_t(t_{i-1}) + φ_Δ(Δ_i) (conditioning.py),
and each block turns c into AdaLN-Zero gates and scales (no shift), zero-initialised so the block
starts as the identity. `conditioning` picks the paper's three models:
- `time_step`: LoopFormer, (t, Δ) as above;
- `loop_index`: TMLT (Xu & Sato), the integer step index through one Fourier embedder (official code);
- `none`: Base-Loop (Saunshi et al.), the core's plain pre-norm blocks, no modulator;
- `constant`: LoopFormer's own AdaLN-Zero blocks with a conditioning that carries nothing (each block's
  gates and scales are learned constants, zero at the start): the baseline that differs from LoopFormer in
  the loop-time information only. With `loops: 1` it is the non-looped Base of the same blocks, which is
  what `baselines:` gives a LoopFormer cell (the plain `looped` k x 1 differs in the block as well).

`objective` (training only; evaluation always runs one trajectory):
- `fixed`: the task loss of the full trajectory (`train.trajectory`, uniform 1/L by default);
- `early_exit`: plus the task loss of an exit after S ~ U{1..L-1} steps of that same run
  (Naive-Loop-EE), returned as aux term `shortcut` (weight `train.shortcut_lambda`, 0.1);
- `early_exit_consistency`: plus ||sg(h_L) - h_S||^2 as aux term `consistency` (weight
  `train.consistency_lambda`, 0.1): Base-Loop-EE-Cons / TMLT-EE;
- `shortcut_consistency`: LoopFormer (Alg. 1): the short run is a separate, complete trajectory of
  S steps summing to 1 drawn by `shortcut_sampler` (trajectories.py), with both extra terms.
The short run's loss needs the task's targets, so the model returns its logits in
`ModelOutput.aux_logits["shortcut"]` and the trainer scores them with the task loss.

Budgets: `forward(tokens, loops=M)` runs exactly M steps: the uniform trajectory 1/M (the paper's
Alg. 2) for `fixed` and `shortcut_consistency`; for the early-exit objectives, an exit after M steps
of the trained trajectory (continued at its last step size beyond L), which is what they trained for.
`forward(tokens, trajectory=[...])` runs any trajectory (eval.trajectory, `enumerate_all`).

Readings where the paper is unclear (notes: seed_004_loopformer.md), each with its alternative:
- consistency target: the final hidden state (Alg. 1 and the official code), `consistency_target:
  logits` for §3.3's "per-token logits"; taken after the final norm, as the code does (its forward
  returns the normed state), with a mean over elements (`F.mse_loss`, the code's);
- the shortcut sampler: the official code's `sample_short_trajectory` by default (`grid_sequential`:
  each step in turn uniform on the 1/L grid within what the remaining steps leave), which is what
  §4.4's trajectories were trained with; it favours front-loaded shortcuts (at L = 8, S = 4:
  P(5,1,1,1) = 0.2, P(first step >= 4/8) = 0.4). `grid_composition` (uniform over the C(L-1, S-1)
  compositions: 1/35 and 4/35 there; the notes' reading of the paper's "uniform discrete step
  schedule", and this family's default before) and `dirichlet` (continuous steps) are the alternatives;
- the early-exit baselines' short run: an exit of the full run (no recompute; identical values and
  gradients to the official code's second forward of S steps, at no extra block applications);
- the modulator's init: zero (see conditioning.py for why the official code's is not).
Departures from the paper, from the shared core: untied input and output embeddings, the core's GELU
MLP width (`mlp_ratio`), and learned or rotary positions as the core offers.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from .conditioning import FourierEmbedder, ModulatedBlock
from .core import Block, CoreParams, Embedding, Head, init_weights, rotary_for
from .output import ModelOutput
from .registry import TaskFactsLike, register_family
from .representations import trace_step
from .trajectories import (
    ENUMERATE_ALL,
    SAMPLERS,
    SUM_TOLERANCE,
    sample_shortcut,
    schedule,
    schedule_length,
    start_times,
)

EARLY_EXIT = ("early_exit", "early_exit_consistency")
CONSISTENCY = ("early_exit_consistency", "shortcut_consistency")


class LoopFormerParams(CoreParams):
    norm: Literal["layernorm", "rmsnorm", "derf"] = Field(
        "rmsnorm", description="Norm kind; the paper's RMSNorm (without a learned gain inside modulated blocks)."
    )
    block_layers: int = Field(1, ge=1, le=256, description="k: distinct blocks run once per loop step (paper: 3).")
    loops: int = Field(
        8, ge=1, le=1024, description="L: steps of the full trajectory; the training grid is 1/L (paper: 8)."
    )
    conditioning: Literal["none", "constant", "loop_index", "time_step"] = Field(
        "time_step",
        description="time_step: LoopFormer's (t, Δ) embedders; loop_index: TMLT's step index; constant: the same "
        "AdaLN-Zero blocks with no loop-time information (learned constant gates and scales: Base-Loop, or with "
        "loops 1 the non-looped Base, of LoopFormer's blocks); none: Base-Loop of plain pre-norm blocks.",
    )
    objective: Literal["fixed", "early_exit", "early_exit_consistency", "shortcut_consistency"] = Field(
        "shortcut_consistency",
        description="fixed: full trajectory only; early_exit: plus the loss of an exit after S ~ U{1..L-1} "
        "steps; early_exit_consistency: plus MSE(sg(h_L), h_S); shortcut_consistency: LoopFormer's sampled "
        "S-step trajectory with both terms.",
    )
    consistency_target: Literal["hidden", "logits"] = Field(
        "hidden", description="What the consistency term matches: the final (normed) hidden state, or the logits."
    )
    shortcut_sampler: Literal["grid_sequential", "grid_composition", "dirichlet"] = Field(
        "grid_sequential",
        description="Step sizes of the short trajectory: grid_sequential (default) = the official code's sampler, "
        "each step in turn uniform on the 1/L grid within what the remaining steps leave (favours long first "
        "steps: P(5,1,1,1) = 0.2 at L = 8, S = 4); grid_composition = uniform over compositions on the grid "
        "(1/35); dirichlet = Dirichlet(1,...,1) off the grid.",
    )
    fourier_features: int = Field(256, ge=2, le=8192, description="Fourier features per embedded scalar (paper: 256).")
    max_period: float = Field(10000.0, gt=1, le=1e9, description="Longest period of the Fourier features.")
    time_scale: float = Field(
        1.0, gt=0, le=1e6, description="τ is multiplied by this before its Fourier features (unstated; DiT uses 1000)."
    )
    modulator_init: Literal["zero", "normal"] = Field(
        "zero",
        description="zero: AdaLN-Zero, gates closed, every block starts as the identity; normal: N(0, init_std) "
        "weights, what the official code ends up with.",
    )

    aux_term_sources = {
        "shortcut": "model.params.objective: early_exit, early_exit_consistency or shortcut_consistency",
        "consistency": "model.params.objective: early_exit_consistency or shortcut_consistency",
    }

    @model_validator(mode="after")
    def _knobs_fit(self) -> LoopFormerParams:
        if self.objective != "fixed" and self.loops < 2:
            raise ValueError(f"objective {self.objective} trains a shorter run beside the full one: needs loops >= 2")
        if self.objective not in CONSISTENCY and self.consistency_target != "hidden":
            raise ValueError(f"consistency_target has no effect with objective {self.objective} (no consistency term)")
        if self.objective != "shortcut_consistency" and self.shortcut_sampler != SAMPLERS[0]:
            raise ValueError(f"shortcut_sampler has no effect with objective {self.objective} (no sampled trajectory)")
        if self.fourier_features % 2:
            raise ValueError(f"fourier_features must be even (cos and sin pairs), got {self.fourier_features}")
        return self

    lr_group_names = ("conditioning",)

    def param_groups(self) -> dict[str, tuple[str, ...]]:
        """`conditioning`: the (t, Δ) or step-index embedders and every block's AdaLN modulator."""
        if self.conditioning == "none":
            return {}
        if self.conditioning == "constant":
            return {"conditioning": ("blocks.*.modulator.*",)}
        return {"conditioning": ("time_embed.*", "step_embed.*", "blocks.*.modulator.*")}

    def aux_terms(self) -> set[str]:
        return {"fixed": set(), "early_exit": {"shortcut"}}.get(self.objective, {"shortcut", "consistency"})

    def baseline(self, kind: str) -> tuple[str, dict] | None:
        """iso_param: the k blocks run once; iso_flop: k*L distinct blocks run once; both LoopFormer's own
        AdaLN-Zero blocks (`conditioning: constant`, `objective: fixed`), so the baseline differs from the looped
        cell in looping only (a plain `looped` k x 1 would differ in the block too: add it with `include:`)."""
        if self.loops == 1:
            return None
        own = {name: getattr(self, name) for name in type(self).model_fields}
        k = self.block_layers if kind == "iso_param" else self.block_layers * self.loops
        keep = {n: v for n, v in own.items() if n in CoreParams.model_fields or n in ("norm", "modulator_init")}
        return "loopformer", {**keep, "block_layers": k, "loops": 1, "conditioning": "constant", "objective": "fixed"}

    def diagnostic_names(self) -> set[str]:
        if self.conditioning == "none":
            return set()
        steps = range(1, self.loops + 1)
        return {f"adaln_gate_step_{t}" for t in steps} | {f"adaln_scale_step_{t}" for t in steps}

    def trajectory_problem(self, train: Any, evaluation: Any, depths: list[int]) -> tuple[tuple, str] | None:
        """(field location, message) when `train.trajectory` / `eval.trajectory` do not fit this config;
        `depths` are the loop counts evaluated besides the trained one (eval.budgets and eval.loops)."""
        for loc, spec in ((("train", "trajectory"), train), (("eval", "trajectory"), evaluation)):
            if spec is not None and self.conditioning != "time_step":
                return loc, (
                    f"step sizes reach the model only with model.params.conditioning: time_step; with "
                    f"{self.conditioning} only the number of steps counts: set loops or eval.budgets instead"
                )
            if isinstance(spec, list) and len(spec) > self.loops:
                return loc, f"lists {len(spec)} steps, more than loops ({self.loops})"
        if isinstance(train, list) and len(train) < 2 and self.objective != "fixed":
            return ("train", "trajectory"), f"objective {self.objective} needs a trajectory of at least 2 steps"
        if evaluation is None:
            return None
        if self.objective in EARLY_EXIT:
            return ("eval", "trajectory"), (
                f"objective {self.objective} is evaluated by exiting its trained trajectory after M steps; "
                "schedules apply to objectives fixed and shortcut_consistency"
            )
        if not depths:
            return ("eval", "trajectory"), "applies to the evaluations at eval.budgets (or eval.loops): set one"
        if evaluation == ENUMERATE_ALL and max(depths) > self.loops:
            return ("eval", "trajectory"), (
                f"enumerate_all needs every budget <= loops ({self.loops}): the 1/{self.loops} grid has no "
                f"{max(depths)}-step trajectory"
            )
        if isinstance(evaluation, list) and any(m != len(evaluation) for m in depths):
            other = next(m for m in depths if m != len(evaluation))
            return ("eval", "trajectory"), (
                f"lists {len(evaluation)} steps but a budget of {other} is evaluated; a list fits one budget, "
                "a named schedule fits all"
            )
        return None


class LoopFormer(nn.Module):
    def __init__(self, p: LoopFormerParams, facts: TaskFactsLike):
        super().__init__()
        self.p = p
        self.diagnostic_names: set[str] = p.metric_names()
        rotary = rotary_for(p, facts.seq_len)
        self.embed = Embedding(p, facts.vocab_size, facts.seq_len)
        if p.conditioning == "none":
            self.blocks = nn.ModuleList(Block(p, facts.causal, rotary) for _ in range(p.block_layers))
        else:
            self.blocks = nn.ModuleList(
                ModulatedBlock(p, facts.causal, rotary, p.modulator_init) for _ in range(p.block_layers)
            )
        self.head = Head(p, facts.vocab_size)
        embedder = lambda: FourierEmbedder(p.d_model, p.fourier_features, p.max_period, p.time_scale)  # noqa: E731
        self.time_embed = embedder() if p.conditioning in ("loop_index", "time_step") else None  # t, or the index
        self.step_embed = embedder() if p.conditioning == "time_step" else None  # Δ
        self.trajectory_grid = p.loops  # enumerate_all's lattice: step sizes in multiples of 1/L
        self.use_trajectory(schedule("uniform", p.loops))
        init_weights(self, p, self.effective_depth)

    def use_trajectory(self, steps: list[float]) -> None:
        """Set the trained (full) trajectory; loops and effective depth follow its length."""
        self.trajectory = list(steps)
        self.loops = len(steps)
        self.effective_depth: int = self.p.block_layers * self.loops

    def configure(self, train: dict[str, Any], evaluation: dict[str, Any]) -> None:
        """Read `train.trajectory` (the trainer calls this once, before training)."""
        spec = train.get("trajectory")
        if spec is not None:
            self.use_trajectory(schedule(spec, schedule_length(spec, self.p.loops)))

    def budget(self, m: int) -> list[float]:
        """The M-step trajectory a budget runs (see the module docstring)."""
        if m < 1:
            raise ValueError(f"loops must be >= 1, got {m}")
        if self.p.objective in EARLY_EXIT:
            return (self.trajectory + [self.trajectory[-1]] * m)[:m]
        return schedule("uniform", m)

    def forward(
        self,
        tokens: torch.Tensor,
        loops: int | None = None,
        *,
        diagnose: bool = False,
        trajectory: list[float] | None = None,
    ) -> ModelOutput:
        """`loops` runs a budget of that many steps, `trajectory` an explicit one; default: the trained one."""
        steps = self._steps(loops, trajectory)
        short = None
        if self.training and loops is None and trajectory is None and self.p.objective != "fixed":
            short = self._sample_short()
        h0 = self.embed(tokens)
        mods = self._modulations(steps, h0.device)
        exit_at = short if isinstance(short, int) else None
        h, h_exit = self._run(h0, mods, len(steps), trace=True, exit_at=exit_at)
        normed = self.head.norm(h)
        out = ModelOutput(logits=self.head.out(normed))
        if short is not None:
            if isinstance(short, int):  # early exit: the state after `short` steps of this run
                short_normed = self.head.norm(h_exit)
            else:  # shortcut: a separate, complete trajectory
                h_short, _ = self._run(h0, self._modulations(short, h0.device), len(short), trace=False)
                short_normed = self.head.norm(h_short)
            short_logits = self.head.out(short_normed)
            out.aux_logits["shortcut"] = short_logits
            if self.p.objective in CONSISTENCY:
                if self.p.consistency_target == "hidden":
                    out.aux["consistency"] = F.mse_loss(short_normed, normed.detach())
                else:
                    out.aux["consistency"] = F.mse_loss(short_logits, out.logits.detach())
        if diagnose and mods is not None:
            out.diagnostics.update(self._gate_diagnostics(mods))
        return out

    def _steps(self, loops: int | None, trajectory: list[float] | None) -> list[float]:
        if trajectory is None:
            return self.trajectory if loops is None else self.budget(loops)
        steps = [float(s) for s in trajectory]
        if not steps or any(not s > 0 for s in steps) or abs(math.fsum(steps) - 1.0) > SUM_TOLERANCE:
            raise ValueError(f"a trajectory is one or more positive step sizes summing to 1, got {trajectory}")
        if loops is not None and loops != len(steps):
            raise ValueError(f"loops={loops} but the trajectory has {len(steps)} steps")
        return steps

    def draw_training(self) -> int | list[float] | None:
        """What a training forward draws at random (its short run: an exit step or a trajectory; None for
        `fixed`), drawn now from torch's global generator as the forward would draw it. Packed trials
        (train/vectorized.py) draw each member's with its own generator state, then run the members whose
        draws agree in one batched forward, each inside `drawn(draw)`."""
        return self._sample_short() if self.p.objective != "fixed" else None

    @contextlib.contextmanager
    def drawn(self, draw: int | list[float] | None) -> Iterator[None]:
        """Inside, a training forward takes `draw` as its short run instead of drawing one."""
        self._draw = draw
        try:
            yield
        finally:
            self._draw = None

    _draw: int | list[float] | None = None

    def _sample_short(self) -> int | list[float]:
        """The training step's short run: an exit step S (early-exit objectives) or a trajectory."""
        if self._draw is not None:  # pinned by `drawn` (packed trials)
            return self._draw
        if self.p.objective in EARLY_EXIT:
            return int(torch.randint(1, self.loops, (1,)).item())  # S ~ U{1..L-1}
        return sample_shortcut(self.p.shortcut_sampler, self.p.loops, self.loops - 1)

    def compute_draws(self) -> list[tuple[float, contextlib.AbstractContextManager]]:
        """FLOP counting's hook (train/flops.py): (weight, a context in which the training forward takes that
        draw), whose weighted FLOPs are the expectation over the random short run. `shortcut_consistency` runs
        a separate trajectory of S ~ U{1..L-1} steps, whose FLOPs are linear in S (S steps of the blocks and of
        their modulations), so the expectation is the mean of the two ends S = 1 and S = L-1. Empty where the
        compute is not drawn: `fixed` has no short run, and an early exit reads the full run at step S, which
        costs the same whatever S."""
        if self.p.objective != "shortcut_consistency":
            return []
        ends = sorted({1, self.loops - 1})
        # a trajectory of S steps costs the same whatever its step sizes: a uniform one stands for every draw
        return [(1 / len(ends), self.drawn(schedule("uniform", s))) for s in ends]

    def _modulations(self, steps: list[float], device: torch.device) -> list[tuple[torch.Tensor, ...]] | None:
        """Per block, its four (M, d) modulations for every step of `steps`; None without conditioning."""
        if self.p.conditioning == "none":
            return None
        if self.p.conditioning == "constant":  # silu(0) = 0: each modulation is its linear's bias, a learned constant
            c = torch.zeros(len(steps), self.p.d_model, device=device)
            return [block.modulator(c) for block in self.blocks]
        if self.p.conditioning == "loop_index":
            c = self.time_embed(torch.arange(len(steps), device=device, dtype=torch.float32))
        else:
            t = torch.tensor(start_times(steps), device=device, dtype=torch.float32)
            c = self.time_embed(t) + self.step_embed(torch.tensor(steps, device=device, dtype=torch.float32))
        return [block.modulator(c) for block in self.blocks]

    def _run(
        self, h: torch.Tensor, mods, n_steps: int, *, trace: bool, exit_at: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """n_steps loop steps from h; also the state after `exit_at` steps when asked."""
        if trace:
            trace_step(self, h)
        h_exit = None
        for i in range(n_steps):
            for b, block in enumerate(self.blocks):
                h = block(h) if mods is None else block(h, tuple(m[i] for m in mods[b]))
            if trace:
                trace_step(self, h)
            if exit_at == i + 1:
                h_exit = h
        return h, h_exit

    def _gate_diagnostics(self, mods) -> dict[str, float]:
        """Mean |gate| and |scale| per step, over blocks and both branches: how far from the identity."""
        out: dict[str, float] = {}
        for i in range(mods[0][0].shape[0]):
            gates = [m[i].abs().mean() for block in mods for m in block[:2]]
            scales = [m[i].abs().mean() for block in mods for m in block[2:]]
            out[f"adaln_gate_step_{i + 1}"] = torch.stack(gates).mean().item()
            out[f"adaln_scale_step_{i + 1}"] = torch.stack(scales).mean().item()
        return out


@register_family("loopformer", LoopFormerParams)
def build(params: LoopFormerParams, facts: TaskFactsLike) -> LoopFormer:
    return LoopFormer(params, facts)
