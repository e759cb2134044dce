"""FLOPs of a trial's training, counted on the model with `torch.utils.flop_counter.FlopCounterMode`.

Every trial records three final metrics (docs/reference/metrics.md), one vocabulary across families:

- `flops_per_token`: model FLOPs of one training forward and its backward, per input token of a
  *reference batch*: train.batch_size sequences of the task's sequence length (`TaskFacts.seq_len`, the
  longest input the task makes). One shape per task and batch size, whatever the family, so two trials of
  a claim compare like for like (a claim's `matched: [flops]`), and `studyrunner plan` shows the same
  figure before anything runs (`analytic_flops_per_token`: the same count on the meta device).
- `flops_per_token_forward`: the forward part of it.
- `train_flops`: `flops_per_token` times the input tokens of the trial's own training batches (every step
  taken). Exact where training sequences are the task's sequence length (every task but `addition` whose
  eval operand counts exceed its training ones: there attention is counted at the longer length, a few
  percent too much).

What is counted. Everything that runs in the model's training forward (`model(tokens)` in training mode,
as a training step calls it) and the backward of its objective: ponder steps, memory tokens and
memory-bank reads, AdaLN modulators and their time embedders, MELT's gates, chunks and cache reads, a
LoopFormer's short run, LoopLM's per-loop heads. Only what the counter counts is counted:

- matrix products: aten.mm, addmm, bmm, baddbmm (every nn.Linear, matmul and einsum decomposes into them),
  and convolutions (no family has one);
- attention: the fused kernels of `scaled_dot_product_attention`. The counter covers the CUDA ones (flash,
  efficient, cuDNN) but not the CPU flash kernel (`_scaled_dot_product_flash_attention_for_cpu`, which
  every CPU trial's attention dispatches to): it would count 0 there, so `ATTENTION` registers it here.
  The math path (3-D inputs such as the memory-bank read, the meta device, `core.explicit_attention`)
  decomposes into bmm and is counted as such. Attention is counted dense: QK^T and AV over every
  (query, key) pair, a causal mask halving nothing, as the counter does;
- the backward: twice the forward for matmuls, as the counter measures (the input gradient and the weight
  gradient). For fused attention the counter's own formula adds the recomputation of QK^T that the
  kernels do (5 products against the forward's 2); here it counts 4 (dS = dO V^T, dV = P^T dO,
  dQ = dS K, dK = dS^T Q), the model FLOPs the math path counts, so a trial counts the same on CPU, CUDA
  and the meta device.

Not counted: elementwise ops and reductions (norms, activations, softmax, residual adds, gates, rotary
embeddings, ACT's bookkeeping, the loss), embedding lookups and their backward, the optimizer step, and
anything run by another model during the forward (a distilling MELT student's frozen teacher: `_Counter`
leaves out the ops of modules that are not the model's own), which is no part of the model's compute.

The backward is that of a stand-in objective, the sum of every output the trainer's objective reads (the
logits, or the exits' weighted logits; the aux logits; the aux terms): the same graph is differentiated,
and the loss itself costs no counted FLOPs. The count runs on a batch of zeros of the reference shape (the
values change no executed FLOP) inside `_isolated`: the random streams are forked (dropout, a LoopFormer's
draw of its short run), every parameter's .grad is put back as it was, nothing else is written, so a trial
trains exactly as it would without counting (tests/test_flops.py checks its final metrics bit for bit).

Random and realised compute, through two optional model hooks (models/registry.py):

- `compute_draws()`: a training forward whose compute is drawn at random (LoopFormer's short run of S
  steps) lists forwards that pin the draw, with weights whose weighted count is the expectation.
- `realised_loops(tokens)`: a halting model whose later loop steps run without being used (`ut_act`'s ACT:
  a halted token's state is frozen and its later steps weigh 0, but the block still runs on it, so an
  implementation that skipped them would save them) gives the mean number of loop steps per position it
  uses. Its FLOPs are then counted at the realised depth: the count at `loops` minus the FLOPs of one loop
  step (the count at `loops` less the count at `loops - 1`) for every step not used. The realised depth
  depends on what the model has learnt, so it is measured on the trial's own training batches as training
  goes: before the first step and at every evaluation (`eval.every` and the last step), on the batch
  just trained on, and averaged over the steps by the trapezoid rule (`mean_loops`). Start and end alone
  would not see when a run collapsed to shallow halting (seed 003's trap) or escaped it, which decides the
  average; evaluations are where the trial already pays for forwards, and a no-grad forward of one training
  batch is small beside them.
  `adaptive_layers` (PonderNet weights) has no such hook: every step runs and every step's state is
  weighed into the output, so its FLOPs are those of its `loops` steps, whatever its expected depth.
  `plan` counts halting families at their most steps (`loops`), and says so.

Cost: one counted forward and backward at the start of a trial (two for a halting model or a LoopFormer
short run), on the real model before any engine takes it over (DeepSpeed wraps it afterwards: its workers'
micro-batches add up to the whole batch this counts), plus the halting models' no-grad forwards above. The
counter's Python dispatch makes a counted step a few times slower than a training step, and its first use in
a process imports torch._dynamo (a second or two, once).
Seeds trained together (vectorized.py) count each member's own model, so each records its own figure.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils.flop_counter import FlopCounterMode, flop_registry, sdpa_flop_count

from .hooks import DrawsCompute, RealisesLoops

if TYPE_CHECKING:  # setup.py imports this module
    from .setup import TrialSetup
    from .trial_progress import Progress

__all__ = [
    "ATTENTION",
    "FLOP_METRICS",
    "StepFlops",
    "analytic_flops_per_token",
    "count_forward_backward",
    "count_step",
    "count_trial",
    "final_metrics",
    "format_flops",
    "mean_loops",
    "realised_loops",
]

FLOP_METRICS = ("train_flops", "flops_per_token", "flops_per_token_forward")

aten = torch.ops.aten
log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------ attention


def _raw(formula):
    """Mark a formula as taking the op's raw arguments (FlopCounterMode then passes them unwrapped)."""
    formula._get_raw = True
    return formula


