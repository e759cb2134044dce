"""Submissions and their leases: who runs what. A submission (one submit, resume or rerun process) holds
leases on the trials it runs and, for a study run from one submit at a time, on the study; it beats a
heartbeat, and when it ends or dies its leases are released so another process can take the trials over."""

from __future__ import annotations

import os
import socket
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import and_, case, or_, select, update
from sqlalchemy.orm import Session

from ..errors import StudyrunnerError
from ..settings import seconds_or_default
from .attempts import end_open_attempts
from .db import AttemptRow, StudyRow, SubmissionRow, TrialRow, utcnow
from .opening import LedgerDatabase
from .status import SUBMIT_RUNS, UNFINISHED, IllegalTransition, TrialStatus, illegal_sources

# A submission silent this long has lost its leases; its unfinished trials are `stale` (resumable).
# Drivers beat every few seconds, so a minute without one is a dead or wedged process.
STALE_AFTER_S = seconds_or_default("STUDYRUNNER_STALE_AFTER", 60.0)


def _aware(moment: datetime | None) -> datetime:
    """SQLite hands back naive datetimes; the ledger writes UTC."""
    if moment is None:
        return datetime.min.replace(tzinfo=UTC)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _process_started_at(pid: int) -> datetime | None:
    """When process `pid` started (Linux /proc), or None where that cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        stat = Path("/proc/stat").read_text().splitlines()
        boot = next(int(line.split()[1]) for line in stat if line.startswith("btime"))
    except (OSError, IndexError, StopIteration, ValueError):
        return None
    ticks = int(fields[19])  # field 22 of stat: start time in clock ticks after boot
    return datetime.fromtimestamp(boot + ticks / os.sysconf("SC_CLK_TCK"), UTC)


def refuse_illegal_moves(s: Session, where, sources: tuple[str, ...], new: TrialStatus, action: str) -> None:
    """Before a bulk UPDATE of the trials `where` selects in `sources` to status `new`: refuse it when the
    table (status.py TRANSITIONS) forbids one of those moves, naming the trials it would have moved."""
    bad = illegal_sources(sources, new)
    if bad:
        q = select(TrialRow.trial_key, TrialRow.status).where(where, TrialRow.status.in_(bad)).limit(5)
        rows = s.execute(q).all()
        raise IllegalTransition([key for key, _ in rows] or None, rows[0][1] if rows else bad[0], new, action)


def submission_process_alive(row: SubmissionRow) -> bool:
    """Is the process of a submission made on this host still running? Its pid alone could be a newer
    process's (pids are reused): one that started after the submission was opened is not its process."""
    if not _pid_alive(row.pid):
        return False
    started = _process_started_at(row.pid)
    return started is None or started <= _aware(row.started_at) + timedelta(seconds=2)


