"""The one object the trainer talks to. The trainer never imports Ray or MLflow."""

from __future__ import annotations

from typing import Protocol


class Reporter(Protocol):
    """Required: `log`. Optional: `note(message: str)`, a line a user should see about the trial (a
    resume from a checkpoint, a corrupt checkpoint skipped); reporters without it are not sent notes.
    Optional: `facts(values: dict[str, str])`, how the trial computes (device and its name, precision,
    compile mode, torch and CUDA versions, torch.backends switches: `device.Runtime.facts`), sent once
    per attempt before any record; the Ray reporter records them as the MLflow params `runtime.<name>`."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record metrics measured at `step` (1-based optimizer step; 0 = before training)."""


def send_note(reporter: Reporter, message: str) -> None:
    note = getattr(reporter, "note", None)
    if callable(note):
        note(message)


def send_facts(reporter: Reporter, values: dict[str, str]) -> None:
    facts = getattr(reporter, "facts", None)
    if callable(facts):
        facts(dict(values))


class MemoryReporter:
    """Keeps every record (and note) in memory: for tests, benchmarks and notebooks."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.notes: list[str] = []
        self.run_facts: dict[str, str] = {}  # of the latest attempt

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.rows.append({"step": step, **metrics})

    def note(self, message: str) -> None:
        self.notes.append(message)

    def facts(self, values: dict[str, str]) -> None:
        self.run_facts = dict(values)

    def series(self, name: str) -> list[tuple[int, float]]:
        return [(r["step"], r[name]) for r in self.rows if name in r]
