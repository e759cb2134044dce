"""Train one trial from its resolved config. Knows models and tasks; nothing of Ray, MLflow or SQL.

Metric names are the product's vocabulary (docs/reference/metrics.md): train_loss, eval_loss, eval_accuracy,
eval_exact_match, params, effective_depth, tokens_per_sec, step_time_ms, plus per-split suffixes
(eval_accuracy_n8) and whatever diagnostics the model family returns. The final metrics add the training
FLOPs, counted once on the model as built (flops.py): train_flops, flops_per_token, flops_per_token_forward.

The config is the cell's compiled dict, read once, where a trial is built, into frozen section models
(config.py: `TrialConfig`, with `task`, `model`, `train` and `eval`) that the trainer reads by field; the
dict stays the trial's recorded form (its checkpoints are matched against it).

The family stays unnamed here: the model returns raw auxiliary terms by name (weighted by
`schedules.aux_weights`, logged as train_{term} and {term}_weight), may name parameter groups
whose gradient norm is worth watching (`grad_norm_groups()`, logged as {group}_grad_norm), and
fills its diagnostics when evaluated (`forward(..., diagnose=True)`). Its optional hooks are the
protocols of hooks.py.

With a checkpoint location, a trial writes checkpoints (checkpoint.py) and resumes from the newest
intact one: its later records and final metrics are those of a run that never stopped (wall-clock
timings aside).

A non-finite train loss (NaN or +-inf) ends the trial with `outcomes.Diverged`, which carries the
metrics known at that point (`summary_metrics`): a diverged seed is a data point, not a crash. A
reporter may raise `Diverged` too (the study's `divergence:` rule); `run_trial` fills in its metrics.

Device, precision and compile mode (`train.device`, `train.precision`, `train.compile`) are resolved
in device.py: the model is built on the CPU (so its initial weights do not depend on the device),
then moved; eval sets are generated once and kept on the device; each train batch is generated on
the CPU and copied, ahead of its step in a background thread where that pays (prefetch.py: on CUDA).
How the trial computed is sent once per attempt, before any record, to the reporter's optional
`facts` (device name, precision, compile mode, torch.backends switches).

What computes each optimizer step and checkpoint is the trial's engine (engine.py, `train.engine`):
the plain loop in this process, or DeepSpeed, where every data-parallel worker runs this same
`run_trial` and only the leader (rank 0) reports; stopping is agreed between workers.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..models import build_model, count_params
from ..tasks import build_task
from .checkpoint import (
    Checkpoints,
    CheckpointStorage,
    final_weights,
    open_storage,
)
from .config import ModelConfig, TrialConfig
from .device import Runtime
from .engine import PlainEngine, train_step
from .engine import capture_state as _capture  # noqa: F401 - benchmarks/utilisation.py times it
from .evaluation import EVAL_CHUNK, evaluate, evaluate_and_record, teacher_scores
from .flops import count_trial, depth_due, sample_depth, trial_metrics
from .hooks import Configurable, StepDependent, WatchesGradients
from .optim import make_optimizer
from .outcomes import Diverged
from .reporter import (
    MemoryReporter,
    Reporter,
    SilentReporter,
    send_checkpointed,
    send_facts,
    send_note,
    send_replay,
    send_start,
    send_tick,
)
from .setup import Engine, TrialSetup
from .trial_progress import Progress

__all__ = [
    "EVAL_CHUNK",
    "HALT_COLLAPSE_FRACTION",
    "Diverged",
    "TrialConfig",
    "TrialSetup",
    "build_trial",
    "evaluate",
    "run_trial",
    "summary_metrics",
    "train_step",
]

# halt_collapsed = 1 when the final mean halting depth is below this fraction of the loops (the
# shallow-halt trap of seed 003: trapped runs halt at 5-7 of 18 steps, healthy ones at 11-18).
HALT_COLLAPSE_FRACTION = 0.5

CheckpointsArg = str | os.PathLike[str] | CheckpointStorage | Checkpoints | None


def run_trial(
    config: dict[str, Any] | TrialConfig,
    seed: int,
    reporter: Reporter | None = None,
    checkpoints: CheckpointsArg = None,
    *,
    device: str | torch.device | None = None,
    nan_at: int | None = None,
    teacher: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Train and evaluate one (cell config, seed); report records as it goes; return final metrics.

    `config` is the cell's resolved config as compiled (a dict: its recorded form, which checkpoints are
    matched against), read once here as a `config.TrialConfig` (or given as one, `TrialConfig.of`).

    On CPU the same (config, seed, thread count) gives the same final metrics. `checkpoints` (a
    folder, a pyarrow filesystem URI, or a storage object; one per trial) turns checkpointing on:
    every `train.checkpoint_every` steps (unset: about every tenth of the run) and after the last
    step, and a resume from the newest intact checkpoint found there. Records up to that checkpoint
    are not sent again.

    `device` is the device the caller assigned the trial (the Ray trainable: the GPU Ray gave it, or
    "cpu"); None = none assigned. With `train.device: auto` the trial trains there, or on a visible
    GPU when nothing was assigned (device.py has the rules).

    Raises `Diverged` (with the metrics so far) when the train loss is not finite, or when the
    reporter raises it. `nan_at` is a testing hook (STUDYRUNNER_INJECT_NAN): the loss of that step
    (1-based) is made NaN before its backward pass, so divergence handling runs for real.

    `teacher` (a `melt` cell whose `model.params.teacher` names a finished `looplm` trial): that trial's
    `config`, `seed` and `checkpoint` location, resolved by the orchestrator (which knows the ledger and
    the storage); the student starts from the weights of its final checkpoint and distils from it.
    """
    reporter = reporter or MemoryReporter()
    config = TrialConfig.of(config)
    trial = build_trial(config, seed, device, teacher)
    trial.nan_at = nan_at
    if not trial.engine.leader:  # another worker of a distributed trial reports for it
        reporter = SilentReporter()
    send_facts(reporter, {**trial.runtime.facts(), **trial.engine.facts(), **trial.data_facts()})
    store = open_checkpoints(checkpoints, config, seed, reporter)
    progress = trial.engine.resume(store, trial) if store is not None else Progress()
    send_start(reporter, progress.step)
    if progress.step > 0:
        send_replay(reporter, progress.records)
    trial.prefetch_from(progress.step)
    try:
        _train(trial, progress, store, reporter)
    except Diverged as diverged:
        if diverged.metrics is None:  # raised by the reporter, which does not know the trial
            diverged.metrics = summary_metrics(trial, progress)
        raise
    finally:
        trial.stop_prefetch()
    return summary_metrics(trial, progress)


