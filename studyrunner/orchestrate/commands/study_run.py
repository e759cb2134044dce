"""One study's run: the `StudyRun` a `submit`, `resume` or `rerun` (runner.py) makes and walks through its steps.

A run owns what every step needs: the compiled study, the workspace, the command's name, its `RunOptions` and
console, the stores (opened once, and shared with a tuning study run first), the `Submission` that holds its
leases and the `SubmitResult` it reports. Its steps, each run once, in this order:

    preflight      settings checked, every store reached, Ray started or joined where trials will run,
                   nothing written (preflight.py `ready_to_write`)
    open_stores    the ledger and the tracking store (a resumed study: as last submitted, from the ledger)
    tuning_first   a `tune:` section's tuning study, submitted first over the same stores (preflight.py)
    feed.check     an edit that changes what ran is refused, before anything is written
    take_study     a search or a sequential study: made this submit's by one conditional write, or left
                   to the live submit that holds it (`study_busy`)
    feed.prepare   the feed readies its trials once the study is ours
    register       teachers resolved, the trials known so far registered, the plan said (`rerun`: `chosen`,
                   the trials its selection picks, in place of the feed's steps and this one)
    run_trials     the candidates leased (before Ray starts), Ray started or joined, `fit_trials`
    release        in `finally`, with interrupts deferred: what did not finish goes back to pending
    mend           what MLflow and the curves lack of flagged trials, backfilled; the result tallied

The feed says where the trials come from: `Plain` (every trial is in the study file), a search's `SearchRun`
(feeds/search.py: Optuna's suggestions) or a sequential study's `Waves` (feeds/waves.py: a wave per look).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from rich.console import Console
from rich.markup import escape
from rich.text import Text
from sqlalchemy.exc import DBAPIError

from ...store import CurveStore, Ledger
from ...store.status import SUBMIT_RUNS, UNSUCCESSFUL, TrialStatus
from ...study import CompiledStudy, Trial
from ...tracking.study_runs import mend_tracking, open_tracking
from ...tracking.tracker import Tracker
from ...workspace import Workspace, checkpoint_location
from ..cluster.capacity import check_cluster_fits
from ..cluster.ray_runtime import ensure_ray, ray_session_dir, started_here, stop_ray
from ..cluster.recorder import Recorder
from ..cluster.tune_fit import fit_trials
from ..run_types import RunOptions, SubmitResult
from ..signals import interrupts_deferred, sigterm_as_ctrl_c
from ..submission import Submission, reap_dead
from ..teachers import resolve_teachers
from .preflight import open_stores, ready_to_write, refuse_changed_meaning, say_plan, stored_study, tuned
from .selection import RerunSelection

Refuse = Callable[[CompiledStudy], None]  # raises where an edit changes cells that already ran


class Feed(Protocol):
    """Where a run's trials come from, and what the run does around them."""

    compiled: CompiledStudy  # the trials known so far (a feed adds to them as the run goes)
    taken_as: str | None  # what one submit runs at a time ("search", ...); None: any number of submits
    brings: str  # what follows the first trials, said in the plan ("new suggestions")
    says_plan: bool  # whether the run says the plan (and which ended trials it holds back for `rerun`)
    admitted: list[Trial]  # trials it brought and sent to Tune
    lease: Callable[[list[str]], set[str]] | None  # set by the run: leases the trials it brings

    def check(self, refuse: Refuse) -> None:
        """Before the study is taken, nothing written yet."""

    def prepare(self, refuse: Refuse) -> None:
        """Once the study is this submit's (or at once, for a study any number of submits run)."""

    def plan(self) -> str | None: ...

    def can_ask(self) -> bool: ...

    def tracked(self, tracker: Tracker, experiment_id: str, call) -> None: ...

    def summary(self) -> list[str]: ...


class Plain:
    """The trivial feed: every trial is in the study file, run as one Tune grid, by any number of submits at
    once (each leases the trials no other holds). `as_submitted`: the file the user just submitted, checked
    against what ran and its plan said; else the study as the ledger keeps it (`resume`, `rerun`)."""

    taken_as = None
    brings = ""

    def __init__(self, compiled: CompiledStudy, as_submitted: bool) -> None:
        self.compiled, self.says_plan = compiled, as_submitted
        self.admitted: list[Trial] = []
        self.lease = None

    def check(self, refuse: Refuse) -> None:
        if self.says_plan:
            refuse(self.compiled)

    def prepare(self, refuse: Refuse) -> None:
        pass

    def plan(self) -> str | None:
        return None

    def can_ask(self) -> bool:
        return False

    def tracked(self, tracker: Tracker, experiment_id: str, call) -> None:
        pass

    def summary(self) -> list[str]:
        return []


