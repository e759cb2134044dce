"""Terminal progress for a submission: a live bar (trials done/running/failed, steps, ETA), and one line per
trial that fails, diverges or is retried, which `--no-progress` keeps (it drops only the bar)."""

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

    def __init__(self, steps_by_key: dict[str, int], console: Console | None = None, live: bool = True):
        self.steps_by_key, self.live = steps_by_key, live
        self.done_steps: dict[str, int] = {}
        self.running: set[str] = set()
        self.finished: set[str] = set()
        self.succeeded = self.failed = self.diverged = 0
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

    def admit(self, steps_by_key: dict[str, int]) -> None:
        """Trials added mid-run (a search's new suggestion)."""
        self.steps_by_key.update(steps_by_key)
        self.progress.update(self.task, total=sum(self.steps_by_key.values()))
        self._refresh()

    def _counts(self) -> str:
        total = len(self.steps_by_key)
        return (
            f"[green]{self.succeeded} done[/] [cyan]{len(self.running)} running[/] "
            f"[red]{self.failed} failed[/]"
            + (f" [magenta]{self.diverged} diverged[/]" if self.diverged else "")
            + f" of {total} trials"
        )

    def _refresh(self) -> None:
        self.progress.update(self.task, completed=sum(self.done_steps.values()), counts=self._counts())

    def __enter__(self) -> ProgressDisplay:
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._refresh()
        if self.live:
            self.progress.stop()

    @staticmethod
    def _keys(trial) -> list[str]:
        payload = trial.config["trial"]
        return [m["trial_key"] for m in payload["group"]] if "group" in payload else [payload["trial_key"]]

    def on_trial_start(self, iteration, trials, trial, **info):
        self.running.update(k for k in self._keys(trial) if k not in self.finished)
        self._refresh()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        key = result.get("trial_key") or self._keys(trial)[0]
        if result.get("final"):
            self._complete(key, result)
        elif "step" in result:
            self.done_steps[key] = int(result["step"])
        self._refresh()

    def on_trial_recover(self, iteration, trials, trial, **info):
        first = _error_text(trial).splitlines()[0]
        for key in self._keys(trial):
            if key not in self.finished:
                self._say("retrying ", "yellow", key, f"{first} (resuming from its last checkpoint)")

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.running.difference_update(self._keys(trial))  # finals were counted as they came
        self._refresh()

    def _complete(self, key: str, result: dict) -> None:
        self.running.discard(key)
        self.finished.add(key)
        self.done_steps[key] = self.steps_by_key[key]
        outcome = result.get("outcome", "succeeded")
        if outcome == "succeeded":
            self.succeeded += 1
        elif outcome == "diverged":
            self.diverged += 1
            self._say("diverged ", "magenta", key, str(result.get("reason", "")))
        else:
            self.failed += 1
            self._say("failed ", "red", key, f"{result.get('error_type', 'Error')}: {result.get('message', '')}")
        self._refresh()

    def on_trial_error(self, iteration, trials, trial, **info):
        first = _error_text(trial).splitlines()[0]
        for key in self._keys(trial):
            if key in self.finished:
                continue
            self.running.discard(key)
            self.finished.add(key)
            self.done_steps[key] = self.steps_by_key[key]  # nothing more will run for it
            self.failed += 1
            self._say("failed ", "red", key, first)
        self._refresh()

    def _say(self, what: str, style: str, key: str, message: str) -> None:
        first = (message.strip().splitlines() or [""])[0]
        self.progress.console.print(Text.assemble((what, style), key, ": ", first), highlight=False)