def _train(trial: TrialSetup, progress: Progress, store: Checkpoints | None, reporter: Reporter) -> None:
    if progress.step == 0:
        before_first_step(trial, progress, reporter)
    trial.model.train()
    while progress.step < trial.steps:
        lr, tokens = trial.engine.step(trial, progress)
        after_step(trial, progress, store, reporter, lr, tokens)


def before_first_step(trial: TrialSetup, progress: Progress, reporter: Reporter) -> None:
    """A fresh trial's step-0 record (its static facts) and, for a halting model, its depth before training."""
    _log(trial, reporter, progress, 0, dict(trial.static))
    trial.model.train()
    sample_depth(trial, progress, 0)


def after_step(
    trial: TrialSetup, progress: Progress, store: Checkpoints | None, reporter: Reporter, lr: float, tokens: int
) -> None:
    """What a trial does after each optimizer step, whoever took it (this loop, or a pack's shared step:
    vectorized.py): its train record when due, evaluation, a halting model's realised depth, the record sent,
    the checkpoint and the tick. Raises `Diverged` where the reporter's divergence rule holds."""
    done = progress.step
    record = progress.window.record(lr, tokens) if trial.record_due(done) else {}
    with trial.runtime.autocast():
        record.update(evaluate_and_record(trial.model, trial.task, trial.splits, done, trial.steps, trial.ev))
    if depth_due(trial, done):  # before the checkpoint, which keeps it
        sample_depth(trial, progress, done)
    if record:
        progress.last.update(record)
        _log(trial, reporter, progress, done, record)
    if store is not None and store.due(done):  # after the record: it is never lost, at worst resent
        trial.engine.save(store, trial, progress)
        send_checkpointed(reporter, done)
    send_tick(reporter, done)


def _log(trial: TrialSetup, reporter: Reporter, progress: Progress, step: int, record: dict[str, float]) -> None:
    progress.records.append({"step": step, **record})  # before `log`, which may raise Diverged
    try:
        reporter.log(step, record)
    except Diverged:
        trial.engine.agree(True)
        raise
    if trial.engine.agree(False):  # the reporting worker's divergence rule held: every worker stops
        raise Diverged(step, f"the divergence rule held at step {step} (on the reporting worker)")


