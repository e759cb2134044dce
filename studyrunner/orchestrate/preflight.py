"""What a command does before it runs anything: open the stores (every location checked before a write), read the
study as last submitted, refuse an edit that changes what ran cells mean, and say the plan."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from ..errors import StudyrunnerError
from ..store import Ledger
from ..store.ledger import probe as probe_ledger
from ..study import CompiledStudy
from ..study.extension import changed_fields
from ..workspace import Workspace
from .tracking import Tracker


def open_stores(workspace: Workspace, create: bool = True) -> tuple[Ledger, Tracker]:
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
        from .search_storage import with_search_cells

        compiled = with_search_cells(compiled, ledger)
    if compiled.study.sequential is not None:  # its cells' seeds: those of the waves registered so far
        from .waves import with_registered_seeds

        compiled = with_registered_seeds(compiled, ledger)
    return compiled


def refuse_changed_meaning(ledger: Ledger, compiled: CompiledStudy) -> None:
    """Refuse an edit that changes cells that already ran (study/extension.py says which fields may change)."""
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
