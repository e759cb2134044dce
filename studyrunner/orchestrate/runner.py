"""`submit`, `resume`, `rerun` and `cancel`: which trials a command runs, and running them on Ray Tune.

Each command is a short narrative: open the stores, decide the candidate trials, then `_run`: take the
ledger lease on the candidates no other live process holds (so two submits never run one trial), run
them, and release whatever did not finish, even after a second Ctrl-C.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.text import Text
from sqlalchemy.exc import DBAPIError

from ..errors import StudyrunnerError
from ..store import STATUSES, CurveStore, Ledger
from ..store.ledger import STALE_AFTER_S, SUBMIT_RUNS
from ..store.ledger import probe as probe_ledger
from ..study import CompiledStudy
from ..study.extension import changed_fields
from ..urls import mask_text, mask_url
from ..workspace import Workspace, checkpoint_location
from .capacity import check_cluster_fits, concurrent_runs, trial_resources, trials_at_once
from .driver_callback import CancelStopper
from .faults import driver_kills, fault_injected, injections_for
from .progress import ProgressDisplay
from .ray_runtime import ensure_ray
from .recorder import Recorder
from .selection import RerunSelection
from .signals import interrupts_deferred, sigterm_as_ctrl_c
from .submission import HEARTBEAT_S, Submission, reap_dead
from .teachers import resolve_teachers, teacher_key
from .tracking import Tracker


@dataclass
class SubmitResult:
    study: str
    trials: int
    skipped: list[str] = field(default_factory=list)  # succeeded before
    held: list[str] = field(default_factory=list)  # failed or diverged before: `rerun` runs them
    busy: list[str] = field(default_factory=list)  # being run by another live submit
    study_busy: bool = False  # a search or sequential study another live submit runs (nothing was run)
    succeeded: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    diverged: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)  # back to pending: resume runs them
    cancelled: list[str] = field(default_factory=list)
    wall_time_s: float = 0.0

    @property
    def ran(self) -> int:
        return len(self.succeeded) + len(self.failed) + len(self.diverged)


@dataclass(frozen=True)
class RunOptions:
    address: str | None = None
    max_concurrent: int | None = None
    max_failures: int | None = None  # None: the study file's `retries:`
    show_progress: bool = True
    stale_after: float = STALE_AFTER_S


def submit(
    compiled: CompiledStudy,
    workspace: Workspace,
    *,
    options: RunOptions | None = None,
    console: Console | None = None,
    **option_fields,
) -> SubmitResult:
    """Register the study file and run its new, pending, cancelled and interrupted trials.

    Failed and diverged trials are left to `rerun`. An edit that changes what cells that already ran
    mean is refused (study/extension.py)."""
    console = console or Console(stderr=True)
    options = options or RunOptions(**option_fields)
    ledger, tracker = _open_stores(workspace)
    if compiled.study.search is not None:
        return _submit_search(compiled, workspace, ledger, tracker, "submit", options, console)
    if compiled.study.sequential is not None:
        return _submit_waves(compiled, workspace, ledger, tracker, "submit", options, console)
    _refuse_changed_meaning(ledger, compiled)
    resolve_teachers(compiled, ledger, workspace)  # a missing or unfinished teacher fails before any write
    reg = ledger.register(compiled)
    held = [r.trial_key for r in ledger.trials_by_key(reg.held) if r.status in ("failed", "diverged")]
    result = SubmitResult(compiled.study.name, len(compiled.trials), skipped=reg.skipped, held=held)
    _say_plan(console, compiled, reg.skipped, held, workspace)
    stale = sorted(ledger.stale_keys(compiled.study.name, options.stale_after))
    return _run(compiled, workspace, ledger, tracker, reg.to_run + stale, "submit", result, options, console)


def resume(
    study: str, workspace: Workspace, *, options: RunOptions | None = None, console: Console | None = None
) -> SubmitResult:
    """Finish a study after its driver died or was stopped: pending, cancelled and stale trials run;
    nothing that succeeded runs again."""
    console, options = console or Console(stderr=True), options or RunOptions()
    ledger, tracker = _open_stores(workspace, create=False)
    compiled = stored_study(ledger, study)
    if compiled.study.search is not None:  # continuing a search is submitting it again
        return _submit_search(compiled, workspace, ledger, tracker, "resume", options, console)
    if compiled.study.sequential is not None:  # ... and a sequential study's waves
        return _submit_waves(compiled, workspace, ledger, tracker, "resume", options, console)
    reg = ledger.register(compiled)
    result = SubmitResult(study, len(compiled.trials), skipped=reg.skipped)
    stale = sorted(ledger.stale_keys(study, options.stale_after))
    return _run(compiled, workspace, ledger, tracker, reg.to_run + stale, "resume", result, options, console)


def rerun(
    study: str,
    workspace: Workspace,
    select: RerunSelection,
    *,
    options: RunOptions | None = None,
    console: Console | None = None,
) -> SubmitResult:
    """Run exactly the chosen trials again, as new attempts of the same trials (and MLflow runs)."""
    console, options = console or Console(stderr=True), options or RunOptions()
    ledger, tracker = _open_stores(workspace, create=False)
    compiled = stored_study(ledger, study)
    ledger.register(compiled)
    keys = select.keys(ledger, compiled, options.stale_after)
    result = SubmitResult(study, len(compiled.trials))
    console.print(f"[bold]{escape(study)}[/]: rerunning {len(keys)} trials ({select.describe()})")
    return _run(compiled, workspace, ledger, tracker, keys, "rerun", result, options, console, STATUSES, select.fresh)


def cancel(study: str, workspace: Workspace) -> tuple[int, int]:
    """Ask the study's running submits to stop; pending trials nobody runs become cancelled now."""
    ledger = Ledger(workspace.db_url, create=False)
    ledger.get_study(study)
    reap_dead(ledger, study)
    return ledger.request_cancel(study)


