"""Packed trials (`train.pack`, packing.py): S trials of one shape in one process, as one batched model.
Knows models and tasks; nothing of Ray, MLflow or SQL.

Each member is still its own trial: `run_trials_together(configs, seeds, reporters)` sends each member's
reporter the records `run_trial(config, seed, reporter)` sends (same names, same steps, same order of calls:
facts, start, the step-0 record, then per step its record, checkpoint and tick), writes each member's
checkpoints where its own run would, in its format (a member resumes packed or alone, from either), and
returns each member's final metrics, equal to a separate run's up to float rounding (tests/test_packed.py
pins it, per family).

How. Each member's trial is built exactly as `run_trial` builds it (`trainer.build_trial`: its
`torch.manual_seed(seed)`, task and model, so its initial weights, batches and eval sets). The members'
parameters are stacked along a new leading dimension (`torch.func.stack_module_state`) and one training step
runs one shared module over all of them with `torch.func.vmap(functional_call)`: each member's batch
(`task.train_batch(step, batch_size)` of its own task, stacked) through its own slice of the weights, with
the model's whole training output (logits, aux terms, the short run's logits, weighted exits). Then per
member, as `engine.train_step` does: its objective (engine.objective, with its own aux weights), summed over
members for one backward pass (each member's slices are separate leaves of the sum, so each gradient is its
own loss's), its gradient norms, its gradient clipped by its own `grad_clip` over its own slices, and AdamW:
torch's AdamW over the stacked tensors at rate 1 without decay gives each element's Adam direction (Adam is
elementwise, so one optimizer state is S optimizer states), and each member's update is then applied with its
own learning rate (its schedule at this step) and decoupled weight decay (on its matrices, as
`optim.make_optimizer`): p <- p (1 - lr wd) - lr * direction, what AdamW does with that lr and wd.
The members' batches of a step come stacked (`PackBatch`: made on the host in one prefetch thread, one pinned copy
per field to the device on a side stream, so the training stream never waits on the host and the copies do not grow
with S); the losses stay on the device until a booking reads them (`_book`: where a member records, evaluates or
saves, or every `BOOK_EVERY` steps), and on a GPU the whole step is one CUDA graph where the family allows
(packed_graph.py). Under vmap, attention runs as explicit matmuls (`core.Attention.explicit`): the fused CPU kernel
has no batching rule. Members whose batches differ in shape at a step (a task that draws its sequence length per
step), or whose training forwards draw differently (LoopFormer's short run, `hooks.DrawsInTraining`: each member
draws from its own generator state, as its separate run would), run in one vmap per group. Halting families
(ut_act's ACT, adaptive_layers) train every member to the common maximum depth with their masks, as they do alone.
Evaluation, a halting model's realised depth and checkpoints are per member, on the member's own model (its current
slice copied in): the code and kernels `run_trial` uses (`trainer.after_step`).

What differs from separate trials:
- Float rounding: batched matmuls and the explicit attention sum in another order than the separate
  trial's kernels, so losses agree to ~1e-6 relative, not bit for bit; an eval accuracy can move by an
  example where two logits nearly tie.
- Time is the pack's: `step_time_ms` is the wall time of the shared step (which trains every member) and
  `tokens_per_sec` the member's own tokens per second of it (the pack's throughput is their sum). FLOPs are
  each member's own (flops.py): equal to a separate run's.
- A member whose train loss is not finite (or whose reporter raises `Diverged`) stops at that step (its
  entry in the returned list is that `Diverged`, metrics filled in); the others train on (nothing crosses
  between members' slices). It stays in the batch, computing nothing used.
- Members resumed from checkpoints of different steps (a kill between two members' saves): the pack starts
  at the earliest, and the members ahead are held (their weights and optimizer state put back after each
  shared step, nothing reported) until the pack reaches their step.

Refused with a `ValueError` naming train.pack (packing.check_packable): dropout, `train.compile`,
`train.lr_groups`, a conversion's teacher, and configs whose shapes differ (`packing.shape_key`).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.func import functional_call, stack_module_state, vmap

from ..models.core import Attention
from ..models.output import ModelOutput
from ..tasks import Batch
from .checkpoint import Checkpoints
from .config import TrialConfig
from .engine import objective
from .hooks import DrawsInTraining, StepDependent
from .optim import set_lr
from .outcomes import Diverged
from .packed_graph import DenseLoss, GraphedStep, graph_problem
from .packing import KNOB, check_packable, shape_key
from .prefetch import Prefetcher, prefetch_enabled
from .reporter import Reporter, send_facts, send_replay, send_start
from .schedules import aux_weights
from .trainer import TrialSetup, after_step, before_first_step, build_trial, open_checkpoints, summary_metrics
from .trial_progress import Progress

__all__ = ["KNOB", "run_trials_together"]


def run_trials_together(
    configs: Mapping[str, Any] | TrialConfig | Sequence[Mapping[str, Any] | TrialConfig],
    seeds: Sequence[int],
    reporters: Sequence[Reporter],
    *,
    device: str | torch.device | None = None,
    checkpoints: Sequence[Any] | None = None,
    nan_at: Mapping[int, int] | None = None,
) -> list[dict[str, float] | Diverged]:
    """Train S trials packed; one config (shared) or one per member, one seed and one reporter per member;
    each member's final metrics, or its `Diverged` (metrics filled in) where it diverged (module docstring).

    `device` as in `run_trial`. `checkpoints`: one location per member (as `run_trial`'s), or None.
    `nan_at` is the testing hook of `run_trial`, per member index: {i: 1-based step whose loss is made NaN}.
    """
    seeds = list(seeds)
    members = _member_configs(configs, len(seeds), len(reporters))
    trials = []
    rng: list[torch.Tensor] = []
    for config, seed in zip(members, seeds, strict=True):
        trials.append(build_trial(config, seed, device))
        rng.append(torch.get_rng_state())  # what the member's own run draws from next
    where = checkpoints or [None] * len(seeds)
    stores = [open_checkpoints(*member) for member in zip(where, members, seeds, reporters, strict=True)]
    progress = []
    for i, (trial, store) in enumerate(zip(trials, stores, strict=True)):
        progress.append(trial.engine.resume(store, trial) if store is not None else Progress())
        if progress[-1].step > 0:
            rng[i] = torch.get_rng_state()  # the checkpoint's generator state
    pack = Pack(trials, progress, rng, [(nan_at or {}).get(i) for i in range(len(seeds))])
    graph = "yes" if pack.graph is not None else f"no: {pack.graph_problem}"
    for trial, reporter in zip(trials, reporters, strict=True):
        facts = {**trial.runtime.facts(), **trial.data_facts(), "seeds_together": str(len(seeds)), "pack_graph": graph}
        send_facts(reporter, facts)
    return pack.run(stores, reporters)


def _member_configs(configs, n_seeds: int, n_reporters: int) -> list[TrialConfig]:
    if isinstance(configs, Mapping | TrialConfig):
        configs = [configs] * n_seeds
    members = [TrialConfig.of(c) for c in configs]
    if not members or len(members) != n_seeds or n_reporters != n_seeds:
        raise ValueError(
            f"{KNOB}: one config (or one per member), seed and reporter per member; got {len(members)} configs, "
            f"{n_seeds} seeds, {n_reporters} reporters"
        )
    for config in members:
        check_packable(config)
    keys = {shape_key(c.resolved) for c in members}
    if len(keys) > 1:
        raise ValueError(f"{KNOB}: these configs differ in more than the member fields (packing.MEMBER_FIELDS)")
    return members


BOOK_EVERY = 50  # steps at most between two bookings (reads from the device) when nothing is due sooner


@dataclass
class TakenStep:
    """One shared step, to be booked: its 0-based `step`, the members that took part, their losses (a device
    tensor, read at booking), gradient norms, aux terms and weights, and input tokens, per member."""

    step: int
    members: list[int]
    losses: torch.Tensor
    grad_norms: list[dict[str, torch.Tensor]]
    aux: list[dict[str, torch.Tensor]]
    weights: list[dict[str, float]]
    tokens: list[int]


@dataclass
class PackBatch:
    """Every member's train batch of one step. Where their shapes agree (nearly always), stacked: (S, B, T)
    tensors made on the host in the prefetch thread, then one pinned copy per field to the device on a side
    stream, and views per member (`split`); else each member's own batch (`members`: a task that draws its
    sequence length per step)."""

    inputs: torch.Tensor | None = None
    targets: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    members: list[Batch] | None = None

    @classmethod
    def of(cls, batches: list[Batch]) -> PackBatch:
        if len({tuple(b.inputs.shape) for b in batches}) > 1:
            return cls(members=batches)
        stack = lambda name: torch.stack([getattr(b, name) for b in batches])  # noqa: E731
        return cls(stack("inputs"), stack("targets"), stack("loss_mask"))

    def split(self) -> list[Batch]:
        if self.members is not None:
            return self.members
        assert self.inputs is not None and self.targets is not None and self.loss_mask is not None
        return [Batch(x, y, m) for x, y, m in zip(self.inputs, self.targets, self.loss_mask, strict=True)]


class Pack:
    """The members' stacked weights, their optimizer and the shared training step, and the loop over steps."""

    def __init__(self, trials: list[TrialSetup], progress: list[Progress], rng: list[torch.Tensor], nan_at):
        self.trials, self.progress, self.rng, self.nan_at = trials, progress, rng, nan_at
        self.n = len(trials)
        self.runtime, self.steps = trials[0].runtime, trials[0].steps
        self.step = min(p.step for p in progress)
        self.ended: list[Diverged | dict | None] = [None] * self.n  # a member's outcome once it ended early
        models = [t.model for t in trials]
        for model in models:
            model.train()
        params, _ = stack_module_state(models)  # {name: (S, ...)} leaves, copies of each member's weights
        self.params: dict[str, torch.Tensor] = params
        self.buffers, self.batched_buffers = _buffers(models)
        # The shared module vmap calls with each member's slice: a copy, so the members' own models (used for
        # evaluation) keep the fused attention kernel.
        self.base = copy.deepcopy(models[0])
        for module in self.base.modules():
            if isinstance(module, Attention):
                module.explicit = True
        self.forward = vmap(self._one, in_dims=(0, 0 if self.batched_buffers else None, 0))
        self.names = list(params)
        self.decayed = {n for n in self.names if params[n].dim() - 1 >= 2}  # matrices per member
        # On a GPU, capturable: the whole step can then be one CUDA graph (packed_graph.py).
        kind = {"fused": True, "capturable": True} if self.runtime.on_cuda else {"foreach": True}
        # Rate 1, no decay: each step gives every element's Adam direction; `_apply_updates` scales it per member.
        betas = trials[0].train.betas
        self.optimizer = torch.optim.AdamW(list(params.values()), lr=1.0, weight_decay=0.0, betas=betas, **kind)
        self._import_optimizer_state()
        # Per-member constants and the learning rates of the step, as device tensors: the step reads them
        # there, so it can be captured in a CUDA graph (packed_graph.py) and replayed with new rates.
        device = self.runtime.device
        self.clip = torch.tensor([t.train.grad_clip for t in trials], device=device)
        self.clips = any(t.train.grad_clip > 0 for t in trials)
        self.decay = torch.tensor([t.train.weight_decay for t in trials], device=device)
        self.rates = torch.zeros(self.n, device=device)
        self.aux_terms = [t.config.model.family_params().aux_terms() for t in trials]  # what each member weighs
        self.graph: GraphedStep | None = None  # set below where the step can be one CUDA graph
        self.graph_problem = graph_problem(self)  # why it cannot (None: it can)
        if self.graph_problem is None:
            self.graph = GraphedStep(self)
        ids = {id(p): n for n, p in models[0].named_parameters()}
        self.grad_groups = {g: [ids[id(p)] for p in ps] for g, ps in trials[0].grad_groups.items()}
        self.held = self._hold_members_ahead()
        self.prefetcher: Prefetcher | None = None
        self.pending: list[TakenStep] = []  # steps taken since the last booking (`_book`)
        self.booked_at = time.perf_counter()

    # ------------------------------------------------------------------------------------- the loop

    def run(self, stores: list[Checkpoints | None], reporters: Sequence[Reporter]) -> list[dict[str, float] | Diverged]:
        self.stores = stores
        for i, trial in enumerate(self.trials):
            send_start(reporters[i], self.progress[i].step)
            if self.progress[i].step > 0:
                send_replay(reporters[i], self.progress[i].records)
            else:
                with self.member_rng(i):
                    self._deliver(i, before_first_step, trial, self.progress[i], reporters[i])
        self.prefetch_from(self.step)
        try:
            while self.step < self.steps and any(self.ended[i] is None for i in range(self.n)):
                self._release_held()  # the members whose step the pack has reached take part from this one
                self.pending.append(self.train_step(self.step))
                self.step += 1
                if self._booking_due():
                    self._book(stores, reporters)
        finally:
            self.stop_prefetch()
        for i in range(self.n):
            self.load_into(i)  # each member's model ends with its trained weights
        return [o if o is not None else self.summary(i) for i, o in enumerate(self.ended)]

    def live(self, i: int) -> bool:
        return self.ended[i] is None and i not in self.held

    def _booking_due(self) -> bool:
        """Whether the steps taken since the last booking are booked now: where a live member records,
        evaluates or saves a checkpoint (which need its values and its current weights), at the last step,
        or after `BOOK_EVERY` steps (heartbeats, divergence). Between bookings nothing is read back from
        the device: the losses stay tensors (one read per booking, not one per step)."""
        if self.step == self.steps or len(self.pending) >= BOOK_EVERY:
            return True
        for i in range(self.n):
            trial, store = self.trials[i], self.stores[i]
            if self.live(i) and (
                trial.record_due(self.step)
                or self.step % trial.ev.every == 0
                or (store is not None and store.due(self.step))
            ):
                return True
        return False

    def _book(self, stores: list[Checkpoints | None], reporters: Sequence[Reporter]) -> None:
        """Each member's bookkeeping for the steps taken since the last booking, in order (one device read)."""
        steps, self.pending = self.pending, []
        losses = torch.stack([taken.losses for taken in steps]).tolist()  # (steps, members): the one sync
        now = time.perf_counter()
        elapsed, self.booked_at = (now - self.booked_at) / len(steps), now
        for row, taken in zip(losses, steps, strict=True):
            for i in taken.members:
                if self.ended[i] is None:
                    self._after(i, taken, row[i], elapsed, stores[i], reporters[i])

    def _after(self, i: int, taken: TakenStep, loss: float, elapsed: float, store, reporter) -> None:
        """Member i's bookkeeping of one step: as `engine.train_step` ends, then `trainer.after_step`. Only a
        booking's last step can evaluate or save (`_booking_due`), so the weights loaded are that step's."""
        trial, progress, step = self.trials[i], self.progress[i], taken.step + 1
        if not math.isfinite(loss):
            self.ended[i] = Diverged(step, f"train loss is {loss} at step {step}")
            self.ended[i].metrics = self.summary(i)
            return
        tokens = taken.tokens[i]  # its own batch: its FLOPs and throughput count what it trained on
        progress.window.add(loss, elapsed, taken.aux[i], taken.grad_norms[i], taken.weights[i])
        progress.add_step(elapsed, tokens)
        lr = trial.lr(step - 1)
        evaluates = step % trial.ev.every == 0 or step == self.steps
        saves = store is not None and store.due(step)
        if evaluates or saves:
            self.load_into(i)
        if saves:
            self._export_optimizer(i, lr)
        with self.member_rng(i):
            self._deliver(i, after_step, trial, progress, store, reporter, lr, tokens)

    def _deliver(self, i: int, step_fn, *args: Any) -> None:
        """`step_fn(*args)` for member i; a `Diverged` its reporter raises ends that member only."""
        try:
            step_fn(*args)
        except Diverged as diverged:
            if diverged.metrics is None:
                diverged.metrics = self.summary(i)
            self.ended[i] = diverged

    def summary(self, i: int) -> dict[str, float]:
        return summary_metrics(self.trials[i], self.progress[i])

    @contextmanager
    def member_rng(self, i: int) -> Iterator[None]:
        """Inside, torch's global generator is member i's (as in its own run); its state is kept after."""
        torch.set_rng_state(self.rng[i])
        try:
            yield
        finally:
            self.rng[i] = torch.get_rng_state()

    # -------------------------------------------------------------------------------------- batches

    def prefetch_from(self, step: int) -> None:
        """Every member's batches made ahead, stacked, in one thread, where that pays (prefetch.py)."""
        if prefetch_enabled(self.runtime.device) and step < self.steps:
            self.prefetcher = Prefetcher(self._made, step, self.steps, device=self.runtime.device)

    def stop_prefetch(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
        self.prefetcher = None

    def _made(self, step: int) -> PackBatch:
        size = self.trials[0].train.batch_size
        return PackBatch.of([t.task.train_batch(step, size) for t in self.trials])

    def batches_of(self, step: int) -> PackBatch:
        """Every member's train batch of `step`, on the device (each what `TrialSetup.batch` gives its trial)."""
        made = self.prefetcher.get(step) if self.prefetcher is not None else self._made(step)
        if made.members is not None:  # per member, as each trial's own batch goes
            return PackBatch(members=[self.runtime.to_device(b) for b in made.members])
        if made.inputs is not None and made.inputs.device != self.runtime.device:
            return PackBatch(*(self.runtime.to_device(t) for t in (made.inputs, made.targets, made.loss_mask)))
        return made

    # ----------------------------------------------------------------------------------- the step

    def train_step(self, step: int) -> TakenStep:
        """One optimizer step of every member on its batch of `step` (nothing read back from the device):
        replayed as a CUDA graph where the pack has one (packed_graph.py), else run eagerly."""
        made = self.batches_of(step)
        batches = made.split()
        if isinstance(self.base, StepDependent):  # step-dependent state (MELT's alpha): the same for every member
            self.base.set_train_step(step)
            for trial in self.trials:  # and on each member's own model, which evaluates
                trial.step_hook(step)
        members = [i for i in range(self.n) if self.live(i)]
        self.rates.copy_(torch.tensor([t.lr(step) for t in self.trials]), non_blocking=True)
        weights = [aux_weights(step, t.train, terms) for t, terms in zip(self.trials, self.aux_terms, strict=True)]
        taken = self.graph.step(step, made, weights) if self.graph is not None else None
        if taken is None:
            self.optimizer.zero_grad(set_to_none=True)
            taken = self.step_body(made, self._draws(), weights, step)
        losses, grad_norms, aux = taken
        tokens = [b.inputs.numel() for b in batches]
        return TakenStep(step, members, losses, grad_norms, aux, weights, tokens)

    def step_body(self, made: PackBatch, draws: list[Any], weights: list[dict[str, float]], step: int):
        """The step's device work, and nothing that reads from the device or makes host tensors (a CUDA graph
        captures it as it is): forward, each member's objective, backward, clipping, AdamW. Returns the
        members' losses (S,), gradient norms and aux terms."""
        batches = made.split()
        with self.runtime.autocast(cache=self.graph is None):
            outputs = self._forward(batches, draws, made.inputs)
            losses, aux = [], []
            for i, (trial, batch, out) in enumerate(zip(self.trials, batches, outputs, strict=True)):
                task = trial.task if self.graph is None else DenseLoss(trial.task)  # a graph cannot index by mask
                for name, logits in out.aux_logits.items():  # extra predictions, scored like the main one
                    out.aux[name] = task.loss(logits, batch)
                loss = objective(task, out, batch, trial.train, weights[i])
                if self.nan_at[i] == step + 1:
                    loss = loss * float("nan")
                losses.append(loss)
                aux.append({name: term.detach() for name, term in out.aux.items()})
        torch.stack(losses).sum().backward()
        grad_norms = self._clip_and_measure()
        self._apply_updates()
        return torch.stack([loss.detach().float() for loss in losses]), grad_norms, aux

    def _draws(self) -> list[Any]:
        """Each live member's training draw, from its own generator state (None where the model draws nothing)."""
        if not isinstance(self.base, DrawsInTraining):
            return [None] * self.n
        draws = []
        for i in range(self.n):
            if not self.live(i):
                draws.append(None)  # computed and discarded: any draw will do, without touching its generator
                continue
            with self.member_rng(i):
                draws.append(self.base.draw_training())
        live = next((d for i, d in enumerate(draws) if self.live(i)), None)
        return [d if self.live(i) else live for i, d in enumerate(draws)]

    def _forward(self, batches: list[Batch], draws: list[Any], stacked: torch.Tensor | None) -> list[ModelOutput]:
        """Each member's training output; one vmap per group of members with equal input shapes and draws
        (`stacked`: every member's inputs as one tensor, where the batches came stacked)."""
        groups: dict[tuple, list[int]] = {}
        for i, batch in enumerate(batches):
            groups.setdefault((tuple(batch.inputs.shape), repr(draws[i])), []).append(i)
        outputs: list[ModelOutput] = [None] * self.n  # type: ignore[list-item]
        for members in groups.values():
            params, buffers = self.params, self.buffers
            if len(members) < self.n:
                index = torch.tensor(members, device=self.runtime.device)
                params = {name: p.index_select(0, index) for name, p in self.params.items()}
                if self.batched_buffers:
                    buffers = {name: b.index_select(0, index) for name, b in buffers.items()}
            whole = stacked is not None and len(members) == self.n
            tokens = stacked if whole else torch.stack([batches[i].inputs for i in members])
            with self.base.drawn(draws[members[0]]) if isinstance(self.base, DrawsInTraining) else _nothing():
                logits, terms, extra, exits = self.forward(params, buffers, tokens)
            for j, i in enumerate(members):
                outputs[i] = ModelOutput(
                    logits=logits[j],
                    aux={name: term[j] for name, term in terms.items()},
                    aux_logits={name: value[j] for name, value in extra.items()},
                    exits=[(out[j], w[j]) for out, w in exits],
                )
        return outputs

    def _one(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], tokens: torch.Tensor):
        out = functional_call(self.base, (params, buffers), (tokens,))
        return out.logits, out.aux, out.aux_logits, out.exits

    def _clip_and_measure(self) -> list[dict[str, torch.Tensor]]:
        """Per member: the watched groups' gradient norms before clipping, then its gradient clipped to its own
        `grad_clip` by the norm over its own slices (clip_grad_norm_: max_norm / (norm + 1e-6), at most 1)."""
        grads = {name: p.grad for name, p in self.params.items() if p.grad is not None}
        norms = {name: torch.linalg.vector_norm(g.flatten(1), dim=1) for name, g in grads.items()}  # (S,)
        measured: list[dict[str, torch.Tensor]] = [{} for _ in range(self.n)]
        for group, names in self.grad_groups.items():
            present = [norms[name] for name in names if name in norms]
            total = torch.linalg.vector_norm(torch.stack(present), dim=0) if present else self.clip * 0
            for i in range(self.n):
                measured[i][group] = total[i]
        clip = self.clip
        if grads and self.clips:
            total = torch.linalg.vector_norm(torch.stack(list(norms.values())), dim=0)
            coef = torch.where(clip > 0, (clip / (total + 1e-6)).clamp(max=1.0), torch.ones_like(clip))
            for g in grads.values():
                g.mul_(coef.view(-1, *([1] * (g.dim() - 1))).to(g.dtype))
        return measured

    @torch.no_grad()
    def _apply_updates(self) -> None:
        """AdamW per member: the optimizer (rate 1, no decay) moves each element by its Adam direction d; each
        member then takes p <- p (1 - lr wd) - lr d with its own lr (`self.rates`: its schedule at this step)
        and decay."""
        before = {name: p.detach().clone() for name, p in self.params.items()}
        self.optimizer.step()
        shape = lambda p: (-1, *([1] * (p.dim() - 1)))  # noqa: E731
        lr, decay = self.rates, self.decay
        for name, p in self.params.items():
            old = before[name]
            direction = old - p
            rate = lr.view(shape(p)).to(p.dtype)
            kept = (1 - lr * decay).view(shape(p)).to(p.dtype) if name in self.decayed else 1.0
            p.copy_(old * kept - rate * direction)
        for i, state in self.held.items():  # members ahead: as they were
            self._restore(i, state)

    # ------------------------------------------------------------------- members' own models and state

    @torch.no_grad()
    def load_into(self, i: int) -> None:
        """Copy member i's slice of the stacked weights into its own model (evaluated and saved unpacked)."""
        for name, p in self.trials[i].model.named_parameters():
            p.copy_(self.params[name][i])

    def _member_params(self, i: int) -> dict[str, torch.nn.Parameter]:
        return dict(self.trials[i].model.named_parameters())

    def _export_optimizer(self, i: int, lr: float) -> None:
        """Member i's optimizer holds its slice of the packed state, as its own run's would (for its checkpoint)."""
        own = self.trials[i].optimizer
        set_lr(own, lr)
        for name, p in self._member_params(i).items():
            packed = self.optimizer.state.get(self.params[name])
            if packed:
                own.state[p] = {k: (v.clone() if k == "step" else v[i].clone()) for k, v in packed.items()}

    def _import_optimizer_state(self) -> None:
        """Resumed members' optimizer states, stacked (fresh members: zeros, as AdamW starts)."""
        owns = [t.optimizer.state for t in self.trials]
        if not any(owns):
            return
        members = [self._member_params(i) for i in range(self.n)]
        for name in self.names:
            stacked = self.params[name]
            slices = [own.get(members[i][name], {}) for i, own in enumerate(owns)]
            self.optimizer.state[stacked] = {
                "step": torch.tensor(float(self.step), device=stacked.device if self.runtime.on_cuda else None),
                "exp_avg": torch.stack([s.get("exp_avg", torch.zeros_like(stacked[0])) for s in slices]),
                "exp_avg_sq": torch.stack([s.get("exp_avg_sq", torch.zeros_like(stacked[0])) for s in slices]),
            }

    def _hold_members_ahead(self) -> dict[int, dict[str, tuple[torch.Tensor, ...]]]:
        """Members resumed at a later step than the pack: their weights and optimizer state, put back after each
        shared step until the pack reaches their step."""
        return {i: self._snapshot(i) for i, p in enumerate(self.progress) if p.step > self.step}

    def _release_held(self) -> None:
        for i in [i for i in self.held if self.progress[i].step <= self.step]:
            del self.held[i]

    def _snapshot(self, i: int) -> dict[str, tuple[torch.Tensor, ...]]:
        out = {}
        for name, p in self.params.items():
            state = self.optimizer.state.get(p, {})
            out[name] = (p[i].detach().clone(), *(state[k][i].clone() for k in ("exp_avg", "exp_avg_sq") if k in state))
        return out

    def _restore(self, i: int, snapshot: dict[str, tuple[torch.Tensor, ...]]) -> None:
        for name, (weights, *moments) in snapshot.items():
            p = self.params[name]
            p[i].copy_(weights)
            state = self.optimizer.state.get(p, {})
            for key, value in zip(("exp_avg", "exp_avg_sq"), moments, strict=False):
                state[key][i].copy_(value)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _buffers(models: list[torch.nn.Module]) -> tuple[dict[str, torch.Tensor], bool]:
    """The buffers vmap gets: the first model's, shared, where every member's are equal (the looped core's
    rotary tables); else stacked per member."""
    first = dict(models[0].named_buffers())
    if all(all(torch.equal(first[n], b) for n, b in m.named_buffers()) for m in models[1:]):
        return first, False
    _, stacked = stack_module_state(models)
    return stacked, True