class StudyRun:
    """One command's run of one study. `study`: a compiled study file (a `submit`: its stores are made where
    missing) or the name of a study the ledger holds (`resume`, `rerun`: read as last submitted)."""

    def __init__(
        self,
        study: CompiledStudy | str,
        workspace: Workspace,
        command: str,
        options: RunOptions | None = None,
        console: Console | None = None,
        stores: tuple[Ledger, Tracker] | None = None,
    ) -> None:
        self.stored = isinstance(study, str)
        self.compiled: CompiledStudy | None = None if self.stored else study
        self.name: str = study if self.stored else study.study.name
        self.workspace, self.command = workspace, command
        self.options = options or RunOptions()
        self.console = console or Console(stderr=True)
        self.ledger, self.tracker = stores or (None, None)
        self.submission: Submission | None = None
        self.result = SubmitResult(self.name, 0)
        self.teachers: dict = {}
        self.recorder: Recorder | None = None
        self.started_ray = False

    # --- before anything is written ----------------------------------------------------------------------

    @contextmanager
    def preflight(self, needs_ray: Callable[[Ledger | None], bool]) -> Iterator[None]:
        """Inside, the run writes; the Ray started here stops when the block ends (preflight.py)."""
        with ready_to_write(self.workspace, self.options.address, needs_ray, create=not self.stored):
            yield

    def open_stores(self) -> None:
        self.ledger, self.tracker = open_stores(self.workspace, create=not self.stored)
        if self.compiled is None:
            self.compiled = stored_study(self.ledger, self.name)

    def tuning_first(self) -> None:
        """Run the study's tuning where it has not ended, as a submit of the tuning study over the same stores;
        from then on the study's cells have the values it chose. A study without a `tune:` section has none."""
        if self.compiled.study.tune is None:
            return

        def submit_tuning(tuning: CompiledStudy) -> SubmitResult:
            run = StudyRun(tuning, self.workspace, "submit", self.options, self.console, (self.ledger, self.tracker))
            return run.go(run.feed(as_submitted=True))

        self.compiled = tuned(self.compiled, submit_tuning, self.ledger, self.console)

    def feed(self, as_submitted: bool) -> Feed:
        """The study's feed: a search's suggestions, a sequential study's waves, or the plain study's trials."""
        if self.compiled.study.search is not None:
            from ..feeds.search import SearchRun

            return SearchRun(self.compiled, self.ledger, self.workspace.db_url, self._say("search"))
        if self.compiled.study.sequential is not None:
            from ..feeds.waves import Waves

            return Waves(self.compiled, self.ledger, self._say("sequential"))
        return Plain(self.compiled, as_submitted)

    def refuse(self, compiled: CompiledStudy) -> None:
        refuse_changed_meaning(self.ledger, compiled)

    # --- the run ------------------------------------------------------------------------------------------

    def go(self, feed: Feed) -> SubmitResult:
        """`submit` or `resume` with the study's feed: check, take the study where one submit runs it at a time,
        prepare, register and run; then say what the feed decided."""
        feed.check(self.refuse)
        if feed.taken_as is not None and not self.take_study(feed.taken_as):
            return SubmitResult(self.name, 0, study_busy=True)
        try:
            feed.prepare(self.refuse)
            self.compiled = feed.compiled
            self.run_trials(self.register(feed), feed)
        except BaseException:
            if self.submission is not None:
                self.submission.close()  # releases the study (a no-op where `release` closed it)
            raise
        self.result.trials = len(feed.compiled.trials)  # the feed added trials while it ran
        for line in feed.summary():
            self.console.print(line, markup=False, highlight=False)
        return self.result

    def take_study(self, what: str) -> bool:
        """A study that runs from one submit at a time (a search asks Optuna in turn; a sequential study's looks
        follow one another): take it by one conditional write, so of two submits started together exactly one
        runs it. False, said in one line, where another live submit holds it."""
        reap_dead(self.ledger, self.name)  # a killed driver's trials and local Ray first
        self.ledger.ensure_study(self.compiled.study)  # a submission belongs to a study row
        submission = Submission(self.ledger, self.name, self.command)
        holder = self.ledger.claim_owner(self.name, submission.id, self.options.stale_after)
        if holder is None:
            self.submission = submission
            return True
        submission.close()
        self.console.print(
            f"{escape(self.name)}: another submit runs this {what} ({escape(holder.command)} pid {holder.pid} on "
            f"{escape(holder.host)}); left to it (stop it with: {escape(self.workspace.hint('cancel', self.name))})"
        )
        return False

    def register(self, feed: Feed) -> list[str]:
        """Resolve the conversions' teachers (a missing or unfinished one fails before the trials are written),
        register the trials known so far and say the plan. Returns the candidates: the trials a submit runs
        (new, pending, cancelled) and the stale ones."""
        self.teachers = resolve_teachers(self.compiled, self.ledger, self.workspace)
        reg = self.ledger.register(self.compiled)
        self.result = SubmitResult(self.name, len(self.compiled.trials), skipped=reg.skipped)
        if feed.says_plan:
            held = self.ledger.trials_by_key(reg.held)
            self.result.held = [r.trial_key for r in held if r.status in UNSUCCESSFUL]
            if (line := feed.plan()) is not None:
                self.console.print(f"[bold]{escape(self.name)}[/]: {escape(line)}")
            if self.compiled.cells:  # a search before its first suggestion has none
                say_plan(self.console, self.compiled, reg.skipped, self.result.held, self.workspace)
        return reg.to_run + sorted(self.ledger.stale_keys(self.name, self.options.stale_after))

    def chosen(self, select: RerunSelection) -> list[str]:
        """`rerun`'s candidates: the trials `select` picks, said in one line (teachers resolved and the study
        registered first, as `register` does)."""
        self.teachers = resolve_teachers(self.compiled, self.ledger, self.workspace)
        self.ledger.register(self.compiled)
        keys = select.keys(self.ledger, self.compiled, self.options.stale_after)
        self.result = SubmitResult(self.name, len(self.compiled.trials))
        self.console.print(f"[bold]{escape(self.name)}[/]: rerunning {len(keys)} trials ({select.describe()})")
        return keys

    def run_trials(
        self,
        candidates: list[str],
        feed: Feed | None = None,
        statuses: tuple[str, ...] = SUBMIT_RUNS,
        fresh: bool = False,
    ) -> SubmitResult:
        """Lease the candidates no other live process holds (`fresh`: then discard their checkpoints), run them
        on Ray Tune with the trials the feed brings, release what did not finish, mend what MLflow lacks, and
        tally how the trials ended."""
        feed = feed or Plain(self.compiled, as_submitted=False)
        to_run = self.lease(candidates, feed, statuses, fresh)
        if not to_run and not feed.can_ask():
            self.submission.close()
            self.mend()
            return self.result
        self.fit(to_run, feed)
        self.mend()
        return self.tally(to_run + feed.admitted)

    def lease(self, candidates: list[str], feed: Feed, statuses: tuple[str, ...], fresh: bool) -> list[Trial]:
        """The lease on the candidates this process may run (the trials the feed brings are leased as they
        come), taken before Ray starts, so two submits never run one trial."""
        if self.submission is None:  # a study `take_study` took holds its submission already
            reap_dead(self.ledger, self.name)  # a killed driver's trials and local Ray first
            self.submission = Submission(self.ledger, self.name, self.command)
        owner, stale_after = self.submission.id, self.options.stale_after
        feed.lease = lambda keys: set(self.ledger.claim(self.name, keys, owner, statuses, stale_after))
        claimed = feed.lease(sorted(set(candidates)))
        if fresh:  # only now, when no other process runs them
            for key in sorted(claimed):
                delete_checkpoints(checkpoint_location(self.workspace.storage, self.name, key))
        busy = sorted(k for k in set(candidates) - claimed if k not in self.result.skipped)
        self.result.busy = busy
        to_run = [t for t in self.compiled.trials if t.trial_key in claimed]
        if busy:
            self.console.print(f"{len(busy)} trials are being run by another submit of {escape(self.name)}; left to it")
        self.console.print(f"{len(to_run)} to run" + (f", then {feed.brings}" if feed.can_ask() else ""))
        return to_run

    def fit(self, to_run: list[Trial], feed: Feed) -> None:
        """Start or join Ray and run the trials on Ray Tune (cluster/tune_fit.py) with the study's MLflow runs
        open (tracking/study_runs.py); `release` whatever did not finish, even after a second Ctrl-C."""
        study = self.compiled.study
        unwritten = None
        try:
            with sigterm_as_ctrl_c(), self.submission:
                self.started_ray = ensure_ray(self.options.address)  # a no-op where preflight started it
                if started_here():  # so that `reap_dead` can stop it if this process is killed
                    self.ledger.set_ray_session(self.submission.id, ray_session_dir())
                check_cluster_fits(study.resources)
                experiment_id, parent_runs, by_tag = open_tracking(
                    self.compiled, to_run, self.ledger, self.tracker, self.workspace
                )
                started = time.perf_counter()
                self.recorder = Recorder(
                    self.compiled,
                    self.ledger,
                    self.tracker,
                    CurveStore(self.workspace.storage),
                    experiment_id,
                    parent_runs,
                    self.submission.id,
                    warn=self._say("warning", "yellow"),
                    say=self._say("note"),
                    known_runs=by_tag,
                    sync_hint=self.workspace.hint("sync-mlflow", self.name),
                )
                feed.tracked(self.tracker, experiment_id, self.recorder.mlflow.call)
                searcher_feed = None if isinstance(feed, Plain) else feed  # a plain study runs as Tune's grid
                cancelled = self.submission.cancelled
                fit_trials(
                    study,
                    to_run,
                    self.recorder,
                    self.workspace,
                    self.options,
                    cancelled,
                    self.console,
                    searcher_feed,
                    self.teachers,
                )
                self.result.wall_time_s = time.perf_counter() - started
        finally:
            with interrupts_deferred():  # a second Ctrl-C must not leave trials `running`
                unwritten = self.release()
        if unwritten is not None:  # the study ended, but its end could not be written
            raise unwritten

    def release(self) -> Exception | None:
        """Release what this command holds (unfinished trials back to pending, or cancelled) and stop the Ray it
        started. A ledger that cannot be written then (its database went away mid-study) leaves the trials to
        the next `resume`, which finds this process gone; Ray is stopped all the same. Returns that error."""
        try:
            if self.recorder is not None:
                self.recorder.abandon(cancelled=self.submission.cancelled.is_set())
            self.submission.close()
        except DBAPIError as exc:
            return exc
        finally:
            if self.started_ray:
                stop_ray()
        return None

    def mend(self) -> None:
        """Flag the trials of drivers that died meanwhile (`reap_dead`, which also stops their local Ray), then
        mend what MLflow and the curves lack of the study's flagged trials (tracking/study_runs.py). Where MLflow
        went down during this run, say which command mends it once it is back instead."""
        if self.recorder is not None and self.recorder.mlflow.down:
            self.console.print(
                f"MLflow missed records of {len(self.recorder.dirty)} trials (the ledger has them): "
                f"{self.workspace.hint('sync-mlflow', self.name)}",
                markup=False,
            )
            return
        reap_dead(self.ledger, self.name)
        mend_tracking(self.ledger, self.tracker, self.workspace, self.name, self.console)

    def tally(self, ran: list[Trial]) -> SubmitResult:
        """How the trials this run sent to Tune ended, from the ledger: unfinished ones were interrupted."""
        result = self.result
        ended = {
            TrialStatus.SUCCEEDED: result.succeeded,
            TrialStatus.FAILED: result.failed,
            TrialStatus.DIVERGED: result.diverged,
            TrialStatus.CANCELLED: result.cancelled,
        }
        for row in self.ledger.trials(self.name, [t.trial_key for t in ran]):
            ended.get(row.status, result.interrupted).append(row.trial_key)
        return result

    def _say(self, prefix: str, style: str = "cyan") -> Callable[[str], None]:
        return lambda line: self.console.print(Text.assemble((f"{prefix}: ", style), line), highlight=False)


def delete_checkpoints(location: str) -> None:
    """Discard a trial's checkpoints (`rerun --fresh`), so its next attempt starts at step 0."""
    from ...train.checkpoint import open_storage

    storage = open_storage(location)
    for name in storage.names():
        storage.delete(name)