# ---------------------------------------------------------------------------------------- steps


def _open_stores(workspace: Workspace, create: bool = True) -> tuple[Ledger, Tracker]:
    # Every location is checked before anything is written, so a bad one leaves no trace: the ledger's URL
    # (read only) and storage first, then the tracking store (opening it creates an SQLite one), then the ledger.
    if create:
        probe_ledger(workspace.db_url)
    workspace.check_storage()
    if not create:
        ledger = Ledger(workspace.db_url, create=False)
        return ledger, Tracker(workspace.tracking_uri)
    tracker = Tracker(workspace.tracking_uri)
    workspace.ensure()
    return Ledger(workspace.db_url), tracker


def stored_study(ledger: Ledger, name: str) -> CompiledStudy:
    """The study as last submitted (the ledger keeps its file), compiled again."""
    from ..study import compile_study, loads

    row = ledger.get_study(name)
    compiled = compile_study(loads(row.spec_text, source=f"<study {name} as last submitted>"))
    if compiled.study.search is not None:  # its cells are the suggestions the ledger records
        from .search import with_search_cells

        compiled = with_search_cells(compiled, ledger)
    if compiled.study.sequential is not None:  # its cells' seeds: those of the waves registered so far
        from .waves import with_registered_seeds

        compiled = with_registered_seeds(compiled, ledger)
    return compiled


