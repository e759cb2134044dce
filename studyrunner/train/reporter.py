"""The one object the trainer talks to. The trainer never imports Ray or MLflow."""

from __future__ import annotations

from typing import Protocol


class Reporter(Protocol):
    """Required: `log`. Optional: `note(message: str)`, a line a user should see about the trial (a
    resume from a checkpoint, a corrupt checkpoint skipped); reporters without it are not sent notes."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record metrics measured at `step` (1-based optimizer step; 0 = before training)."""


def send_note(reporter: Reporter, message: str) -> None:
    note = getattr(reporter, "note", None)
    if callable(note):
        note(message)


class MemoryReporter:
    """Keeps every record (and note) in memory: for tests, benchmarks and notebooks."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.notes: list[str] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.rows.append({"step": step, **metrics})

    def note(self, message: str) -> None:
        self.notes.append(message)

    def series(self, name: str) -> list[tuple[int, float]]:
        return [(r["step"], r[name]) for r in self.rows if name in r]