@_raw
def _attention_forward(query, key, value, *args, out_val=None, **kwargs) -> int:
    """QK^T and AV of (B, H, T, D) inputs: 2 products."""
    return sdpa_flop_count(query.shape, key.shape, value.shape)


@_raw
def _attention_backward(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
    """dS = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q: 4 products, twice the forward (the math path's
    count; the kernels' recomputation of QK^T is not model FLOPs)."""
    return 2 * sdpa_flop_count(query.shape, key.shape, value.shape)


# The CPU flash kernel the counter does not know, and the CUDA kernels' backward counted as model FLOPs.
# Each backward op takes (grad_out, query, key, value, ...) first.
ATTENTION: dict[Any, Any] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _attention_forward,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _attention_backward,
    aten._scaled_dot_product_flash_attention_backward: _attention_backward,
    aten._scaled_dot_product_efficient_attention_backward: _attention_backward,
    aten._scaled_dot_product_cudnn_attention_backward: _attention_backward,
}


class _Counter:
    """A FlopCounterMode over the ops run by `model`'s own modules, with `ATTENTION`'s formulas.

    Ops run inside a module that is not one of `model.modules()` (a teacher another model runs in its
    forward) count 0: every formula is gated on no such module running. Ops outside any module (a loss on
    the outputs, the backward) count as the model's."""

    def __init__(self, model: torch.nn.Module):
        self.own = {id(m) for m in model.modules()}
        self.foreign = 0
        formulas = {**flop_registry, **ATTENTION}
        self.mode = FlopCounterMode(display=False, custom_mapping={op: self._gated(f) for op, f in formulas.items()})

    def _gated(self, formula):
        def counted(*args, **kwargs) -> int:
            return 0 if self.foreign else formula(*args, **kwargs)

        return _raw(counted)

    def _enter(self, module, args) -> None:
        if id(module) not in self.own:
            self.foreign += 1

    def _exit(self, module, args, output) -> None:
        if id(module) not in self.own:
            self.foreign -= 1

    @contextlib.contextmanager
    def counting(self) -> Iterator[FlopCounterMode]:
        pre = register_module_forward_pre_hook(self._enter)
        post = register_module_forward_hook(self._exit)
        try:
            with self.mode:
                yield self.mode
        finally:
            pre.remove()
            post.remove()
            self.foreign = 0


