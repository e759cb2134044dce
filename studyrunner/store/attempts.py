"""A trial's attempts and its outcome: an attempt starts, gathers facts, ends failed (and is retried) or the
trial finishes; and the MLflow run and sync flag that go with them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from . import longform
from .db import AttemptRow, TrialRow, json_safe, utcnow
from .opening import LedgerDatabase
from .status import FINISHED, TrialStatus, check_move


def end_open_attempts(s: Session, keys, status, message=None, error_class=None, traceback_artifact=None) -> None:
    """End the open attempts of trials `keys` as `status`, keeping a note already in an attempt's message (how
    it started) before `message`. Module-level because `Leases.release` ends a submission's attempts too.

    An attempt's status is its trial's outcome (succeeded, failed, diverged) or why it stopped short: failed
    (an infrastructure failure Ray Tune retries), interrupted or cancelled (the failure class)."""
    if not keys:
        return
    q = select(AttemptRow).where(AttemptRow.trial_key.in_(keys), AttemptRow.ended_at.is_(None))
    for a in s.scalars(q):
        a.status, a.ended_at = status, utcnow()
        a.message = f"{a.message}; {message}" if a.message and message else (message or a.message)
        a.error_class = error_class if error_class else (None if status == TrialStatus.SUCCEEDED else status)
        a.traceback_artifact = traceback_artifact


class Attempts(LedgerDatabase):
    """What the driver writes as a trial runs (part of the `Ledger`)."""

    def start_attempt(
        self, trial_key: str, submission: str | None = None, run_id: str | None = None, ray_trial_id: str | None = None
    ) -> int:
        """The trial is running a new attempt; returns the attempt's number (1, 2, ...)."""
        with self.session() as s, s.begin():
            r = s.get(TrialRow, trial_key)
            status = check_move(trial_key, r.status, TrialStatus.RUNNING, "start of an attempt")
            end_open_attempts(s, [trial_key], "interrupted", "superseded by a new attempt")
            r.status, r.started_at, r.finished_at = status, utcnow(), None
            r.error, r.failure_class, r.heartbeat_at = None, None, utcnow()
            r.attempts += 1
            if submission:
                r.owner = submission
            if run_id:
                r.mlflow_run_id = run_id
            s.add(AttemptRow(trial_key=trial_key, number=r.attempts, submission=submission, ray_trial_id=ray_trial_id))
            return r.attempts

    def note_attempt(self, trial_key: str, **facts: Any) -> None:
        """Facts about the current attempt as they arrive: host, provenance, resumed_from_step."""
        with self.session() as s, s.begin():
            a = self._open_attempt(s, trial_key)
            if a is not None:
                for name, value in facts.items():
                    setattr(a, name, value)

    def add_attempt_note(self, trial_key: str, note: str) -> None:
        """A line about how the current attempt started (a resume, a corrupt checkpoint skipped), kept in
        its `message` before whatever ends it."""
        with self.session() as s, s.begin():
            a = self._open_attempt(s, trial_key)
            if a is not None:
                a.message = f"{a.message}; {note}" if a.message else note

    def trial_heartbeat(self, trial_key: str) -> None:
        with self.session() as s, s.begin():
            s.execute(update(TrialRow).where(TrialRow.trial_key == trial_key).values(heartbeat_at=utcnow()))

    def end_attempt(
        self, trial_key: str, error_class: str, message: str, traceback_artifact: str | None = None
    ) -> None:
        """The current attempt failed and another follows (an infrastructure failure Ray Tune retries)."""
        with self.session() as s, s.begin():
            # the attempt failed; the trial stays running (its next attempt starts)
            end_open_attempts(s, [trial_key], TrialStatus.FAILED, message, error_class, traceback_artifact)

    def finish(
        self,
        trial_key: str,
        status: TrialStatus,
        *,
        metrics: dict[str, Any] | None = None,
        error: str | None = None,
        failure_class: str | None = None,
        traceback_artifact: str | None = None,
        mlflow_dirty: bool | None = None,
    ) -> None:
        """The trial ended `succeeded`, `failed` or `diverged` (metrics kept when given). `mlflow_dirty`:
        set the flag in the same transaction (the driver sets it until MLflow shows the outcome too)."""
        if status not in FINISHED:
            raise ValueError(f"trial {trial_key}: {status!s} is not an outcome (one of {', '.join(FINISHED)})")
        with self.session() as s, s.begin():
            r = s.get(TrialRow, trial_key)
            status = check_move(trial_key, r.status, status, "end of its attempt")
            r.status, r.finished_at, r.error, r.failure_class, r.owner = status, utcnow(), error, failure_class, None
            if mlflow_dirty is not None:
                r.mlflow_dirty = mlflow_dirty
            if metrics:
                r.metrics = json_safe(metrics)
                longform.write_metrics(s, r.study, trial_key, metrics)
            message = (error or "").strip().splitlines()[0] if error else None
            end_open_attempts(s, [trial_key], status, message, failure_class, traceback_artifact)

    def set_trial_run(self, trial_key: str, run_id: str) -> None:
        """Name the trial's MLflow run. It stays dirty: the run holds nothing yet, and a sync stopped
        now continues it instead of making a second one."""
        with self.session() as s, s.begin():
            s.execute(
                update(TrialRow).where(TrialRow.trial_key == trial_key).values(mlflow_run_id=run_id, mlflow_dirty=True)
            )

    def set_traceback_artifact(self, attempt_id: int, path: str) -> None:
        with self.session() as s, s.begin():
            s.get(AttemptRow, attempt_id).traceback_artifact = path

    def set_mlflow_dirty(self, trial_key: str, dirty: bool = True) -> None:
        with self.session() as s, s.begin():
            s.execute(update(TrialRow).where(TrialRow.trial_key == trial_key).values(mlflow_dirty=dirty))

    @staticmethod
    def _open_attempt(s: Session, trial_key: str) -> AttemptRow | None:
        q = select(AttemptRow).where(AttemptRow.trial_key == trial_key, AttemptRow.ended_at.is_(None))
        return s.scalars(q.order_by(AttemptRow.number.desc())).first()

    # Simple transitions, for tests, notebooks and the analysis fixtures (a trial runs before it ends).
    def mark_running(self, trial_key: str, run_id: str | None = None) -> None:
        self.start_attempt(trial_key, run_id=run_id)

    def mark_succeeded(self, trial_key: str, metrics: dict[str, Any]) -> None:
        self.finish(trial_key, TrialStatus.SUCCEEDED, metrics=metrics)

    def mark_failed(self, trial_key: str, error: str, metrics: dict[str, Any] | None = None) -> None:
        self.finish(trial_key, TrialStatus.FAILED, metrics=metrics, error=error, failure_class="error")
