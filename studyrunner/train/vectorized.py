"""Seeds trained together (`train.vectorize_seeds`): the S seeds of a cell in one process, as one
batched model. Knows models and tasks; nothing of Ray, MLflow or SQL.

Each seed is still its own trial: `run_trials_together(config, seeds, reporters)` sends each seed's
reporter the records `run_trial(config, seed, reporter)` sends (same names, same steps, same order of
calls: facts, start, the step-0 record, then per step its record and tick) and returns each seed's
final metrics, equal to a separate run's up to float rounding (tests/test_vectorized.py pins it).

How. Each seed's trial is built exactly as `run_trial` builds it (`trainer.build_trial`: the same
`torch.manual_seed(seed)`, task and model, so the same initial weights, batches and eval sets). The
seeds' parameters are stacked along a new leading dimension (`torch.func.stack_module_state`) and
one training step runs the shared model over all of them with `torch.func.vmap(functional_call)`:
each seed's batch (`task.train_batch(step, batch_size)` of its own task, stacked) through its own slice
of the weights. Then, per seed and exactly as `trainer.train_step` does: its loss (the task loss plus
its weighted aux terms), summed over seeds for one backward pass (the slices are separate leaves of
the sum, so each seed's gradient is its own loss's), its gradient norms before clipping, its gradient
clipped to `train.grad_clip` by the global norm over its own slices only, and AdamW (elementwise, so
one optimizer over the stacked tensors is S optimizers; weight decay on the parameters that are
matrices per seed, as `optim.make_optimizer`) with the same learning-rate schedule.
Under vmap, attention runs as explicit matmuls (`core.Attention.explicit`): the fused CPU kernel
has no batching rule. Seeds whose batches differ in shape at a step (a task that draws its sequence
length per step from the seed, e.g. addition with several train_operands) run in one vmap per shape.
Evaluation is per seed, unbatched: the seed's current weights are copied into its own model and
`evaluation.evaluate_and_record` runs on it, the code and kernels `run_trial` uses.

What differs from separate trials:
- Float rounding: batched matmuls and the explicit attention sum in another order than the separate
  trial's kernels, so losses agree to ~1e-6 relative, not bit for bit; an eval accuracy can move by an
  example where two logits nearly tie.
- Throughput figures are of the batch of seeds: `step_time_ms` is the wall time of the shared step
  (which trains every seed), `tokens_per_sec` the tokens of every seed's batch per second of it; each
  seed reports the same values. `train_time_s` is likewise the shared training time. FLOPs are each
  seed's own (flops.py): counted on its own model as `run_trial` counts them, `train_flops` over its own
  batches, so they equal a separate run's.
- A seed whose train loss is not finite (or whose reporter raises `Diverged`) stops reporting at that
  step and its entry in the returned list is that `Diverged` (metrics filled in); the other seeds train
  on unaffected (nothing crosses between seeds' slices). It stays in the batch, computing nothing used.

Refused with a `ValueError` naming `train.vectorize_seeds` (`check_vectorizable`): families other than
`looped` (the halting families `ut_act` and `adaptive_layers` halt each seed's examples at different
depths, with data-dependent control flow vmap cannot batch across seeds; others are unchecked),
anything that declares a halting (ponder) term, `train.compile` other than none, dropout (the seeds
would share one random stream, so they could not reproduce their separate runs), and checkpoints (not
supported together yet: a group that fails restarts from step 0; `train.checkpoint_every` has no
effect here).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.func import functional_call, stack_module_state, vmap

from ..models.core import Attention
from ..tasks import Batch
from .config import TrialConfig
from .evaluation import evaluate_and_record
from .outcomes import Diverged
from .prefetch import Prefetcher, prefetch_enabled
from .reporter import Reporter, send_facts, send_start, send_tick
from .schedules import aux_weights
from .trainer import TrialSetup, build_trial, summary_metrics
from .trial_progress import Progress

__all__ = ["KNOB", "check_vectorizable", "run_trials_together"]

KNOB = "train.vectorize_seeds"
FAMILIES = ("looped",)  # checked to train exactly as separate trials (tests/test_vectorized.py)
_HALTING = ("ut_act", "adaptive_layers")


def check_vectorizable(config: TrialConfig | Mapping[str, Any], *, checkpoints: object = None) -> None:
    """Raise `ValueError` (naming train.vectorize_seeds) where a cell's seeds cannot train together. `config`:
    the resolved config (the compiler asks with the dict), or it read (`TrialConfig.of`)."""
    config = TrialConfig.of(config)
    family = config.model.family
    if family in _HALTING:
        raise ValueError(
            f"{KNOB}: family {family!r} is a halting family: each seed halts its examples at different depths, "
            "with data-dependent control flow that cannot be batched across seeds; train its seeds separately "
            "(unset train.vectorize_seeds)"
        )
    if family not in FAMILIES:
        raise ValueError(
            f"{KNOB}: family {family!r} is not supported; seeds are trained together for "
            f"{', '.join(FAMILIES)} only (the families checked to train exactly as separate trials)"
        )
    params = config.model.family_params()
    if "ponder" in params.aux_terms() or "ponder_steps_fraction" in params.diagnostic_names():
        raise ValueError(f"{KNOB}: this model halts (it has a ponder term); halting seeds cannot be batched")
    if params.dropout:
        raise ValueError(
            f"{KNOB} needs model.params.dropout 0 (got {params.dropout}): seeds trained together would draw "
            "their dropout masks from one random stream, so they could not reproduce their separate runs"
        )
    compile_mode = config.train.compile or "none"
    if compile_mode != "none":
        raise ValueError(f"{KNOB} does not work with train.compile ({compile_mode!r}); unset one of them")
    if checkpoints is not None:
        raise ValueError(
            f"{KNOB}: checkpoints are not supported for seeds trained together yet (a group that fails "
            "restarts from step 0); train without a checkpoint location, or unset train.vectorize_seeds"
        )


def run_trials_together(
    config: dict[str, Any] | TrialConfig,
    seeds: Sequence[int],
    reporters: Sequence[Reporter],
    *,
    device: str | torch.device | None = None,
    checkpoints: object = None,
    nan_at: Mapping[int, int] | None = None,
) -> list[dict[str, float] | Diverged]:
    """Train the seeds of one cell together; one reporter per seed; each seed's final metrics.

    A seed that diverged has its `Diverged` (metrics filled in) in its place instead (module
    docstring). `device` as in `run_trial`. `checkpoints` is refused (not supported together yet).
    `nan_at` is the testing hook of `run_trial`, per seed: {seed: 1-based step whose loss is made NaN}.
    """
    config = TrialConfig.of(config)  # read once, for every seed's trial
    check_vectorizable(config, checkpoints=checkpoints)
    seeds = list(seeds)
    if not seeds or len(reporters) != len(seeds):
        raise ValueError(f"{KNOB}: one reporter per seed is needed; got {len(seeds)} seeds, {len(reporters)} reporters")
    trials = [build_trial(config, seed, device) for seed in seeds]
    for trial, reporter in zip(trials, reporters, strict=True):
        send_facts(reporter, {**trial.runtime.facts(), **trial.data_facts(), "seeds_together": str(len(seeds))})
    group = _Group(trials, [(nan_at or {}).get(seed) for seed in seeds])
    progress = [Progress() for _ in seeds]
    outcome: list[Diverged | None] = [None] * len(seeds)

    def summary(i: int) -> dict[str, float]:  # FLOPs over the seed's own batches, not every seed's
        return summary_metrics(trials[i], progress[i], tokens=group.member_tokens[i])

    def deliver(i: int, send, *args: Any) -> None:
        """`send(seed i's reporter, *args)`; a `Diverged` the reporter raises ends that seed only."""
        try:
            send(reporters[i], *args)
        except Diverged as diverged:
            if diverged.metrics is None:
                diverged.metrics = summary(i)
            outcome[i] = diverged

    for i, trial in enumerate(trials):
        deliver(i, send_start, 0)
        deliver(i, _log, 0, dict(trial.static))
    group.prefetch_from(0)
    try:
        first = trials[0]
        while group.step < first.steps and any(o is None for o in outcome):
            step = group.step
            lr = first.lr(step)
            losses, aux, grad_norms, weights, elapsed, tokens = group.train_step(step, lr)
            done = step + 1
            group.step = done
            for i in range(len(trials)):
                if outcome[i] is not None:
                    continue
                if not math.isfinite(losses[i]):
                    outcome[i] = Diverged(done, f"train loss is {losses[i]} at step {done}")
                    outcome[i].metrics = summary(i)
                    continue
                progress[i].window.add(losses[i], elapsed, aux[i], grad_norms[i], weights)
                progress[i].add_step(elapsed, tokens)
                group.member_tokens[i] += group.step_tokens[i]
            due_eval = done % first.ev.every == 0 or done == first.steps
            for i, trial in enumerate(trials):
                if outcome[i] is not None:
                    continue
                record = progress[i].window.record(lr, tokens) if trial.record_due(done) else {}
                if due_eval:
                    group.load_into(i)
                with trial.runtime.autocast():
                    record.update(_eval_record(trial, done))
                if record:
                    progress[i].last.update(record)
                    deliver(i, _log, done, record)
                if outcome[i] is None:
                    deliver(i, send_tick, done)
    finally:
        group.stop_prefetch()
    for i in range(len(trials)):
        group.load_into(i)  # each seed's model ends with its trained weights
    return [o if o is not None else summary(i) for i, o in enumerate(outcome)]


def _log(reporter: Reporter, step: int, record: dict[str, float]) -> None:
    reporter.log(step, record)


def _eval_record(trial: TrialSetup, done: int) -> dict[str, float]:
    return evaluate_and_record(trial.model, trial.task, trial.splits, done, trial.steps, trial.ev)


class _Group:
    """The seeds' stacked weights, their optimizer and the batched training step."""

    def __init__(self, trials: list[TrialSetup], nan_at: list[int | None]):
        self.trials, self.nan_at, self.step = trials, nan_at, 0
        self.train = trials[0].train
        self.runtime = trials[0].runtime
        models = [t.model for t in trials]
        for model in models:
            model.train()
        params, _ = stack_module_state(models)  # {name: (S, ...)} leaves, copies of each seed's weights
        self.params: dict[str, torch.Tensor] = params
        self.buffers, self.batched_buffers = _buffers(models)
        # The shared module vmap calls with each seed's slice: a copy, so the seeds' own models (used
        # for evaluation) keep the fused attention kernel.
        self.base = copy.deepcopy(models[0])
        for module in self.base.modules():
            if isinstance(module, Attention):
                module.explicit = True
        self.forward = vmap(self._one, in_dims=(0, 0 if self.batched_buffers else None, 0))
        # Weight decay on what is a matrix per seed (the stacked tensor has one dimension more).
        names = list(params)
        decayed = [params[n] for n in names if params[n].dim() - 1 >= 2]
        plain = [params[n] for n in names if params[n].dim() - 1 < 2]
        t = self.train
        groups = [{"params": decayed, "weight_decay": t.weight_decay}, {"params": plain, "weight_decay": 0.0}]
        kind = {"fused": True} if self.runtime.on_cuda else {"foreach": True}
        self.optimizer = torch.optim.AdamW(groups, lr=t.lr, betas=t.betas, **kind)
        # Watched gradient groups (`grad_norm_groups()`), by parameter name; the same for every seed.
        ids = {id(p): n for n, p in models[0].named_parameters()}
        self.grad_groups = {g: [ids[id(p)] for p in ps] for g, ps in trials[0].grad_groups.items()}
        self.prefetchers: list[Prefetcher] = []
        # Input tokens of each seed's own batches: at the latest step, and over the steps each seed has taken.
        self.step_tokens, self.member_tokens = [0] * len(trials), [0] * len(trials)

    def _one(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], tokens: torch.Tensor):
        out = functional_call(self.base, (params, buffers), (tokens,))
        return out.logits, out.aux

    # ------------------------------------------------------------------------------------ batches

    def prefetch_from(self, step: int) -> None:
        """Each seed's batches made ahead in a thread of its own, where that pays (prefetch.py)."""
        steps, size = self.trials[0].steps, self.train.batch_size
        if prefetch_enabled(self.runtime.device) and step < steps:
            self.prefetchers = [
                Prefetcher(lambda s, task=t.task: task.train_batch(s, size), step, steps, device=self.runtime.device)
                for t in self.trials
            ]

    def stop_prefetch(self) -> None:
        for prefetcher in self.prefetchers:
            prefetcher.close()
        self.prefetchers = []

    def batches_of(self, step: int) -> list[Batch]:
        """Every seed's train batch of `step`, on the device (what `TrialSetup.batch` gives each)."""
        if self.prefetchers:
            return [prefetcher.get(step) for prefetcher in self.prefetchers]
        return [t.runtime.to_device(t.task.train_batch(step, self.train.batch_size)) for t in self.trials]

    # ------------------------------------------------------------------------------------- a step

    def train_step(self, step: int, lr: float):
        """One optimizer step of every seed on its batch of `step`: (losses, aux, grad norms per seed,
        aux weights, elapsed seconds, tokens of all seeds' batches)."""
        started = time.perf_counter()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batches = self.batches_of(step)
        n = len(batches)
        with self.runtime.autocast():
            logits, aux = self._forward(batches)
            weights = aux_weights(step, self.train, aux[0])
            losses = []
            for i, (trial, batch) in enumerate(zip(self.trials, batches, strict=True)):
                loss = trial.task.loss(logits[i], batch)
                for name, term in aux[i].items():
                    loss = loss + weights[name] * term
                if self.nan_at[i] == step + 1:
                    loss = loss * float("nan")
                losses.append(loss)
        self.optimizer.zero_grad(set_to_none=True)
        torch.stack(losses).sum().backward()
        grads = {name: p.grad for name, p in self.params.items() if p.grad is not None}
        norms = {name: torch.linalg.vector_norm(g.flatten(1), dim=1) for name, g in grads.items()}  # (S,)
        grad_norms = [{} for _ in range(n)]
        for group, names in self.grad_groups.items():
            present = [norms[name] for name in names if name in norms]
            total = torch.linalg.vector_norm(torch.stack(present), dim=0) if present else torch.zeros(n)
            for i in range(n):
                grad_norms[i][group] = total[i]
        clip = self.train.grad_clip
        if clip > 0 and grads:
            # Per seed, as clip_grad_norm_ over that seed's parameters: max_norm / (norm + 1e-6), at most 1.
            total = torch.linalg.vector_norm(torch.stack(list(norms.values())), dim=0)
            coef = (clip / (total + 1e-6)).clamp(max=1.0)
            for g in grads.values():
                g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))
        self.optimizer.step()
        loss_values = torch.stack([loss.detach().float() for loss in losses]).tolist()
        elapsed = time.perf_counter() - started
        tokens = sum(b.inputs.numel() for b in batches)
        self.step_tokens = [b.inputs.numel() for b in batches]
        return loss_values, aux, grad_norms, weights, elapsed, tokens

    def _forward(self, batches: list[Batch]) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
        """Each seed's logits and aux terms; one vmap over the seeds whose inputs share a shape."""
        shapes: dict[tuple[int, ...], list[int]] = {}
        for i, batch in enumerate(batches):
            shapes.setdefault(tuple(batch.inputs.shape), []).append(i)
        logits: list[torch.Tensor] = [None] * len(batches)  # type: ignore[list-item]
        aux: list[dict[str, torch.Tensor]] = [{} for _ in batches]
        for members in shapes.values():
            if len(members) == len(batches):
                params, buffers = self.params, self.buffers
            else:
                index = torch.tensor(members, device=self.runtime.device)
                params = {name: p.index_select(0, index) for name, p in self.params.items()}
                buffers = self.buffers
                if self.batched_buffers:
                    buffers = {name: b.index_select(0, index) for name, b in buffers.items()}
            tokens = torch.stack([batches[i].inputs for i in members])
            out, terms = self.forward(params, buffers, tokens)
            for j, i in enumerate(members):
                logits[i] = out[j]
                aux[i] = {name: term[j] for name, term in terms.items()}
        return logits, aux

    # --------------------------------------------------------------------------------- evaluation

    @torch.no_grad()
    def load_into(self, i: int) -> None:
        """Copy seed i's slice of the stacked weights into its own model (evaluated unbatched)."""
        for name, p in self.trials[i].model.named_parameters():
            p.copy_(self.params[name][i])


def _buffers(models: list[torch.nn.Module]) -> tuple[dict[str, torch.Tensor], bool]:
    """The buffers vmap gets: the first model's, shared, where every seed's are equal (the looped core's
    rotary tables); else stacked per seed."""
    first = dict(models[0].named_buffers())
    if all(all(torch.equal(first[n], b) for n, b in m.named_buffers()) for m in models[1:]):
        return first, False
    _, stacked = stack_module_state(models)
    return stacked, True