def build_trial(
    config: dict[str, Any] | TrialConfig,
    seed: int,
    device: str | torch.device | None = None,
    teacher: dict[str, Any] | None = None,
) -> TrialSetup:
    config = TrialConfig.of(config)  # the resolved dict read once; a TrialConfig as it is
    train, ev = config.train, config.eval
    runtime = Runtime.resolve(train, device)  # first: a trial that cannot run fails before any work
    runtime.apply_backends()
    torch.manual_seed(seed)
    task = build_task(config.task.name, config.task.params, seed)
    model = build_model(config.model.family, config.model.params, task.facts).to(runtime.device)
    teacher_model = None
    if config.model.teacher is not None:
        if teacher is None:
            raise ValueError(
                f"model.params.teacher {config.model.teacher!r} was not resolved to a checkpoint; "
                "submit the study through studyrunner, or pass run_trial(teacher=...)"
            )
        teacher_model = load_teacher(teacher, task.facts, runtime.device)
        model.convert_from(teacher_model)
    if isinstance(model, Configurable):  # a family that reads train/eval knobs of its own (train.trajectory)
        resolved = config.resolved  # the family reads the resolved sections (models/registry.py)
        model.configure(resolved["train"], resolved["eval"])
    optimizer = make_optimizer(
        model,
        train.lr,
        train.weight_decay,
        train.betas,
        fused=runtime.on_cuda,
        lr_groups=train.lr_groups,
        param_groups=config.model.family_params().param_groups(),
    )
    held_out = task.validation_sets if ev.split == "validation" else task.eval_sets  # tune: validation
    splits = {name: runtime.to_device(batch) for name, batch in held_out(ev.examples).items()}
    static = {
        "params": float(count_params(model)),
        "effective_depth": float(model.effective_depth),
        "weights_bytes": float(weights_bytes(model)),
    }
    if teacher_model is not None:  # scored once: the student's claims can name its teacher's numbers
        with runtime.autocast():
            static.update(teacher_scores(teacher_model, task, splits))
    grad_groups = model.grad_norm_groups() if isinstance(model, WatchesGradients) else {}
    step_model = runtime.compiled(model)
    trial = TrialSetup(config, task, model, optimizer, splits, static, grad_groups, runtime, step_model)
    trial.step_hook = model.set_train_step if isinstance(model, StepDependent) else None
    trial.flops = count_trial(trial)  # on the model as built: no engine has wrapped it yet (flops.py)
    trial.engine = make_engine(trial)  # last: DeepSpeed takes over the model and optimizer built above
    return trial


def make_engine(trial: TrialSetup) -> Engine:
    """The engine `train.engine` names (engine.py); deepspeed is imported only for the trials that use it."""
    if trial.train.engine == "deepspeed":
        from .deepspeed_engine import DeepSpeedEngine

        return DeepSpeedEngine(trial)
    return PlainEngine()


def weights_bytes(model: torch.nn.Module) -> int:
    """Bytes of the distinct parameters (a looped block counted once), in the dtype they are stored in."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def load_teacher(teacher: dict[str, Any], facts, device: torch.device) -> torch.nn.Module:
    """The teacher model of a conversion, with the weights of its trial's final checkpoint. `teacher` is what
    the orchestrator resolved (orchestrate/teachers.py): the teacher trial's resolved `config` (its recorded
    form, which its checkpoints' identity is), `seed` and `checkpoint` location."""
    recorded = teacher["config"]
    spec = ModelConfig.of(recorded["model"])  # only its model is read: the rest is its own study's
    with torch.random.fork_rng(devices=[]):  # building it must not move the student's random streams
        model = build_model(spec.family, spec.params, facts)
    model.load_state_dict(final_weights(teacher["checkpoint"], recorded, teacher["seed"]))
    return model.to(device)


def summary_metrics(trial: TrialSetup, progress: Progress, *, tokens: int | None = None) -> dict[str, float]:
    """The latest value of every reported name, the static facts, throughput and FLOPs (flops.py), over the
    steps taken so far: a trial's final metrics once it finished. Throughput is left out while no step was
    timed. `tokens`: the input tokens of the trial's own training batches, where `progress.total_tokens`
    counts more (seeds trained together)."""
    final = {**progress.last, **trial.static, **trial_metrics(trial, progress, tokens)}
    if progress.step > 0 and progress.total_time > 0:
        final["step_time_ms"] = 1000 * progress.total_time / progress.step
        final["tokens_per_sec"] = progress.total_tokens / progress.total_time
    final["train_time_s"] = progress.total_time
    final.pop("lr", None)
    if "ponder_steps_fraction" in progress.last:  # a halting model: did its halting depth collapse?
        threshold = trial.ev.halt_collapse_fraction or HALT_COLLAPSE_FRACTION
        final["halt_collapsed"] = float(progress.last["ponder_steps_fraction"] < threshold)
    return final


# ----------------------------------------------------------------------------------- checkpoints


def open_checkpoints(
    checkpoints: CheckpointsArg, config: TrialConfig, seed: int, reporter: Reporter
) -> Checkpoints | None:
    if checkpoints is None or isinstance(checkpoints, Checkpoints):
        return checkpoints
    return Checkpoints(
        open_storage(checkpoints),
        config=config.resolved,  # the recorded form: a checkpoint's identity is the compiled dict
        seed=seed,
        every=config.train.checkpoint_every,
        notify=lambda message: send_note(reporter, message),
    )