def _submit_search(compiled, workspace, ledger, tracker, command, options, console) -> SubmitResult:
    """A search study (orchestrate/search.py): take the search (one submit runs it at a time), refuse an edit
    Optuna cannot continue, make the ledger and the Optuna study agree, run the seeds of configurations left
    unfinished, then new suggestions until `n_trials` configurations."""
    from .search import SearchRun

    name = compiled.study.name
    reap_dead(ledger, name)
    say = lambda line: console.print(Text.assemble(("search: ", "cyan"), line), highlight=False)  # noqa: E731
    search = SearchRun(compiled, ledger, workspace.db_url, say)
    _refuse_changed_meaning(ledger, search.compiled)
    submission = _take_study(ledger, compiled.study, command, options, console, workspace, "search")
    if submission is None:
        return SubmitResult(name, 0, study_busy=True)
    try:
        search.refuse_changed_space()
        ledger.register(search.compiled)
        search.reconcile()
        compiled = search.compiled
        reg = ledger.register(compiled)
        held = [r.trial_key for r in ledger.trials_by_key(reg.held) if r.status in ("failed", "diverged")]
        result = SubmitResult(name, len(compiled.trials), skipped=reg.skipped, held=held)
        console.print(f"[bold]{escape(name)}[/]: {escape(search.plan())}")
        if compiled.cells:
            _say_plan(console, compiled, reg.skipped, held, workspace)
        stale = sorted(ledger.stale_keys(name, options.stale_after))
        result = _run(
            compiled, workspace, ledger, tracker, reg.to_run + stale, command, result, options, console,
            feed=search, submission=submission,
        )  # fmt: skip
    except BaseException:
        submission.close()  # releases the search (a no-op where `_run` closed it)
        raise
    result.trials = len(search.compiled.trials)
    for line in search.summary():
        console.print(line, markup=False, highlight=False)
    return result


def _submit_waves(compiled, workspace, ledger, tracker, command, options, console) -> SubmitResult:
    """A sequential study (orchestrate/waves.py): take the study (one submit runs its waves at a time), run the
    registered trials not yet finished, then a wave after each look until every claim is decided or at `max`."""
    from .waves import Waves

    name = compiled.study.name
    reap_dead(ledger, name)
    say = lambda line: console.print(Text.assemble(("sequential: ", "cyan"), line), highlight=False)  # noqa: E731
    submission = _take_study(ledger, compiled.study, command, options, console, workspace, "sequential study")
    if submission is None:
        return SubmitResult(name, 0, study_busy=True)
    try:
        waves = Waves(compiled, ledger, say)  # the looks read once the study is ours: no other submit adds one
        waves.check_design()
        _refuse_changed_meaning(ledger, waves.compiled)
        resolve_teachers(waves.compiled, ledger, workspace)
        reg = ledger.register(waves.compiled)
        compiled = waves.compiled
        held = [r.trial_key for r in ledger.trials_by_key(reg.held) if r.status in ("failed", "diverged")]
        result = SubmitResult(name, len(compiled.trials), skipped=reg.skipped, held=held)
        console.print(f"[bold]{escape(name)}[/]: {escape(waves.plan())}")
        _say_plan(console, compiled, reg.skipped, held, workspace)
        stale = sorted(ledger.stale_keys(name, options.stale_after))
        result = _run(
            compiled, workspace, ledger, tracker, reg.to_run + stale, command, result, options, console,
            feed=waves, submission=submission,
        )  # fmt: skip
    except BaseException:
        submission.close()  # releases the study (a no-op where `_run` closed it)
        raise
    result.trials = len(waves.compiled.trials)
    for line in waves.summary():
        console.print(line, markup=False, highlight=False)
    return result


def _take_study(ledger, study, command, options, console, workspace, what: str) -> Submission | None:
    """A study that runs from one submit at a time (a search asks Optuna in turn; a sequential study's looks
    follow one another): take it in the ledger by one conditional write, so of two submits started together
    exactly one runs it. None, said in one line, where another live submit holds it."""
    ledger.ensure_study(study)  # a submission belongs to a study row; an existing one is left alone
    submission = Submission(ledger, study.name, command)
    holder = ledger.claim_owner(study.name, submission.id, options.stale_after)
    if holder is None:
        return submission
    submission.close()
    console.print(
        f"{escape(study.name)}: another submit runs this {what} ({escape(holder.command)} pid {holder.pid} on "
        f"{escape(holder.host)}); left to it (stop it with: {escape(workspace.hint('cancel', study.name))})"
    )
    return None


