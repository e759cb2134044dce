"""What a command is asked (`RunOptions`) and what it reports (`SubmitResult`): the two values every step of
`submit`, `resume` and `rerun` passes along (commands/runner.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..store.ledger import STALE_AFTER_S


@dataclass
class SubmitResult:
    study: str
    trials: int
    skipped: list[str] = field(default_factory=list)  # succeeded before
    held: list[str] = field(default_factory=list)  # failed or diverged before: `rerun` runs them
    busy: list[str] = field(default_factory=list)  # being run by another live submit
    study_busy: bool = False  # a search or sequential study another live submit runs (nothing was run)
    succeeded: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    diverged: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)  # back to pending: resume runs them
    cancelled: list[str] = field(default_factory=list)
    wall_time_s: float = 0.0

    @property
    def ran(self) -> int:
        return len(self.succeeded) + len(self.failed) + len(self.diverged)


@dataclass(frozen=True)
class RunOptions:
    address: str | None = None
    max_concurrent: int | None = None
    max_failures: int | None = None  # None: the study file's `retries:`
    show_progress: bool = True
    stale_after: float = STALE_AFTER_S
