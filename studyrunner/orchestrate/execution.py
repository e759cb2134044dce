"""Running a command's candidate trials: lease those no other live process holds, start (or join) Ray, run them
on Ray Tune (tune_fit.py) with the study's MLflow runs open (study_tracking.py), and release whatever did not
finish, even after a second Ctrl-C."""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from rich.text import Text
from sqlalchemy.exc import DBAPIError

from ..store import CurveStore, Ledger
from ..store.ledger import SUBMIT_RUNS
from ..study import CompiledStudy
from ..workspace import Workspace, checkpoint_location
from .capacity import check_cluster_fits
from .ray_runtime import ensure_ray, ray_session_dir, started_here, stop_ray
from .recorder import Recorder
from .run_types import RunOptions, SubmitResult
from .signals import interrupts_deferred, sigterm_as_ctrl_c
from .study_tracking import mend_tracking, open_tracking
from .submission import Submission, reap_dead
from .teachers import resolve_teachers
from .tracking import Tracker
from .tune_fit import fit_trials


def run_trials(
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
    under the `submission` that holds the study (`take_study`)."""
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
        mend_tracking(ledger, tracker, workspace, study.name, console)
        return result
    recorder, started_ray, unwritten = None, False, None
    try:
        with sigterm_as_ctrl_c(), submission:
            started_ray = ensure_ray(options.address)  # a no-op where the command started it (preflight.py)
            if started_here():  # so that `reap_dead` can stop it if this process is killed
                ledger.set_ray_session(submission.id, ray_session_dir())
            check_cluster_fits(study.resources)
            experiment_id, parent_runs, by_tag = open_tracking(compiled, to_run, ledger, tracker, workspace)
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
            fit_trials(study, to_run, recorder, workspace, options, submission.cancelled, console, feed, teachers)
            result.wall_time_s = time.perf_counter() - started
    finally:
        with interrupts_deferred():  # a second Ctrl-C must not leave trials `running`
            unwritten = release(recorder, submission, started_ray)
    if unwritten is not None:  # the study ended, but its end could not be written
        raise unwritten
    if recorder is not None and recorder.mlflow.down:
        console.print(
            f"MLflow missed records of {len(recorder.dirty)} trials (the ledger has them): "
            f"{workspace.hint('sync-mlflow', study.name)}",
            markup=False,
        )
    else:
        mend_tracking(ledger, tracker, workspace, study.name, console)
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


def release(recorder: Recorder | None, submission: Submission, started_ray: bool) -> Exception | None:
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
            stop_ray()
    return None


def delete_checkpoints(location: str) -> None:
    """Discard a trial's checkpoints (`rerun --fresh`), so its next attempt starts at step 0."""
    from ..train.checkpoint import open_storage

    storage = open_storage(location)
    for name in storage.names():
        storage.delete(name)