def _refuse_changed_meaning(ledger: Ledger, compiled: CompiledStudy) -> None:
    name = compiled.study.name
    if not any(s.name == name for s in ledger.studies()):
        return
    ran = {t.cell_hash for t in ledger.trials(name) if t.attempts > 0 or t.status == "succeeded"}
    configs = {c.cell_hash: c.config for c in ledger.cells(name) if c.cell_hash in ran}
    changed = changed_fields(configs, compiled)
    if changed:
        raise StudyrunnerError(
            f"{compiled.study.source}: this edit changes cells of study {name!r} that already ran "
            f"({', '.join(changed)}); their results would no longer belong to the study. Submit the edited "
            f"file as a new study: studyrunner submit {compiled.study.source} --as-new-study NAME"
        )


def _say_plan(console: Console, compiled: CompiledStudy, skipped: list[str], held: list[str], workspace) -> None:
    study = compiled.study
    again = escape(workspace.hint("rerun", study.name, "--failed", "--diverged"))
    seeds = f"{len(study.seeds)} seeds" if study.sequential is None else "seeds so far"
    console.print(
        f"[bold]{escape(study.name)}[/]: {len(compiled.cells)} cells x {seeds} = "
        f"{len(compiled.trials)} trials; {len(skipped)} already succeeded (skipped)"
        + (f", {len(held)} failed or diverged (rerun with: {again})" if held else "")
    )


def _run(
    compiled: CompiledStudy,
    workspace: Workspace,
    ledger: Ledger,
    tracker: Tracker,
    candidates: list[str],
    command: str,
    result: SubmitResult,
    options: RunOptions | None,
    console: Console,
    statuses: tuple[str, ...] = SUBMIT_RUNS,
    fresh: bool = False,
    feed=None,
    submission: Submission | None = None,
) -> SubmitResult:
    """Claim the candidates this process may run (`fresh`: then discard their checkpoints), run them on Ray
    Tune, release what did not finish, and mend what MLflow lacks of the study's finished trials. With a
    `feed` (feed.py: a search's suggestions, a sequential study's waves), Tune also runs the trials it brings,
    under the `submission` that holds the study (`_take_study`)."""
    options = options or RunOptions()
    study = compiled.study
    teachers = resolve_teachers(compiled, ledger, workspace)
    if submission is None:
        reap_dead(ledger, study.name)  # a killed driver's trials and local Ray first
        submission = Submission(ledger, study.name, command)
    claimed = set(ledger.claim(study.name, sorted(set(candidates)), submission.id, statuses, options.stale_after))
    if fresh:  # only now, when no other process runs them
        for key in sorted(claimed):
            delete_checkpoints(checkpoint_location(workspace.storage, study.name, key))
    result.busy = sorted(k for k in set(candidates) - claimed if k not in result.skipped)
    to_run = [t for t in compiled.trials if t.trial_key in claimed]
    if result.busy:
        console.print(f"{len(result.busy)} trials are being run by another submit of {escape(study.name)}; left to it")
    more = ", then new suggestions" if study.search is not None else ", then a wave after each look"
    console.print(f"{len(to_run)} to run" + (more if feed is not None and feed.can_ask() else ""))
    if feed is not None:  # the trials it brings are leased as they come
        feed.lease = lambda keys: set(ledger.claim(study.name, keys, submission.id, statuses, options.stale_after))
    if not to_run and (feed is None or not feed.can_ask()):
        submission.close()
        _mend_tracking(ledger, tracker, workspace, study.name, console)
        return result
    recorder, started_ray, unwritten = None, False, None
    try:
        with sigterm_as_ctrl_c(), submission:
            started_ray = ensure_ray(options.address)  # which puts our SIGTERM handler back after Ray's
            if started_ray:
                ledger.set_ray_session(submission.id, _ray_session_dir())
            check_cluster_fits(study.resources)
            experiment_id, parent_runs, by_tag = _open_tracking(compiled, to_run, ledger, tracker, workspace)
            started = time.perf_counter()
            recorder = Recorder(
                compiled,
                ledger,
                tracker,
                CurveStore(workspace.storage),
                experiment_id,
                parent_runs,
                submission.id,
                warn=lambda line: console.print(Text.assemble(("warning: ", "yellow"), line), highlight=False),
                say=lambda line: console.print(Text.assemble(("note: ", "cyan"), line), highlight=False),
                known_runs=by_tag,
                sync_hint=workspace.hint("sync-mlflow", study.name),
            )
            if feed is not None:
                feed.tracked(tracker, experiment_id, recorder.mlflow.call)
            _fit(study, to_run, recorder, workspace, options, submission.cancelled, console, feed, teachers)
            result.wall_time_s = time.perf_counter() - started
    finally:
        with interrupts_deferred():  # a second Ctrl-C must not leave trials `running`
            unwritten = _release(recorder, submission, started_ray)
    if unwritten is not None:  # the study ended, but its end could not be written
        raise unwritten
    if recorder is not None and recorder.mlflow.down:
        console.print(
            f"MLflow missed records of {len(recorder.dirty)} trials (the ledger has them): "
            f"{workspace.hint('sync-mlflow', study.name)}",
            markup=False,
        )
    else:
        _mend_tracking(ledger, tracker, workspace, study.name, console)
    ran = to_run + (feed.admitted if feed is not None else [])
    for row in ledger.trials(study.name, [t.trial_key for t in ran]):
        bucket = {
            "succeeded": result.succeeded,
            "failed": result.failed,
            "diverged": result.diverged,
            "cancelled": result.cancelled,
        }.get(row.status, result.interrupted)
        bucket.append(row.trial_key)
    return result