# ------------------------------------------------------------------------------------------ counting


@contextlib.contextmanager
def _isolated(model: torch.nn.Module, device: torch.device) -> Iterator[None]:
    """Whatever runs inside leaves the model's gradients and the random streams as they were."""
    params = list(model.parameters())
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        for p, grad in zip(params, grads, strict=True):
            p.grad = grad


def _objective(out) -> torch.Tensor:
    """A stand-in for the trainer's objective (engine.objective): the sum of every output it reads, so the
    same graph is differentiated (the task loss's own ops count no FLOPs)."""
    outputs = [logits * weights.unsqueeze(-1) for logits, weights in out.exits] if out.exits else [out.logits]
    outputs += list(out.aux_logits.values())
    total = sum(o.float().sum() for o in outputs)
    for term in out.aux.values():
        total = total + term.float().sum()
    return total


def count_forward_backward(model: torch.nn.Module, tokens: torch.Tensor, loops: int | None = None) -> tuple[int, int]:
    """(forward, backward) FLOPs of one training forward of `model` on `tokens` (at `loops` steps when given)
    and the backward of its objective. Leaves the model's gradients and the random streams as they were."""
    counter = _Counter(model)
    with _isolated(model, tokens.device):
        draws = model.compute_draws() if isinstance(model, DrawsCompute) and loops is None else None
        variants = draws or [(1.0, contextlib.nullcontext())]
        forward = backward = 0.0
        for weight, pinned in variants:
            with pinned:
                with counter.counting() as mode:
                    out = model(tokens) if loops is None else model(tokens, loops=loops)
                f = mode.get_total_flops()
                loss = _objective(out)
                with counter.counting() as mode:
                    if loss.requires_grad:
                        loss.backward()
                b = mode.get_total_flops()
            del out, loss
            for p in model.parameters():
                p.grad = None
            forward, backward = forward + weight * f, backward + weight * b
    return round(forward), round(backward)


@dataclass(frozen=True)
class StepFlops:
    """One training step's counted FLOPs on the reference batch (`tokens` input tokens).

    For a model with `realised_loops`: also one loop step's FLOPs (`loop_forward`, `loop_backward`) at its
    nominal `loops`, so the count can be taken at a realised depth (`at`)."""

    forward: int
    backward: int
    tokens: int
    loops: int = 1
    loop_forward: int = 0
    loop_backward: int = 0
    halting: bool = False  # `realised_loops` answers: the trial measures its realised depth

    def at(self, loops: float | None = None) -> tuple[float, float]:
        """(forward, backward) FLOPs at `loops` realised steps (None: the nominal depth)."""
        if loops is None or not self.halting:
            return float(self.forward), float(self.backward)
        unused = self.loops - loops
        return self.forward - unused * self.loop_forward, self.backward - unused * self.loop_backward

    def per_token(self, loops: float | None = None) -> dict[str, float]:
        forward, backward = self.at(loops)
        return {"flops_per_token": (forward + backward) / self.tokens, "flops_per_token_forward": forward / self.tokens}


def count_step(
    model: torch.nn.Module, batch_size: int, seq_len: int, device: torch.device | str, *, realised: bool = True
) -> StepFlops:
    """Count one training step of `model` on a reference batch of zeros (batch_size, seq_len) on `device`
    (the meta device counts without computing). With `realised` and a model that halts with unused steps
    (`realised_loops`), the FLOPs of one loop step too."""
    device = torch.device(device)
    tokens = torch.zeros(batch_size, seq_len, dtype=torch.long, device=device)
    forward, backward = count_forward_backward(model, tokens)
    loops = int(getattr(model, "loops", 1) or 1)
    # Does it halt (`realised_loops` answers)? Asked on the meta device too would fail: `plan` does not ask.
    halting = realised and realised_loops(model, tokens) is not None
    step_forward = step_backward = 0
    if halting and loops > 1:
        shorter = count_forward_backward(model, tokens, loops=loops - 1)
        step_forward, step_backward = forward - shorter[0], backward - shorter[1]
    return StepFlops(forward, backward, tokens.numel(), loops, step_forward, step_backward, halting)


