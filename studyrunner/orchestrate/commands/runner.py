"""`submit`, `resume`, `rerun` and `cancel`: the commands, each a short narrative over one `StudyRun`
(study_run.py), the object that owns one study's run from its stores to its trials' ends in the ledger.

Each command checks its settings, reaches its stores and starts (or joins) Ray before anything is written
(`preflight`, where `checked_will_run`/`will_run` say whether trials will run), opens the stores, and runs the
study with its feed: the trials of the study file, a search's suggestions or a sequential study's waves.
"""

from __future__ import annotations

from rich.console import Console

from ...store import Ledger
from ...store.status import STATUSES
from ...study import CompiledStudy
from ...workspace import Workspace
from ..run_types import RunOptions, SubmitResult
from ..submission import reap_dead
from .preflight import checked_will_run, stored_study, will_run
from .selection import RerunSelection
from .study_run import StudyRun

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
    run = StudyRun(compiled, workspace, "submit", options or RunOptions(**option_fields), console)
    with run.preflight(lambda existing: checked_will_run(existing, compiled)):
        run.open_stores()
        run.tuning_first()
        return run.go(run.feed(as_submitted=True))


def resume(
    study: str, workspace: Workspace, *, options: RunOptions | None = None, console: Console | None = None
) -> SubmitResult:
    """Finish a study after its driver died or was stopped: pending, cancelled and stale trials run;
    nothing that succeeded runs again. A search or a sequential study goes on as a submit of it would."""
    run = StudyRun(study, workspace, "resume", options, console)
    with run.preflight(lambda existing: will_run(existing, stored_study(existing, study), resuming=True)):
        run.open_stores()  # and the study as last submitted
        run.tuning_first()
        return run.go(run.feed(as_submitted=False))


def rerun(
    study: str,
    workspace: Workspace,
    select: RerunSelection,
    *,
    options: RunOptions | None = None,
    console: Console | None = None,
) -> SubmitResult:
    """Run exactly the chosen trials again, as new attempts of the same trials (and MLflow runs)."""
    run = StudyRun(study, workspace, "rerun", options, console)
    with run.preflight(
        lambda existing: bool(select.keys(existing, stored_study(existing, study), run.options.stale_after))
    ):
        run.open_stores()
        return run.run_trials(run.chosen(select), statuses=STATUSES, fresh=select.fresh)


def cancel(study: str, workspace: Workspace) -> tuple[int, int]:
    """Ask the study's running submits to stop; pending trials nobody runs become cancelled now."""
    ledger = Ledger(workspace.db_url, create=False)
    ledger.get_study(study)
    reap_dead(ledger, study)
    return ledger.request_cancel(study)