class Leases(LedgerDatabase):
    """Claiming, holding and releasing trials and studies (part of the `Ledger`)."""

    def open_submission(self, study: str, command: str) -> str:
        """A new lease holder for `study` (this process); returns its id."""
        sid = uuid.uuid4().hex
        with self.session() as s, s.begin():
            s.add(SubmissionRow(id=sid, study=study, command=command, host=socket.gethostname(), pid=os.getpid()))
        return sid

    def set_ray_session(self, submission: str, session_dir: str | None) -> None:
        with self.session() as s, s.begin():
            s.get(SubmissionRow, submission).ray_session_dir = session_dir

    def heartbeat(self, submission: str) -> bool:
        """Keep the submission's leases alive; returns True when someone asked it to cancel."""
        with self.session() as s, s.begin():
            row = s.get(SubmissionRow, submission)
            row.heartbeat_at = utcnow()
            return row.cancel_requested_at is not None

    def dead_submissions(self, study: str | None = None, stale_after: float = STALE_AFTER_S) -> list[SubmissionRow]:
        """Submissions that no longer hold their leases: ended, silent for `stale_after` seconds, or
        (on this host) whose process is gone."""
        return [r for r in self._open_submissions(study) if self._is_dead(r, stale_after)]

    def live_submissions(self, study: str, stale_after: float = STALE_AFTER_S) -> list[SubmissionRow]:
        return [r for r in self._open_submissions(study) if not self._is_dead(r, stale_after)]

    def _open_submissions(self, study: str | None) -> list[SubmissionRow]:
        q = select(SubmissionRow).where(SubmissionRow.ended_at.is_(None))
        if study is not None:
            q = q.where(SubmissionRow.study == study)
        with self.session() as s:
            return list(s.scalars(q))

    @staticmethod
    def _is_dead(row: SubmissionRow, stale_after: float) -> bool:
        """On this host the process decides: a live submit is never taken over, however long since its
        heartbeat (`--stale-after 0` included); a dead one is dead at once. On other hosts, where the
        process cannot be seen, a heartbeat older than `stale_after` seconds decides."""
        if row.host == socket.gethostname():
            return not submission_process_alive(row)
        return _aware(row.heartbeat_at) < utcnow() - timedelta(seconds=stale_after)

    def claim(
        self,
        study: str,
        keys: list[str],
        submission: str,
        statuses: tuple[str, ...] = SUBMIT_RUNS,
        stale_after: float = STALE_AFTER_S,
    ) -> list[str]:
        """Take the lease on those of `keys` in `statuses` (or left running by a dead submission) that no
        live submission holds; returns the keys now held by `submission`.

        One conditional UPDATE per batch, so two processes claiming at once never both get a trial: on
        SQLite writes are serialised, on PostgreSQL the loser re-checks the row after the winner commits."""
        dead = [r.id for r in self.dead_submissions(study, stale_after)]
        with self.session() as s, s.begin():
            known = select(SubmissionRow.id).where(SubmissionRow.ended_at.is_(None))
            free = or_(TrialRow.owner.is_(None), TrialRow.owner.in_(dead), TrialRow.owner.not_in(known))
            running, pending = TrialStatus.RUNNING, TrialStatus.PENDING
            runnable = or_(TrialRow.status.in_(statuses), and_(TrialRow.status == running, TrialRow.owner.in_(dead)))
            for i in range(0, len(keys), 500):
                batch = and_(TrialRow.trial_key.in_(keys[i : i + 500]), runnable, free)
                refuse_illegal_moves(s, batch, (running,), pending, "claim of a trial its dead holder left running")
                s.execute(
                    update(TrialRow)
                    .where(batch)
                    # A finished trial keeps its outcome until an attempt of it starts (start_attempt):
                    # a command that stops before then leaves it as it was.
                    .values(
                        status=case((TrialRow.status == running, pending), else_=TrialRow.status),
                        owner=submission,
                        heartbeat_at=utcnow(),
                    )
                    .execution_options(synchronize_session=False)
                )
        with self.session() as s:
            return list(s.scalars(select(TrialRow.trial_key).where(TrialRow.owner == submission)))

    def claim_owner(self, study: str, submission: str, stale_after: float = STALE_AFTER_S) -> SubmissionRow | None:
        """Take a study that runs from one submit at a time (a search, a sequential study) for `submission`,
        unless a live submission holds it; returns None when `submission` holds it now, else the holder.

        One conditional UPDATE of the study's row, as `claim` takes trials: of two submits claiming at once
        exactly one gets it (SQLite serialises the writes; on PostgreSQL the loser's UPDATE waits for the
        winner's and re-checks the row it wrote). A holder that is dead (as `dead_submissions` decides) or
        ended is taken over; `release` gives it back."""
        dead = [r.id for r in self.dead_submissions(study, stale_after)]
        with self.session() as s, s.begin():
            ended = select(SubmissionRow.id).where(SubmissionRow.ended_at.is_not(None))
            free = or_(
                StudyRow.owner.is_(None),
                StudyRow.owner == submission,
                StudyRow.owner.in_(dead),
                StudyRow.owner.in_(ended),  # an ended submission stays ended: no newer row can be missed
            )
            s.execute(
                update(StudyRow)
                .where(StudyRow.name == study, free)
                .values(owner=submission)
                .execution_options(synchronize_session=False)
            )
        with self.session() as s:
            owner = s.scalar(select(StudyRow.owner).where(StudyRow.name == study))
            if owner is None:
                raise StudyrunnerError(f"no study named {study!r} in {self.url} to run")
            return None if owner == submission else s.get(SubmissionRow, owner)

    def request_cancel(self, study: str) -> tuple[int, int]:
        """Ask the study's live submissions to stop; unleased pending trials become cancelled at once.
        Returns (submissions asked, trials cancelled now)."""
        live = [r.id for r in self.live_submissions(study)]
        with self.session() as s, s.begin():
            if live:
                s.execute(update(SubmissionRow).where(SubmissionRow.id.in_(live)).values(cancel_requested_at=utcnow()))
            unheld = and_(TrialRow.study == study, TrialRow.owner.is_(None))
            refuse_illegal_moves(s, unheld, (TrialStatus.PENDING,), TrialStatus.CANCELLED, "cancel")
            result = s.execute(
                update(TrialRow)
                .where(unheld, TrialRow.status == TrialStatus.PENDING)
                .values(status=TrialStatus.CANCELLED, failure_class="cancelled", error="cancelled before it started")
            )
        return len(live), result.rowcount

    def release(self, submission: str, *, cancelled: bool = False, died: bool = False) -> list[str]:
        """End a submission: its unfinished trials go back to `pending` (or `cancelled`), their open
        attempts end `interrupted` (or `cancelled`), and its leases are dropped. Returns those trials.

        `died`: the process was killed without releasing anything (reap_dead). It may have died in the
        middle of any MLflow write, so every trial it ran an attempt of is flagged `mlflow_dirty`, for
        `sync-mlflow` (and `resume`, which syncs) to compare and mend."""
        status = TrialStatus.CANCELLED if cancelled else TrialStatus.PENDING
        why = "cancelled" if cancelled else "interrupted"  # the failure class
        mine = TrialRow.owner == submission
        with self.session() as s, s.begin():
            # Conditional UPDATEs, never read-then-write: two resumes reap the same dead submission at once,
            # and the slower one's list of its trials may be old by the time it writes; writing those rows
            # by key would drop the lease the faster one has taken since (both then ran every trial).
            refuse_illegal_moves(s, mine, UNFINISHED, status, "release")
            unfinished = list(
                s.scalars(
                    update(TrialRow)
                    .where(mine, TrialRow.status.in_(UNFINISHED))
                    .values(
                        status=status,
                        failure_class=why,
                        error=case(
                            (TrialRow.attempts > 0, f"{why} before it finished"), else_=f"{why} before it started"
                        ),
                        owner=None,
                    )
                    .returning(TrialRow.trial_key)
                    .execution_options(synchronize_session=False)
                )
            )
            s.execute(update(TrialRow).where(mine).values(owner=None).execution_options(synchronize_session=False))
            s.execute(
                update(StudyRow)
                .where(StudyRow.owner == submission)
                .values(owner=None)
                .execution_options(synchronize_session=False)
            )
            by = "by the submitting process" if not died else "(the submitting process died)"
            end_open_attempts(s, unfinished, why, f"{why} {by}")
            if died:
                attempted = select(AttemptRow.trial_key).where(AttemptRow.submission == submission)
                s.execute(
                    update(TrialRow)
                    .where(TrialRow.trial_key.in_(attempted))
                    .values(mlflow_dirty=True)
                    .execution_options(synchronize_session=False)
                )
            sub = s.get(SubmissionRow, submission)
            if sub is not None:
                sub.ended_at = utcnow()
        return unfinished
