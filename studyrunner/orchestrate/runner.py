"""`submit`, `resume`, `rerun` and `cancel`: which trials a command runs, and running them on Ray Tune.

Each command is a short narrative: check its settings, reach its stores and start (or join) Ray before anything
is written (preflight.py `ready_to_write`), open the stores, decide the candidate trials, then
`run_trials` (execution.py): take the ledger lease on the candidates no other live process holds (so two submits
never run one trial), run them, and release whatever did not finish, even after a second Ctrl-C. A search and a
sequential study run from one submit at a time (owned_studies.py).
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from ..store import STATUSES, Ledger
from ..study import CompiledStudy
from ..workspace import Workspace
from .execution import run_trials
from .owned_studies import submit_search, submit_waves
from .preflight import open_stores, ready_to_write, refuse_changed_meaning, say_plan, stored_study
from .run_types import RunOptions, SubmitResult
from .selection import RerunSelection
from .study_tracking import open_tracking
from .submission import reap_dead
from .teachers import resolve_teachers
from .tuning import tuned, with_tuning

ENDED = ("succeeded", "failed", "diverged")  # what a submit or resume leaves be (`rerun` runs those)

__all__ = ["RunOptions", "SubmitResult", "cancel", "rerun", "resume", "stored_study", "submit"]


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
    with ready_to_write(workspace, options.address, lambda existing: checked_will_run(existing, compiled)):
        return _submit(compiled, workspace, options, console)


def _submit(compiled: CompiledStudy, workspace: Workspace, options: RunOptions, console: Console) -> SubmitResult:
    ledger, tracker = open_stores(workspace)
    compiled = tuned(compiled, lambda tuning: _submit(tuning, workspace, options, console), ledger, console)
    if compiled.study.search is not None:
        return submit_search(compiled, workspace, ledger, tracker, "submit", options, console)
    if compiled.study.sequential is not None:
        return submit_waves(compiled, workspace, ledger, tracker, "submit", options, console)
    refuse_changed_meaning(ledger, compiled)
    resolve_teachers(compiled, ledger, workspace)  # a missing or unfinished teacher fails before any write
    reg = ledger.register(compiled)
    held = [r.trial_key for r in ledger.trials_by_key(reg.held) if r.status in ("failed", "diverged")]
    result = SubmitResult(compiled.study.name, len(compiled.trials), skipped=reg.skipped, held=held)
    say_plan(console, compiled, reg.skipped, held, workspace)
    stale = sorted(ledger.stale_keys(compiled.study.name, options.stale_after))
    return run_trials(compiled, workspace, ledger, tracker, reg.to_run + stale, "submit", result, options, console)


def resume(
    study: str, workspace: Workspace, *, options: RunOptions | None = None, console: Console | None = None
) -> SubmitResult:
    """Finish a study after its driver died or was stopped: pending, cancelled and stale trials run;
    nothing that succeeded runs again."""
    console, options = console or Console(stderr=True), options or RunOptions()
    needs = lambda existing: will_run(existing, stored_study(existing, study), resuming=True)  # noqa: E731
    with ready_to_write(workspace, options.address, needs, create=False):
        return _resume(study, workspace, options, console)


def _resume(study: str, workspace: Workspace, options: RunOptions, console: Console) -> SubmitResult:
    ledger, tracker = open_stores(workspace, create=False)
    compiled = stored_study(ledger, study)
    compiled = tuned(compiled, lambda tuning: _submit(tuning, workspace, options, console), ledger, console)
    if compiled.study.search is not None:  # continuing a search is submitting it again
        return submit_search(compiled, workspace, ledger, tracker, "resume", options, console)
    if compiled.study.sequential is not None:  # ... and a sequential study's waves
        return submit_waves(compiled, workspace, ledger, tracker, "resume", options, console)
    reg = ledger.register(compiled)
    result = SubmitResult(study, len(compiled.trials), skipped=reg.skipped)
    stale = sorted(ledger.stale_keys(study, options.stale_after))
    return run_trials(compiled, workspace, ledger, tracker, reg.to_run + stale, "resume", result, options, console)


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
    needs = lambda existing: bool(select.keys(existing, stored_study(existing, study), options.stale_after))  # noqa: E731
    with ready_to_write(workspace, options.address, needs, create=False):
        return _rerun(study, workspace, select, options, console)


def _rerun(
    study: str, workspace: Workspace, select: RerunSelection, options: RunOptions, console: Console
) -> SubmitResult:
    ledger, tracker = open_stores(workspace, create=False)
    compiled = stored_study(ledger, study)
    ledger.register(compiled)
    keys = select.keys(ledger, compiled, options.stale_after)
    result = SubmitResult(study, len(compiled.trials))
    console.print(f"[bold]{escape(study)}[/]: rerunning {len(keys)} trials ({select.describe()})")
    return run_trials(
        compiled, workspace, ledger, tracker, keys, "rerun", result, options, console, STATUSES, select.fresh
    )


def checked_will_run(existing: Ledger | None, compiled: CompiledStudy) -> bool:
    """Before Ray starts: refuse an edit the ledger's record of the study forbids (cells that ran, a sequential
    design and claims after a look), then whether the submit may run trials (`will_run`)."""
    if existing is not None:
        compiled = with_tuning(compiled, existing)  # the cells its finished tuning chose
    if existing is not None and compiled.study.sequential is not None:
        _check_waves(existing, compiled)
    elif existing is not None and compiled.study.search is None:
        refuse_changed_meaning(existing, compiled)
    return will_run(existing, compiled)


def _check_waves(existing: Ledger, compiled: CompiledStudy) -> None:
    from .waves import Waves

    if any(s.name == compiled.study.name for s in existing.studies()):
        waves = Waves(compiled, existing, lambda _line: None)
        waves.check_design()
        refuse_changed_meaning(existing, waves.compiled)


def will_run(existing: Ledger | None, compiled: CompiledStudy, resuming: bool = False) -> bool:
    """Whether the command may run trials, read from the ledger as it is (None: no ledger yet), so that Ray is
    started only then: a submit whose every trial has ended (a resubmit, a finished sequential study) runs none.
    A search may always ask for more; a sequential study whose last look added no wave only finishes its own."""
    name = compiled.study.name
    if compiled.study.search is not None:
        return True
    if existing is None or not any(s.name == name for s in existing.studies()):
        return bool(compiled.trials)
    rows = existing.trials(name)
    unended = {r.trial_key for r in rows if r.status not in ENDED}
    if compiled.study.sequential is not None:
        from ..analysis import sequential
        from ..analysis.data import looks_of

        looks = sequential.looks_from_rows(looks_of(existing, name))
        return bool(unended) or not (looks and looks[-1].final)  # else the next look may add a wave
    if resuming:
        return bool(unended)
    known = {r.trial_key for r in rows}
    return any(t.trial_key in unended or t.trial_key not in known for t in compiled.trials)


def cancel(study: str, workspace: Workspace) -> tuple[int, int]:
    """Ask the study's running submits to stop; pending trials nobody runs become cancelled now."""
    ledger = Ledger(workspace.db_url, create=False)
    ledger.get_study(study)
    reap_dead(ledger, study)
    return ledger.request_cancel(study)


# Where these lived before the split: tests and benchmarks import them from here.
_open_stores, _open_tracking, _refuse_changed_meaning = open_stores, open_tracking, refuse_changed_meaning
