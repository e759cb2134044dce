"""What a command does before it runs anything: check its settings, reach every store and the Ray it runs on
before it writes anything (Ray only where the command will run trials: `checked_will_run`, `will_run`), open the
stores, read the study as last submitted, refuse an edit that changes what ran cells mean, say the plan, and run
a `tune:` section's tuning first (`tuned`).

The tuning study `<name>--tune` is submitted like any study (same stores, same Ray, same leases), so a tuning
trial that ran is never run again and a killed submit resumes it. Once every tuning trial has ended, each cell's
choice is read from the ledger (`choices_in`) and the study's cells take it; from then on the study runs as if
its file had named each cell's value. `resume`, `rerun` and the analysis read the same choices from the ledger
(study/tuning.py says what is chosen and how)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from ...errors import StudyrunnerError
from ...store import Ledger
from ...store.ledger import probe as probe_ledger
from ...store.status import FINISHED, TrialStatus, ended_outcomes
from ...study import CompiledStudy
from ...study.extension import changed_fields
from ...study.tuning import choose, group_of, tuned_paths, tuning_of, with_choices
from ...tracking.tracker import Tracker
from ...workspace import Workspace


@contextmanager
def ready_to_write(
    workspace: Workspace, address: str | None, needs_ray: Callable[[Ledger | None], bool], create: bool = True
) -> Iterator[None]:
    """Inside, the command writes: before, its settings are checked, every store is reached (writing nothing)
    and, where `needs_ray(the existing ledger or None)` says it will run trials, Ray is started or joined; a
    wrong setting, store or address then fails in one line with nothing written. The Ray started here stops
    when the block ends, also on Ctrl-C."""
    from ... import settings
    from ..cluster.ray_runtime import ensure_ray, stop_ray
    from ..signals import interrupts_deferred

    settings.check()
    existing = check_stores(workspace, create)
    started = needs_ray(existing) and ensure_ray(address)
    try:
        yield
    finally:
        if started:
            with interrupts_deferred():
                stop_ray()


def check_stores(workspace: Workspace, create: bool = True) -> Ledger | None:
    """Reach every store, writing nothing: the ledger (one that exists is opened read-only and returned; None
    where a new one would be made), the storage and the tracking store. One line naming the one that fails."""
    if create:
        probe_ledger(workspace.db_url)
    existing = _existing_ledger(workspace.db_url) if create else Ledger(workspace.db_url, create=False, read_only=True)
    workspace.check_storage()
    Tracker.probe(workspace.tracking_uri)
    return existing


def _existing_ledger(url: str) -> Ledger | None:
    from ...store.opening import _sqlite_path

    path = _sqlite_path(url)
    if path is not None and (not path.is_file() or path.stat().st_size == 0):
        return None
    try:
        return Ledger(url, create=False, read_only=True)
    except StudyrunnerError:  # a server database without a ledger yet: `open_stores` makes it
        return None


def open_stores(workspace: Workspace, create: bool = True) -> tuple[Ledger, Tracker]:
    """Open (and with `create`, make) the ledger and the tracking store, after `check_stores` found them usable.
    A workspace folder this call made is removed again if opening fails, so a failure leaves no half-made one."""
    if create:
        probe_ledger(workspace.db_url)
    workspace.check_storage()
    if not create:
        ledger = Ledger(workspace.db_url, create=False)
        return ledger, Tracker(workspace.tracking_uri)
    made = not workspace.root.exists()
    try:
        tracker = Tracker(workspace.tracking_uri)
        workspace.ensure()
        return Ledger(workspace.db_url), tracker
    except BaseException:
        if made:
            _remove_if_empty(workspace.root)
        raise


def _remove_if_empty(folder) -> None:
    try:
        folder.rmdir()  # only an empty folder: nothing the user had is ever removed
    except OSError:
        pass


def stored_study(ledger: Ledger, name: str) -> CompiledStudy:
    """The study as last submitted (the ledger keeps its file), compiled again."""
    from ...study import compile_study, loads

    row = ledger.get_study(name)
    compiled = compile_study(loads(row.spec_text, source=f"<study {name} as last submitted>"))
    compiled = with_tuning(compiled, ledger)  # a `tune:` section: the cells its tuning chose
    if compiled.study.search is not None:  # its cells are the suggestions the ledger records
        from ..feeds.search_storage import with_search_cells

        compiled = with_search_cells(compiled, ledger)
    if compiled.study.sequential is not None:  # its cells' seeds: those of the waves registered so far
        from ..feeds.waves import with_registered_seeds

        compiled = with_registered_seeds(compiled, ledger)
    return compiled


def refuse_changed_meaning(ledger: Ledger, compiled: CompiledStudy) -> None:
    """Refuse an edit that changes cells that already ran (study/extension.py says which fields may change)."""
    name = compiled.study.name
    if not any(s.name == name for s in ledger.studies()):
        return
    ran = {t.cell_hash for t in ledger.trials(name) if t.attempts > 0 or t.status == TrialStatus.SUCCEEDED}
    configs = {c.cell_hash: c.config for c in ledger.cells(name) if c.cell_hash in ran}
    changed = changed_fields(configs, compiled)
    if changed:
        raise StudyrunnerError(
            f"{compiled.study.source}: this edit changes cells of study {name!r} that already ran "
            f"({', '.join(changed)}); their results would no longer belong to the study. Submit the edited "
            f"file as a new study: studyrunner submit {compiled.study.source} --as-new-study NAME"
        )


def say_plan(console: Console, compiled: CompiledStudy, skipped: list[str], held: list[str], workspace) -> None:
    """One line: cells x seeds = trials, those skipped, and how to rerun those that failed or diverged before."""
    study = compiled.study
    again = escape(workspace.hint("rerun", study.name, "--failed", "--diverged"))
    seeds = f"{len(study.seeds)} seeds" if study.sequential is None else "seeds so far"
    console.print(
        f"[bold]{escape(study.name)}[/]: {len(compiled.cells)} cells x {seeds} = "
        f"{len(compiled.trials)} trials; {len(skipped)} already succeeded (skipped)"
        + (f", {len(held)} failed or diverged (rerun with: {again})" if held else "")
    )


def checked_will_run(existing: Ledger | None, compiled: CompiledStudy) -> bool:
    """Before Ray starts: refuse an edit the ledger's record of the study forbids (cells that ran, a sequential
    design and claims after a look), then whether the submit may run trials (`will_run`)."""

    if existing is not None:
        compiled = with_tuning(compiled, existing)  # the cells its finished tuning chose
    if existing is not None and compiled.study.sequential is not None:
        if any(s.name == compiled.study.name for s in existing.studies()):
            from ..feeds.waves import Waves

            Waves(compiled, existing, lambda _line: None).prepare(lambda c: refuse_changed_meaning(existing, c))
    elif existing is not None and compiled.study.search is None:
        refuse_changed_meaning(existing, compiled)
    return will_run(existing, compiled)


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
    unended = {r.trial_key for r in rows if r.status not in FINISHED}
    if compiled.study.sequential is not None:
        from ...analysis import sequential
        from ...analysis.data import looks_of

        looks = sequential.looks_from_rows(looks_of(existing, name))
        return bool(unended) or not (looks and looks[-1].final)  # else the next look may add a wave
    if resuming:
        return bool(unended)
    known = {r.trial_key for r in rows}
    return any(t.trial_key in unended or t.trial_key not in known for t in compiled.trials)


def choices_in(ledger: Ledger, compiled: CompiledStudy, tuning: CompiledStudy | None = None):
    """The choices the ledger's tuning trials give (None while they have not all ended, or without `tune:`)."""
    tuning = tuning or tuning_of(compiled)
    if tuning is None or not any(s.name == tuning.study.name for s in ledger.studies()):
        return None
    ended = ended_outcomes(ledger.trials(tuning.study.name))
    return choose(tuning, tuned_paths(compiled.study), ended)


