"""One Ray Tune run: the payload each Tune trial's worker gets (`trial_payloads`) and the Tuner over them
(`fit_trials`), recorded on the driver by the recorder."""

from __future__ import annotations

import hashlib
import time

from ...train.packing import pack_groups, pack_key
from ...workspace import Workspace, checkpoint_location
from ..run_types import RunOptions
from ..submission import HEARTBEAT_S
from ..teachers import teacher_key
from .capacity import concurrent_runs, trial_resources, trials_at_once
from .driver_callback import CancelStopper
from .faults import driver_kills, fault_injected, injections_for
from .progress_display import ProgressDisplay
from .recorder import Recorder
from .warm_workers import tune_actors_on_warm_workers


def trial_payloads(study, to_run, workspace: Workspace, teachers: dict | None = None) -> list[dict]:
    """What each Tune trial's worker gets: the resolved config, seed and the knobs of how it runs (and a
    conversion's teacher, orchestrate/teachers.py); trials with `train.pack` go as packs of at most
    `train.pack_size` (one process trains each pack as one batched model: train/packing.py says which pack)."""
    driver_kills()  # a malformed fault-injection setting fails now, not mid-study
    single = [
        {
            "trial_key": t.trial_key,
            "seed": t.seed,
            "cell": t.config,
            "threads": study.resources.cpu,
            "checkpoint_dir": checkpoint_location(workspace.storage, study.name, t.trial_key),
            "divergence": study.divergence,
            "heartbeat_s": HEARTBEAT_S,
            "inject_fault": fault_injected(t.trial_key),
            "inject": injections_for(t.trial_key),
        }
        for t in to_run
    ]
    for trial, payload in zip(to_run, single, strict=True):
        if (key := teacher_key(trial.config)) is not None:
            payload["teacher"] = (teachers or {})[key]
        if trial.config["train"].get("engine") == "deepspeed":
            from .distributed import distributed_payload

            payload.update(distributed_payload(study.resources, workspace.ray_storage()))
    by_key = {t.trial_key: p for t, p in zip(to_run, single, strict=True)}
    # a trial with injected faults runs alone
    faulty = {k for k, p in by_key.items() if p["inject_fault"] or p["inject"]}
    injected = [t for t in to_run if t.trial_key in faulty]
    packs, alone = pack_groups([t for t in to_run if t.trial_key not in faulty])
    payloads = [by_key[t.trial_key] for t in (*injected, *alone)]
    for members in packs:
        key = pack_key(members[0].config, members[0].cell_hash)
        payloads.append(_pack_payload(study.name, key, [by_key[t.trial_key] for t in members]))
    return payloads


def _pack_payload(study_name: str, key: str, members: list[dict]) -> dict:
    """One Tune trial for a pack: its members' payloads, named after the pack and its members."""
    first = members[0]
    digest = hashlib.sha256(" ".join(m["trial_key"] for m in members).encode()).hexdigest()[:8]
    return {
        **{k: first[k] for k in ("cell", "threads", "divergence", "heartbeat_s")},
        "trial_key": f"{study_name}-{key}-{digest}-x{len(members)}",
        "group": members,
    }


def fit_trials(
    study,
    to_run,
    recorder: Recorder,
    workspace: Workspace,
    options: RunOptions,
    cancel,
    console,
    feed=None,
    teachers=None,
) -> None:
    """One Tune run over `to_run`: a trial per trial_key, recorded on the driver by `recorder`; with a `feed`
    (feeds/feed.py), then the trials it brings. `teachers`: conversions' teacher checkpoints
    (orchestrate/teachers.py)."""
    from ray import tune

    from .trainable import trainable

    steps = {t.trial_key: t.config["train"]["steps"] for t in to_run}
    progress = ProgressDisplay(steps, console=console, live=options.show_progress)
    callbacks = [recorder, progress]
    retries = study.retries if options.max_failures is None else options.max_failures
    distributed = study.resources.workers is not None
    if distributed:  # a DeepSpeed trial's Tune trial reserves little: its Train workers reserve the rest
        resources = lambda config: tune.PlacementGroupFactory([trial_resources(study.resources, config["trial"])])  # noqa: E731
    else:
        resources = trial_resources(study.resources)
    if feed is None:
        trials = {"param_space": {"trial": tune.grid_search(trial_payloads(study, to_run, workspace, teachers))}}
    else:

        def admit(cell, trials) -> None:
            recorder.admit(cell, trials)
            progress.admit({t.trial_key: t.config["train"]["steps"] for t in trials})

        payloads = lambda trials: trial_payloads(study, trials, workspace, teachers)  # noqa: E731
        feed.slots = trials_at_once(study.resources)
        trials = {"search_alg": feed.searcher(to_run, payloads=payloads, admit=admit), "num_samples": -1}
        # Tune starts one trial of a searcher's at a time unless told how many may run: a configuration's seeds
        # would run one after another.
        trials["max_concurrent_trials"] = options.max_concurrent or feed.slots
    concurrent = options.max_concurrent or (concurrent_runs(study.resources) if distributed else None)
    trials.setdefault("max_concurrent_trials", concurrent)
    tuner = tune.Tuner(
        tune.with_resources(trainable, resources),
        param_space=trials.pop("param_space", None),
        tune_config=tune.TuneConfig(
            **trials,
            reuse_actors=True,
            trial_name_creator=lambda trial: trial.config["trial"]["trial_key"],
            trial_dirname_creator=lambda trial: trial.config["trial"]["trial_key"],
        ),
        run_config=tune.RunConfig(
            name=f"{study.name}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=workspace.ray_storage(),
            callbacks=callbacks,
            stop=CancelStopper(cancel),
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=retries),
        ),
    )
    with progress, tune_actors_on_warm_workers():
        tuner.fit()
    # Trials Tune did not finish (Ctrl-C, `cancel`, a cluster that went away) are released by the
    # submission: pending (or cancelled) in the ledger, and so in MLflow (recorder.abandon).
