"""Running a study's `tune:` section before its seeds (study/tuning.py says what is chosen and how).

The tuning study `<name>--tune` is submitted like any study (same stores, same Ray, same leases), so a tuning
trial that ran is never run again and a killed submit resumes it. Once every tuning trial has ended, each
cell's choice is read from the ledger and the study's cells take it; from then on the study runs as if its
file had named each cell's value. `resume`, `rerun` and the analysis read the same choices from the ledger.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from ...errors import StudyrunnerError
from ...store import Ledger
from ...study import CompiledStudy
from ...study.tuning import choose, group_of, tuned_paths, tuning_of, with_choices


def choices_in(ledger: Ledger, compiled: CompiledStudy, tuning: CompiledStudy | None = None):
    """The choices the ledger's tuning trials give (None while they have not all ended, or without `tune:`)."""
    tuning = tuning or tuning_of(compiled)
    if tuning is None or not any(s.name == tuning.study.name for s in ledger.studies()):
        return None
    rows = {r.trial_key: (r.status, r.metrics) for r in ledger.trials(tuning.study.name)}
    return choose(tuning, tuned_paths(compiled.study), rows)


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
