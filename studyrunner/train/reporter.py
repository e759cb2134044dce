"""The one object the trainer talks to. The trainer never imports Ray or MLflow."""

from __future__ import annotations

from typing import Protocol


class Reporter(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record metrics measured at `step` (1-based optimizer step; 0 = before training)."""


class MemoryReporter:
    """Keeps every record in memory: for tests, benchmarks and notebooks."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.rows.append({"step": step, **metrics})

    def series(self, name: str) -> list[tuple[int, float]]:
        return [(r["step"], r[name]) for r in self.rows if name in r]
