"""A trial's status in the ledger, and the moves between statuses the ledger makes.

The ledger stores the value as a string column (portable across SQLite and PostgreSQL); `TrialStatus` is a
`StrEnum`, so a row's `status` compares equal to its member and code never spells a status as a literal.
`stale` is not a status: it is a pending or running trial whose lease holder has gone silent (leases.py).

The moves, and the ledger verb that makes each:

    pending    --start-->   running                      Attempts.start_attempt (the trial's attempt starts)
    running    --end-->     succeeded | failed | diverged  Attempts.finish
    running    --start-->   running                      a new attempt: Ray Tune retries an infrastructure failure
    running    --release--> pending                      the command stopped (Leases.release), or it died and a
                                                         later claim takes the trial over (Leases.claim)
    cancelled  --release--> pending                      a submit claimed it and stopped before starting it
    pending | running --cancel--> cancelled              Leases.request_cancel (unleased pending trials),
                                                         Leases.release(cancelled=True) (its own trials)
    cancelled  --start-->   running                      a later submit runs it
    pending | cancelled --end--> succeeded | failed | diverged   an attempt whose lease was lost while it ran
                                                         (its silent driver was reaped, yet alive) records its end
    succeeded | failed | diverged --start--> running     a rerun's new attempt: the only way out of an ended status

Claiming a trial (Leases.claim) takes its lease and changes no status but that of a running trial whose holder
died (back to pending): a claimed ended trial keeps its outcome until the new attempt starts. A bulk move leaves a
trial already in the target status as it is (releasing a pending trial keeps it pending): that is no move. Every
write of a status is checked against `TRANSITIONS`; an illegal one raises `IllegalTransition` (a bug, not a user
error). New trials are inserted `pending` (registration.py, looks.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class TrialStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DIVERGED = "diverged"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """Ended with an outcome the analysis reads (a diverged seed is a data point, not a crash)."""
        return self in FINISHED

    @property
    def unsuccessful(self) -> bool:
        """Ended without succeeding: what `rerun --failed` runs again and failure rates count."""
        return self in UNSUCCESSFUL

    def can_become(self, other: str) -> bool:
        """Whether the ledger may move a trial from this status to `other` (a status, or its string)."""
        return TrialStatus(other) in TRANSITIONS[self]


# In this order in `status` tables and counts.
STATUSES: tuple[TrialStatus, ...] = tuple(TrialStatus)
FINISHED: tuple[TrialStatus, ...] = (TrialStatus.SUCCEEDED, TrialStatus.FAILED, TrialStatus.DIVERGED)
UNSUCCESSFUL: tuple[TrialStatus, ...] = (TrialStatus.FAILED, TrialStatus.DIVERGED)
UNFINISHED: tuple[TrialStatus, ...] = tuple(s for s in STATUSES if s not in FINISHED)
# What a `submit` or `resume` runs of its registered trials (`rerun` may claim any status).
SUBMIT_RUNS: tuple[TrialStatus, ...] = (TrialStatus.PENDING, TrialStatus.CANCELLED)

TRANSITIONS: dict[TrialStatus, frozenset[TrialStatus]] = {
    # an attempt whose lease was lost while it trained (its driver, silent, was reaped, yet alive) still records
    # its outcome: the training happened, and nothing stored is lost; so pending and cancelled may end too
    TrialStatus.PENDING: frozenset({TrialStatus.RUNNING, TrialStatus.CANCELLED, *FINISHED}),
    TrialStatus.RUNNING: frozenset(
        {
            TrialStatus.SUCCEEDED,
            TrialStatus.FAILED,
            TrialStatus.DIVERGED,
            TrialStatus.RUNNING,  # a retried attempt
            TrialStatus.PENDING,
            TrialStatus.CANCELLED,
        }
    ),
    TrialStatus.CANCELLED: frozenset({TrialStatus.RUNNING, TrialStatus.PENDING, *FINISHED}),
    # ended trials start again only as a new attempt of a trial a rerun claimed
    TrialStatus.SUCCEEDED: frozenset({TrialStatus.RUNNING}),
    TrialStatus.FAILED: frozenset({TrialStatus.RUNNING}),
    TrialStatus.DIVERGED: frozenset({TrialStatus.RUNNING}),
}


class IllegalTransition(RuntimeError):
    """The ledger was asked to move a trial between two statuses `TRANSITIONS` does not link: a bug in
    studyrunner (the write is refused, the trial keeps its status)."""

    def __init__(self, trial_key: str | Iterable[str] | None, old: str, new: str, action: str) -> None:
        keys = [trial_key] if isinstance(trial_key, str) else list(trial_key or ())
        self.trial_key = keys[0] if len(keys) == 1 else (keys or None)  # a bulk move: the trials it would move
        self.old, self.new, self.action = TrialStatus(old), TrialStatus(new), action
        who = f"trial {keys[0]}" if len(keys) == 1 else f"trials {', '.join(keys)}" if keys else "a trial"
        allowed = ", ".join(f"'{s}'" for s in STATUSES if s in TRANSITIONS[self.old]) or "nothing"
        super().__init__(
            f"{who}: the ledger cannot move a trial from '{self.old}' to '{self.new}' ({action}); a '{self.old}' "
            f"trial may become {allowed} only (store/status.py TRANSITIONS). This is a bug in studyrunner."
        )


def check_move(trial_key: str, old: str, new: str, action: str) -> TrialStatus:
    """Refuse moving trial `trial_key` from `old` to `new` unless `TRANSITIONS` allows it; returns `new`."""
    if not TrialStatus(old).can_become(new):
        raise IllegalTransition(trial_key, old, new, action)
    return TrialStatus(new)


def illegal_sources(sources: Iterable[str], new: str) -> list[TrialStatus]:
    """Of the statuses a bulk move to `new` selects, those that may not become `new` (one already `new` stays)."""
    return [TrialStatus(s) for s in sources if s != new and not TrialStatus(s).can_become(new)]


def ended_outcomes(rows) -> dict[str, dict | None]:
    """{trial_key: its metrics, None where it ended without succeeding} for the ledger rows that ended: what a
    `tune:` section's choice reads (study/tuning.py `choose`), so that the study package needs no ledger."""
    return {r.trial_key: (r.metrics or {}) if r.status == TrialStatus.SUCCEEDED else None
            for r in rows if r.status in FINISHED}  # fmt: skip