def with_tuning(compiled: CompiledStudy, ledger: Ledger) -> CompiledStudy:
    """The study's cells with the choices its finished tuning made (as they are where it has not finished)."""
    choices = choices_in(ledger, compiled)
    return compiled if choices is None else with_choices(compiled, choices)


def tuned(compiled: CompiledStudy, run_tuning, ledger: Ledger, console: Console) -> CompiledStudy:
    """Run the study's tuning where it has not ended (`run_tuning(tuning study)`: a submit of it), then return
    the study with every cell at its chosen values. A cell whose every tuning point failed stops the submit."""
    tuning = tuning_of(compiled)
    if tuning is None:
        return compiled
    say = lambda line: console.print(Text.assemble(("tune: ", "cyan"), line), highlight=False)  # noqa: E731
    choices = choices_in(ledger, compiled, tuning)
    if choices is None:
        grid = ", ".join(f"{p} in {v}" for p, v in compiled.study.tune.grid.items())
        say(f"{len(tuning.trials)} tuning trials first ({len(compiled.cells)} cells x {grid}, seed "
            f"{compiled.study.tune.seed}, scored on the validation split): study {tuning.study.name}")  # fmt: skip
        result = run_tuning(tuning)
        if result.interrupted or result.cancelled:
            raise KeyboardInterrupt
        choices = choices_in(ledger, compiled, tuning)
        if choices is None:
            raise StudyrunnerError(
                f"the tuning trials of {compiled.study.name} did not all end (another submit may run them); "
                f"submit again once they have: studyrunner status {tuning.study.name}"
            )
    paths = tuned_paths(compiled.study)
    for cell in compiled.cells:
        choice = choices.get(group_of(cell.config, paths))
        if choice is not None and not choice.values:
            raise StudyrunnerError(
                f"every tuning trial of cell '{cell.label}' failed, so it has no {', '.join(paths)} to run with; "
                f"see studyrunner status {tuning.study.name}, then studyrunner rerun {tuning.study.name} --failed"
            )
        if choice is not None:
            shown = ", ".join(f"{p.split('.', 1)[1]} {v:g}" if isinstance(v, float) else f"{p} {v}"
                              for p, v in choice.values.items())  # fmt: skip
            say(f"{cell.label}: {shown} (best {choice.metric} on the validation split of {len(choice.scores)})")
    return with_choices(compiled, choices)