def _release(recorder: Recorder | None, submission: Submission, started_ray: bool) -> Exception | None:
    """Release what this command holds (unfinished trials back to pending, or cancelled) and stop the Ray it
    started. A ledger that cannot be written then (its database went away mid-study) leaves the trials to
    the next `resume`, which finds this process gone; Ray is stopped all the same. Returns that error."""
    try:
        if recorder is not None:
            recorder.abandon(cancelled=submission.cancelled.is_set())
        submission.close()
    except DBAPIError as exc:
        return exc
    finally:
        if started_ray:
            import ray

            ray.shutdown()
    return None


def _mend_tracking(ledger: Ledger, tracker: Tracker, workspace: Workspace, study: str, console: Console) -> None:
    """Mend what MLflow and the curves lack of the study's flagged trials (MLflow was down for them, or the
    driver that ran them died half way): a short sync, so no command leaves a disagreement behind."""
    from .mlflow_sync import sync_mlflow

    try:
        report = sync_mlflow(
            ledger,
            tracker,
            CurveStore(workspace.storage),
            study,
            storage=workspace.storage,
            only_dirty=True,
            artifact_location=workspace.artifact_location(study),
            again=workspace.hint("sync-mlflow", study),
        )
    except StudyrunnerError as exc:
        console.print(Text.assemble(("warning: ", "yellow"), str(exc)), highlight=False)
        return
    if report.changed:
        console.print(
            f"mended {report.trials_synced} trials in MLflow ({report.points_logged} points, "
            f"{report.runs_created} runs created, {report.statuses_set} statuses set) and "
            f"{report.curves_rebuilt} curves from checkpoints",
            markup=False,
            highlight=False,
        )
    for line in report.problems:
        console.print(Text.assemble(("warning: ", "yellow"), line), highlight=False)


def _ray_session_dir() -> str | None:
    try:
        import ray._private.worker as worker

        return worker.global_worker.node.get_session_dir_path()
    except Exception:  # noqa: BLE001 - a private API; without it a crash leaves Ray to the user
        return None


