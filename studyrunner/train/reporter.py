"""The one object the trainer talks to. The trainer never imports Ray or MLflow."""

from __future__ import annotations

from typing import Any, Protocol


class Reporter(Protocol):
    """Required: `log`. Every other method is optional: a reporter without it is not called.

    - `facts(values: dict[str, str])`: how the trial computes (device and its name, precision, compile
      mode, torch and CUDA versions, torch.backends switches: `device.Runtime.facts`), sent once per
      attempt before any record; the Ray reporter records them as the MLflow params `runtime.<name>`.
    - `note(message: str)`: a line a user should see about the trial (a resume from a checkpoint, a
      corrupt checkpoint skipped).
    - `start(step: int)`: once per attempt, before any record, the step it starts from (the resumed
      checkpoint's step; 0 = from scratch). Notes about the resume come before it.
    - `replay(records: list[dict])`: once per resumed attempt, right after `start`: every record the trial
      made up to the checkpoint it resumed from (`{"step": s, **metrics}`, in order), as the checkpoint
      holds them. A reporter that may have missed some (its driver died before recording them) keeps the
      ones it lacks; for one that saw them all they are repeats.
    - `checkpointed(step: int)`: a checkpoint after `step` steps was written (after that step's record).
    - `tick(step: int)`: after every optimizer step (after its record and checkpoint): cheap liveness.

    `log` (or any of these) may raise `outcomes.Diverged(step, reason)` to stop the trial as diverged;
    `run_trial` fills in its metrics and re-raises it."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record metrics measured at `step` (1-based optimizer step; 0 = before training)."""


def _call(reporter: Reporter, name: str, *args: Any) -> None:
    method = getattr(reporter, name, None)
    if callable(method):
        method(*args)


def send_note(reporter: Reporter, message: str) -> None:
    _call(reporter, "note", message)


def send_facts(reporter: Reporter, values: dict[str, str]) -> None:
    _call(reporter, "facts", dict(values))


def send_start(reporter: Reporter, step: int) -> None:
    _call(reporter, "start", step)


def send_replay(reporter: Reporter, records: list[dict[str, float]]) -> None:
    _call(reporter, "replay", [dict(r) for r in records])


def send_checkpointed(reporter: Reporter, step: int) -> None:
    _call(reporter, "checkpointed", step)


def send_tick(reporter: Reporter, step: int) -> None:
    _call(reporter, "tick", step)


class SilentReporter:
    """Drops everything: what the workers of a distributed trial other than its leader report to."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass


class MemoryReporter:
    """Keeps every record (and note) in memory: for tests, benchmarks and notebooks."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.notes: list[str] = []
        self.run_facts: dict[str, str] = {}  # of the latest attempt
        self.starts: list[int] = []  # the step each attempt started from
        self.checkpoint_steps: list[int] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.rows.append({"step": step, **metrics})

    def note(self, message: str) -> None:
        self.notes.append(message)

    def facts(self, values: dict[str, str]) -> None:
        self.run_facts = dict(values)

    def start(self, step: int) -> None:
        self.starts.append(step)

    def checkpointed(self, step: int) -> None:
        self.checkpoint_steps.append(step)

    def replay(self, records: list[dict[str, float]]) -> None:
        have = {r["step"] for r in self.rows}
        self.rows.extend(r for r in records if r["step"] not in have)

    def series(self, name: str) -> list[tuple[int, float]]:
        return [(r["step"], r[name]) for r in self.rows if name in r]
