"""Live terminal progress for a submission: trials done/running/failed, steps, ETA."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from .driver_callback import DriverCallback
from .recorder import _error_text


class ProgressDisplay(DriverCallback):
    """Counts trials by state and shows overall progress in optimizer steps (a fair ETA basis)."""

    def __init__(self, steps_by_key: dict[str, int], console: Console | None = None):
        self.steps_by_key = steps_by_key
        self.done_steps: dict[str, int] = {}
        self.running: set[str] = set()
        self.succeeded = self.failed = 0
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[counts]}"),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("training", total=sum(steps_by_key.values()), counts=self._counts())

    def _counts(self) -> str:
        total = len(self.steps_by_key)
        return (
            f"[green]{self.succeeded} done[/] [cyan]{len(self.running)} running[/] "
            f"[red]{self.failed} failed[/] of {total} trials"
        )

    def _refresh(self) -> None:
        self.progress.update(self.task, completed=sum(self.done_steps.values()), counts=self._counts())

    def __enter__(self) -> ProgressDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._refresh()
        self.progress.stop()

    @staticmethod
    def _key(trial) -> str:
        return trial.config["trial"]["trial_key"]

    def on_trial_start(self, iteration, trials, trial, **info):
        self.running.add(self._key(trial))
        self._refresh()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.done_steps[self._key(trial)] = int(result.get("step", 0))
        self._refresh()

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.done_steps[self._key(trial)] = 0
        self._refresh()

    def on_trial_complete(self, iteration, trials, trial, **info):
        key = self._key(trial)
        self.running.discard(key)
        self.done_steps[key] = self.steps_by_key[key]
        self.succeeded += 1
        self._refresh()

    def on_trial_error(self, iteration, trials, trial, **info):
        key = self._key(trial)
        self.running.discard(key)
        self.done_steps[key] = self.steps_by_key[key]  # nothing more will run for it
        self.failed += 1
        first = _error_text(trial).splitlines()[0]
        self.progress.console.print(Text.assemble(("failed ", "red"), key, ": ", first), highlight=False)
        self._refresh()