def _open_tracking(compiled, to_run, ledger: Ledger, tracker: Tracker, workspace: Workspace):
    """The study's MLflow experiment and a parent run per cell that has trials to run."""
    study = compiled.study
    for attempt in range(4):
        try:
            experiment_id = tracker.experiment(study.name, workspace.artifact_location(study.name), study.description)
            break
        except Exception as exc:  # noqa: BLE001 - MLflow surfaces store errors under many types
            # Two submits on a fresh workspace race to create MLflow's tables (or the experiment): the
            # loser finds them a moment later.
            if attempt == 3:
                first = str(exc).strip().splitlines()[0]
                raise StudyrunnerError(
                    f"cannot use MLflow tracking store {mask_url(workspace.tracking_uri)!r}: "
                    f"{mask_text(first, workspace.tracking_uri)}"
                ) from None
            time.sleep(0.5 * (attempt + 1))
    ledger.set_experiment(study.name, experiment_id)
    # Runs MLflow already holds for these cells and trials, by tag: a ledger that lost their ids (made anew
    # beside an old tracking store, or a driver killed between making a run and naming it) finds them
    # again instead of making second ones.
    by_tag = tracker.runs_by_tag(experiment_id)
    known_parents = {c.cell_hash: c.mlflow_run_id for c in ledger.cells(study.name)}
    parent_runs: dict[str, str] = {}
    for cell in compiled.cells:
        if any(t.cell_hash == cell.cell_hash for t in to_run):
            known = known_parents.get(cell.cell_hash) or by_tag.get(("cell", cell.cell_hash))
            run_id = tracker.cell_run(experiment_id, study, cell, known)
            if run_id != known_parents.get(cell.cell_hash):
                ledger.set_cell_run(study.name, cell.cell_hash, run_id)
            parent_runs[cell.cell_hash] = run_id
    return experiment_id, parent_runs, by_tag


def delete_checkpoints(location: str) -> None:
    from ..train.checkpoint import open_storage

    storage = open_storage(location)
    for name in storage.names():
        storage.delete(name)


def _payloads(study, to_run, workspace: Workspace, teachers: dict | None = None) -> list[dict]:
    """What each Tune trial's worker gets: the resolved config, seed and the knobs of how it runs (and a
    conversion's teacher, teachers.py); a cell with `train.vectorize_seeds` sends its seeds as one group
    (one process trains them together)."""
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
    payloads, groups = [], {}
    for trial, payload in zip(to_run, single, strict=True):
        if trial.config["train"].get("vectorize_seeds") and not payload["inject_fault"]:
            groups.setdefault(trial.cell_hash, []).append(payload)
        else:
            payloads.append(payload)
    for cell_hash, members in groups.items():
        if len(members) == 1:
            payloads.append(members[0])
            continue
        payloads.append(
            {
                **{k: members[0][k] for k in ("cell", "threads", "divergence", "heartbeat_s")},
                "trial_key": f"{study.name}-{cell_hash}-x{len(members)}",
                "group": members,
            }
        )
    return payloads


def _fit(
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
    (feed.py), then the trials it brings. `teachers`: conversions' teacher checkpoints (teachers.py)."""
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
        trials = {"param_space": {"trial": tune.grid_search(_payloads(study, to_run, workspace, teachers))}}
    else:

        def admit(cell, trials) -> None:
            recorder.admit(cell, trials)
            progress.admit({t.trial_key: t.config["train"]["steps"] for t in trials})

        payloads = lambda trials: _payloads(study, trials, workspace, teachers)  # noqa: E731
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
    with progress:
        tuner.fit()
    # Trials Tune did not finish (Ctrl-C, `cancel`, a cluster that went away) are released by the
    # submission: pending (or cancelled) in the ledger, and so in MLflow (recorder.abandon).
