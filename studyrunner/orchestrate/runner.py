"""`submit`: register a compiled study in the ledger and run its pending trials on Ray Tune."""

from __future__ import annotations

import fnmatch
import logging
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ..errors import StudyrunnerError
from ..spec import CompiledStudy
from ..store import CurveStore, Ledger
from ..workspace import Workspace
from .capacity import check_cluster_fits, trial_resources
from .progress import ProgressDisplay
from .recorder import Recorder
from .tracking import Tracker


@dataclass
class SubmitResult:
    study: str
    trials: int
    skipped: list[str] = field(default_factory=list)
    succeeded: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    wall_time_s: float = 0.0

    @property
    def ran(self) -> int:
        return len(self.succeeded) + len(self.failed)


def _quiet_ray_env() -> None:
    # Ray 2.60 writes an auth token under $HOME unless told this is local, unauthenticated use.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_MAX_PENDING_TRIALS_PG", "auto")
    # Tune's end-of-run advice (Tuner.restore, missing result files of unstarted trials) is not how a
    # study resumes: resubmitting the study file is. The CLI says so itself.
    for name in ("ray.tune.tune", "ray.tune.analysis.experiment_analysis"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # A failed trial is shown as one line by the progress display; its full traceback is in the ledger
    # and MLflow, not repeated ~30 lines deep on the console for every attempt.
    for name in ("ray.tune.execution.tune_controller", "ray.tune.tune"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # "Processing trial results took 1.4 s": the driver's first MLflow writes, not a user's concern.
    logging.getLogger("ray.tune.utils.util").setLevel(logging.ERROR)


def _check_reachable(address: str) -> None:
    """Ray retries an unreachable head for minutes; a TCP probe says so in two seconds."""
    if address == "auto" or ":" not in address:
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except (OSError, ValueError) as exc:
        raise StudyrunnerError(
            f"cannot reach the Ray cluster at {address!r}: {exc} (check --address / RAY_ADDRESS)"
        ) from None


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Start a local Ray (or join `address` / $RAY_ADDRESS). True if this call started it."""
    import ray

    _quiet_ray_env()
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs: dict = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
        "configure_logging": True,
    }
    if address:
        _check_reachable(address)
        try:
            ray.init(address=address, **kwargs)
        except Exception as exc:  # noqa: BLE001 - Ray raises several types for an unreachable cluster
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StudyrunnerError(
                f"cannot join the Ray cluster at {address!r}: {first} (check --address / RAY_ADDRESS)"
            ) from None
    else:
        # Unix socket paths are limited to 107 characters, so Ray's session folder must be short.
        temp_dir = Path(tempfile.gettempdir()) / f"sr-ray-{os.getuid()}"
        ray.init(num_cpus=num_cpus, _temp_dir=str(temp_dir), **kwargs)
    return True


def submit(
    compiled: CompiledStudy,
    workspace: Workspace,
    *,
    address: str | None = None,
    max_concurrent: int | None = None,
    max_failures: int = 0,
    console: Console | None = None,
    show_progress: bool = True,
) -> SubmitResult:
    console = console or Console(stderr=True)
    study = compiled.study
    # Every location is checked before anything is written, so a bad one leaves no trace.
    workspace.check_storage()
    workspace.ensure()
    ledger = Ledger(workspace.db_url)
    tracker = Tracker(workspace.tracking_uri)

    reg = ledger.register(compiled)
    result = SubmitResult(study.name, len(compiled.trials), skipped=reg.skipped)
    console.print(
        f"[bold]{escape(study.name)}[/]: {len(compiled.cells)} cells x {len(study.seeds)} seeds = "
        f"{len(compiled.trials)} trials; {len(reg.skipped)} already succeeded (skipped), "
        f"{len(reg.to_run)} to run"
    )
    if not reg.to_run:
        return result
    pending = set(reg.to_run)
    to_run = [t for t in compiled.trials if t.trial_key in pending]

    started_ray = ensure_ray(address)
    try:
        check_cluster_fits(study.resources)
        experiment_id, parent_runs = _open_tracking(compiled, to_run, ledger, tracker, workspace)
        started = time.perf_counter()
        recorder = Recorder(compiled, ledger, tracker, CurveStore(workspace.storage), experiment_id, parent_runs)
        _fit(
            study,
            to_run,
            recorder,
            workspace.ray_storage(),
            max_concurrent=max_concurrent,
            max_failures=max_failures,
            console=console,
            show_progress=show_progress,
        )
        result.wall_time_s = time.perf_counter() - started
    finally:
        if started_ray:
            import ray

            ray.shutdown()

    for row in ledger.trials(study.name, [t.trial_key for t in to_run]):
        {"succeeded": result.succeeded, "failed": result.failed}.get(row.status, result.interrupted).append(
            row.trial_key
        )
    if result.interrupted:  # the driver stopped first (Ctrl-C): they are not failures, so run them next time
        ledger.reset_to_pending(result.interrupted)
    return result


def _open_tracking(compiled, to_run, ledger: Ledger, tracker: Tracker, workspace: Workspace):
    """The study's MLflow experiment and a parent run per cell that has trials to run."""
    study = compiled.study
    try:
        experiment_id = tracker.experiment(study.name, workspace.artifact_location(study.name), study.description)
    except Exception as exc:  # noqa: BLE001 - MLflow surfaces store errors under many types
        first = str(exc).strip().splitlines()[0]
        raise StudyrunnerError(f"cannot use MLflow tracking store {workspace.tracking_uri!r}: {first}") from None
    ledger.set_experiment(study.name, experiment_id)
    known_parents = {c.cell_hash: c.mlflow_run_id for c in ledger.cells(study.name)}
    parent_runs: dict[str, str] = {}
    for cell in compiled.cells:
        if any(t.cell_hash == cell.cell_hash for t in to_run):
            run_id = tracker.cell_run(experiment_id, study, cell, known_parents.get(cell.cell_hash))
            if run_id != known_parents.get(cell.cell_hash):
                ledger.set_cell_run(study.name, cell.cell_hash, run_id)
            parent_runs[cell.cell_hash] = run_id
    return experiment_id, parent_runs


def _fit(
    study, to_run, recorder: Recorder, storage_path: str, *, max_concurrent, max_failures, console, show_progress
) -> None:
    """One Tune run over `to_run`: a trial per trial_key, recorded on the driver by `recorder`."""
    from ray import tune

    from .trainable import trainable

    progress = ProgressDisplay({t.trial_key: t.config["train"]["steps"] for t in to_run}, console=console)
    callbacks = [recorder, progress] if show_progress else [recorder]
    faults = [p for p in os.environ.get("STUDYRUNNER_INJECT_FAULT", "").split(",") if p]
    payloads = [
        {
            "trial_key": t.trial_key,
            "seed": t.seed,
            "cell": t.config,
            "threads": study.resources.cpu,
            "inject_fault": any(fnmatch.fnmatchcase(t.trial_key, p) for p in faults),
        }
        for t in to_run
    ]
    tuner = tune.Tuner(
        tune.with_resources(trainable, trial_resources(study.resources)),
        param_space={"trial": tune.grid_search(payloads)},
        tune_config=tune.TuneConfig(
            reuse_actors=True,
            max_concurrent_trials=max_concurrent,
            trial_name_creator=lambda trial: trial.config["trial"]["trial_key"],
            trial_dirname_creator=lambda trial: trial.config["trial"]["trial_key"],
        ),
        run_config=tune.RunConfig(
            name=f"{study.name}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=storage_path,
            callbacks=callbacks,
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=max_failures),
        ),
    )
    try:
        if show_progress:
            with progress:
                tuner.fit()
        else:
            tuner.fit()
    finally:
        recorder.abandon()  # anything still open was interrupted (Ctrl-C, or the cluster went away)
    # Trials Tune did not finish (Ctrl-C before they started, or a cluster that went away) stay in the
    # ledger as not succeeded; `submit` reports them as interrupted and the next submit runs them.