def realised_loops(model: torch.nn.Module, tokens: torch.Tensor) -> float | None:
    """The model's `realised_loops` on `tokens` (a no-grad forward that changes no random stream), or None."""
    if not isinstance(model, RealisesLoops):
        return None
    devices = [tokens.device] if tokens.device.type == "cuda" else []
    with torch.no_grad(), torch.random.fork_rng(devices=devices):
        value = model.realised_loops(tokens)
    return None if value is None else float(value)


def mean_loops(samples: Sequence[Sequence[float]]) -> float | None:
    """The realised depth averaged over training: (step, loops) samples, by the trapezoid rule over the steps
    between the first and the last sample (the one value when there is one; None when there is none)."""
    points = sorted((float(s), float(v)) for s, v in samples if v is not None)
    if not points:
        return None
    span = points[-1][0] - points[0][0]
    if span <= 0:
        return points[-1][1]
    area = sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in itertools.pairwise(points))
    return area / span


def final_metrics(count: StepFlops, samples: Sequence[Sequence[float]], tokens_trained: int) -> dict[str, float]:
    """The trial's FLOP metrics: per token at its realised depth (halting models), and over its training."""
    metrics = count.per_token(mean_loops(samples) if count.halting else None)
    metrics["train_flops"] = metrics["flops_per_token"] * tokens_trained
    return metrics


# ------------------------------------------------------------------------------------------ a trial


def count_trial(trial: TrialSetup) -> StepFlops | None:
    """Count a built trial's training step (`setup.TrialSetup`: its model as built, before an engine takes it
    over) on the reference batch, on its device; None, with a warning, where the count fails (the trial trains
    on, without FLOP metrics)."""
    try:
        with trial.runtime.autocast():
            return count_step(trial.model, trial.train.batch_size, trial.task.facts.seq_len, trial.runtime.device)
    except Exception as exc:  # noqa: BLE001 - counting must never stop a trial
        log.warning(
            "FLOPs not counted for this trial (%s: %s); it trains without FLOP metrics", type(exc).__name__, exc
        )
        return None


def sample_depth(trial: TrialSetup, progress: Progress, done: int) -> None:
    """Before the first step (`done` = 0) and at every evaluation: a halting model's realised depth on the train
    batch of the step just taken (the first one before any), added to `progress.flop_depths`."""
    if trial.flops is None or not trial.flops.halting:
        return
    batch = trial.runtime.to_device(trial.task.train_batch(max(done - 1, 0), trial.train.batch_size))
    with trial.runtime.autocast():
        loops = realised_loops(trial.model, batch.inputs)
    if loops is not None:
        progress.flop_depths.append([done, loops])


def depth_due(trial: TrialSetup, done: int) -> bool:
    """Whether `sample_depth` runs after `done` steps: where the trial evaluates (evaluation.evaluate_and_record)."""
    return trial.flops is not None and trial.flops.halting and (done % trial.ev.every == 0 or done == trial.steps)


def trial_metrics(trial: TrialSetup, progress: Progress, tokens: int | None = None) -> dict[str, float]:
    """A trial's FLOP metrics so far; `tokens`: the input tokens of its own training batches when
    `progress.total_tokens` counts more (seeds trained together count every seed's)."""
    if trial.flops is None:
        return {}
    return final_metrics(trial.flops, progress.flop_depths, progress.total_tokens if tokens is None else tokens)


# ------------------------------------------------------------------------------------------ plan


def analytic_flops_per_token(model: torch.nn.Module, batch_size: int, seq_len: int) -> float:
    """`flops_per_token` of a model built on the meta device (no weights allocated, nothing computed), at its
    nominal depth: halting models at their most loop steps. What `studyrunner plan` shows."""
    return count_step(model, batch_size, seq_len, "meta", realised=False).per_token()["flops_per_token"]


def format_flops(value: float) -> str:
    """1234567 -> '1.23M': three significant figures and a k/M/G/T/P suffix."""
    value = float(f"{value:.3g}")  # rounded first, so 999_700 is '1M', not '1e+03k'
    for suffix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"
