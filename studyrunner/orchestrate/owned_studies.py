"""Studies that run from one submit at a time, a search (search.py) and a sequential study (waves.py): taking
the study in the ledger (`take_study`), and the submit path of each, which runs its trials through
`run_trials` (execution.py) with the study's feed."""

from __future__ import annotations

from rich.markup import escape
from rich.text import Text

from .execution import run_trials
from .preflight import refuse_changed_meaning, say_plan
from .run_types import SubmitResult
from .submission import Submission, reap_dead
from .teachers import resolve_teachers


def submit_search(compiled, workspace, ledger, tracker, command, options, console) -> SubmitResult:
    """A search study (orchestrate/search.py): take the search (one submit runs it at a time), refuse an edit
    Optuna cannot continue, make the ledger and the Optuna study agree, run the seeds of configurations left
    unfinished, then new suggestions until `n_trials` configurations."""
    from .search import SearchRun

    name = compiled.study.name
    reap_dead(ledger, name)
    say = lambda line: console.print(Text.assemble(("search: ", "cyan"), line), highlight=False)  # noqa: E731
    search = SearchRun(compiled, ledger, workspace.db_url, say)
    refuse_changed_meaning(ledger, search.compiled)
    submission = take_study(ledger, compiled.study, command, options, console, workspace, "search")
    if submission is None:
        return SubmitResult(name, 0, study_busy=True)
    try:
        search.refuse_changed_space()
        ledger.register(search.compiled)
        search.reconcile()
        result = _run_fed(search, workspace, ledger, tracker, command, options, console, submission)
    except BaseException:
        submission.close()  # releases the search (a no-op where `run_trials` closed it)
        raise
    return _summed_up(search, result, console)


def submit_waves(compiled, workspace, ledger, tracker, command, options, console) -> SubmitResult:
    """A sequential study (orchestrate/waves.py): take the study (one submit runs its waves at a time), run the
    registered trials not yet finished, then a wave after each look until every claim is decided or at `max`."""
    from .waves import Waves

    name = compiled.study.name
    reap_dead(ledger, name)
    say = lambda line: console.print(Text.assemble(("sequential: ", "cyan"), line), highlight=False)  # noqa: E731
    submission = take_study(ledger, compiled.study, command, options, console, workspace, "sequential study")
    if submission is None:
        return SubmitResult(name, 0, study_busy=True)
    try:
        waves = Waves(compiled, ledger, say)  # the looks read once the study is ours: no other submit adds one
        waves.check_design()
        refuse_changed_meaning(ledger, waves.compiled)
        resolve_teachers(waves.compiled, ledger, workspace)
        result = _run_fed(waves, workspace, ledger, tracker, command, options, console, submission)
    except BaseException:
        submission.close()  # releases the study (a no-op where `run_trials` closed it)
        raise
    return _summed_up(waves, result, console)


def _run_fed(feed, workspace, ledger, tracker, command, options, console, submission) -> SubmitResult:
    """Register the feed's trials so far, say the plan, and run them (and the stale ones) with the feed adding
    more as it goes: a search's suggestions, a sequential study's waves."""
    compiled = feed.compiled
    name = compiled.study.name
    reg = ledger.register(compiled)
    held = [r.trial_key for r in ledger.trials_by_key(reg.held) if r.status in ("failed", "diverged")]
    result = SubmitResult(name, len(compiled.trials), skipped=reg.skipped, held=held)
    console.print(f"[bold]{escape(name)}[/]: {escape(feed.plan())}")
    if compiled.cells:  # a search before its first suggestion has none
        say_plan(console, compiled, reg.skipped, held, workspace)
    stale = sorted(ledger.stale_keys(name, options.stale_after))
    return run_trials(
        compiled, workspace, ledger, tracker, reg.to_run + stale, command, result, options, console,
        feed=feed, submission=submission,
    )  # fmt: skip


def _summed_up(feed, result: SubmitResult, console) -> SubmitResult:
    result.trials = len(feed.compiled.trials)  # the feed added trials while it ran
    for line in feed.summary():
        console.print(line, markup=False, highlight=False)
    return result


def take_study(ledger, study, command, options, console, workspace, what: str) -> Submission | None:
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
