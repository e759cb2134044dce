"""The ledger: the source of truth for what has run. Keyed by `trial_key`, so writes are idempotent.

One writer (the submitting driver) updates it; any number of readers (`status`, `results`,
analysis) may read it while a study runs.
"""

from __future__ import annotations

import hashlib
import math
import os
import socket
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, and_, case, func, make_url, or_, select, update
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ..errors import StudyrunnerError
from ..urls import mask_text, mask_url
from . import longform, schema
from .db import (
    FINISHED,
    STATUSES,
    AttemptRow,
    CellRow,
    LookClaimRow,
    LookRow,
    SearchPointRow,
    StudyRow,
    SubmissionRow,
    TrialRow,
    make_engine,
    sqlite_reader,
    utcnow,
)

# A submission silent this long has lost its leases; its unfinished trials are `stale` (resumable).
# Drivers beat every few seconds, so a minute without one is a dead or wedged process.
STALE_AFTER_S = float(os.environ.get("STUDYRUNNER_STALE_AFTER", "60"))
# What `submit` and `resume` run besides new trials. Failed and diverged trials are `rerun`'s.
SUBMIT_RUNS = ("pending", "cancelled")


@dataclass(frozen=True)
class Registration:
    to_run: list[str]  # trial keys a submit runs: new, pending (interrupted, never run) or cancelled
    skipped: list[str]  # trial keys that already succeeded
    new: int  # trial rows inserted by this registration
    held: list[str] = field(default_factory=list)  # failed, diverged or running: not a submit's to run


def _aware(moment: datetime | None) -> datetime:
    """SQLite hands back naive datetimes; the ledger writes UTC."""
    if moment is None:
        return datetime.min.replace(tzinfo=UTC)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _json_safe(metrics: dict[str, Any]) -> dict[str, Any]:
    """NaN and infinities as null: a diverged trial's loss is NaN, which JSON (and PostgreSQL) refuse."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}


def _study_row(study) -> StudyRow:
    return StudyRow(
        name=study.name,
        spec_text=study.text,
        spec_hash=hashlib.sha256(study.text.encode()).hexdigest(),
        description=study.description,
    )


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


def submission_process_alive(row: SubmissionRow) -> bool:
    """Is the process of a submission made on this host still running? Its pid alone could be a newer
    process's (pids are reused): one that started after the submission was opened is not its process."""
    if not _pid_alive(row.pid):
        return False
    started = _process_started_at(row.pid)
    return started is None or started <= _aware(row.started_at) + timedelta(seconds=2)


def _writable(path: Path) -> bool:
    """Can SQLite write the file (and, for its journal, the folder it is in)?"""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def _sqlite_path(url: str) -> Path | None:
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None


@contextmanager
def database_errors(url: str, option: str = "--db / STUDYRUNNER_DB") -> Iterator[None]:
    """Opening a database: every way it fails is one line naming the URL (its password masked, also where the
    driver's message quotes it) and the option to mend."""
    shown = mask_url(url)
    try:
        yield
    except StudyrunnerError:
        raise
    except NoSuchModuleError:
        raise StudyrunnerError(
            f"cannot open results database {shown!r}: not a database URL SQLAlchemy knows ({option}); "
            "use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
        ) from None
    except ImportError as exc:
        raise StudyrunnerError(
            f"{option}: cannot open {shown!r}: its database driver is not installed ({mask_text(str(exc), url)}); "
            "install it (postgresql: EXTRAS=dev,postgres ./setup.sh) or use sqlite:///PATH"
        ) from None
    except (ArgumentError, SQLAlchemyError, OSError, sqlite3.Error) as exc:
        first = str(exc.args[0] if exc.args else exc).strip().splitlines()[0]
        first = mask_text(first, url)
        raise StudyrunnerError(f"cannot open results database {shown!r}: {first} (check {option})") from None


def open_engine(url: str, *, read_only: bool = False) -> tuple[Engine, str | None]:
    """An engine on an existing database (errors as one line); for an SQLite file with `read_only`, one
    that writes nothing (db.sqlite_reader). Returns (engine, read mode: None, "read-only" or "immutable")."""
    path = _sqlite_path(url)
    if path is not None and not path.is_file():
        raise StudyrunnerError(
            f"no results ledger at {str(path)!r}: nothing was submitted with this workspace "
            "(check --db / --workspace / STUDYRUNNER_HOME, or run: studyrunner submit FILE)"
        )
    with database_errors(url):
        if read_only and path is not None:
            return sqlite_reader(url)
        return make_engine(url), None


def probe(url: str) -> None:
    """Check that a ledger URL can be used, writing nothing: the URL parses, its driver is installed, a
    server database answers, and an SQLite file that exists is a ledger or empty (read-only: a file that is
    not a ledger is refused as it was; one is created only when the ledger is). One line if not."""
    with database_errors(url):
        parsed = make_url(url)
        parsed.get_dialect()
        if parsed.get_backend_name() != "sqlite":
            with make_engine(url).connect():
                pass
            return
        path = _sqlite_path(url)
        if path is not None and path.is_file() and path.stat().st_size > 0:
            engine, _mode = sqlite_reader(url)
            try:
                schema.current(engine, url)
            finally:
                engine.dispose()


class Ledger:
    """Open the ledger at `url`.

    `create=False` (commands that work on what was submitted) opens an existing ledger only, so a mistyped
    --db or workspace says so instead of looking like an empty ledger. `read_only=True` (the read verbs:
    status, results, analyze, verify, report) also writes nothing: an SQLite ledger is opened read-only,
    or as an immutable snapshot on a read-only mount; `read_mode` then says which (None: read-write).

    A database that holds tables but no ledger (an app's, MLflow's store) is refused, never made into one."""

    def __init__(self, url: str, create: bool = True, read_only: bool = False):
        self.url = url
        self.read_mode: str | None = None
        path = _sqlite_path(url)
        if not read_only:
            self.check_writable(url)
        with database_errors(url):
            if create and not read_only:
                if path is not None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                self.engine = make_engine(url)
            else:
                self.engine, self.read_mode = open_engine(url, read_only=read_only)
            if schema.current(self.engine, url) is None:
                if not create or read_only:
                    empty = path is not None and path.is_file() and path.stat().st_size == 0
                    raise StudyrunnerError(
                        f"{path} is empty (0 bytes: a submit stopped before it made the ledger there); `studyrunner "
                        "submit` makes it, or delete the file"
                        if empty
                        else f"{mask_url(url)!r} holds no studyrunner ledger (check --db / STUDYRUNNER_DB, or submit a "
                        "study first)"
                    )
                schema.create(self.engine)
            schema.check_current(self.engine, url)
        self._session = sessionmaker(self.engine, expire_on_commit=False)

    @staticmethod
    def check_writable(url: str) -> None:
        """Before a command writes to an SQLite ledger: one line if its file cannot be written."""
        path = _sqlite_path(url)
        if path is not None and path.is_file() and not _writable(path):
            raise StudyrunnerError(
                f"the results ledger {str(path)!r} cannot be written (a read-only location) and this command writes "
                "to it: copy the workspace somewhere writable (status, results, analyze, verify, report read it as is)"
            )

    @property
    def read_note(self) -> str | None:
        """A line for the user when the ledger could only be opened read-only (a read-only location)."""
        if self.read_mode != "immutable":
            return None
        path = _sqlite_path(self.url)
        wal = path.with_name(path.name + "-wal") if path else None
        unread = wal is not None and wal.is_file() and wal.stat().st_size > 0
        return f"{path} is on a read-only location: reading it as an immutable snapshot" + (
            f"; its write-ahead log ({wal.name}, not yet merged) cannot be read there, so the last writes "
            "may be missing (copy the folder somewhere writable to see them)"
            if unread
            else ""
        )

    def session(self) -> Session:
        return self._session()

    # --- writes (driver) -------------------------------------------------------------------------

    def register(self, compiled) -> Registration:
        """Record the study, its cells and trials; say which trials a submit runs (new, pending,
        cancelled or interrupted ones) and which already succeeded. Failed and diverged trials are
        left alone: `studyrunner rerun` runs them. Two processes registering at once both succeed."""
        for attempt in range(5):
            try:
                return self._register(compiled)
            except IntegrityError:  # another process inserted the same rows first: read them now
                if attempt == 4:
                    raise
                time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    def _register(self, compiled) -> Registration:
        study = compiled.study
        text = study.text
        with self.session() as s, s.begin():
            row = s.get(StudyRow, study.name)
            if row is None:
                row = _study_row(study)
                s.add(row)
            row.spec_text, row.description, row.updated_at = text, study.description, utcnow()
            row.spec_hash = hashlib.sha256(text.encode()).hexdigest()
            s.flush()
            known_cells = {c.cell_hash: c for c in s.scalars(select(CellRow).where(CellRow.study == study.name))}
            for cell in compiled.cells:
                baseline_of = [list(tag) for tag in cell.baseline_of] or None
                if cell.cell_hash not in known_cells:
                    s.add(
                        CellRow(
                            study=study.name,
                            cell_hash=cell.cell_hash,
                            label=cell.label,
                            config=cell.config,
                            overrides=cell.overrides,
                            baseline_of=baseline_of,
                        )
                    )
                    s.flush()
                    longform.write_params(s, study.name, cell.cell_hash, cell.config)
                elif baseline_of and known_cells[cell.cell_hash].baseline_of != baseline_of:
                    known_cells[cell.cell_hash].baseline_of = baseline_of  # baselines added to the study later
            s.flush()
            keys = [t.trial_key for t in compiled.trials]
            existing = {r.trial_key: r for r in s.scalars(select(TrialRow).where(TrialRow.trial_key.in_(keys)))}
            to_run, skipped, held, new = [], [], [], 0
            for t in compiled.trials:
                r = existing.get(t.trial_key)
                if r is None:
                    s.add(TrialRow(trial_key=t.trial_key, study=study.name, cell_hash=t.cell_hash, seed=t.seed))
                    new += 1
                    to_run.append(t.trial_key)
                elif r.status == "succeeded":
                    skipped.append(t.trial_key)
                elif r.status in SUBMIT_RUNS:
                    to_run.append(t.trial_key)
                else:
                    held.append(t.trial_key)
        return Registration(to_run, skipped, new, held)

    def ensure_study(self, study) -> None:
        """The study's row, made from its file when missing (a row that exists is left as it is): what a
        submission of a study no submit has registered yet needs before anything else is written."""
        try:
            with self.session() as s, s.begin():
                if s.get(StudyRow, study.name) is None:
                    s.add(_study_row(study))
        except IntegrityError:  # another process made it first
            pass

    def set_experiment(self, study: str, experiment_id: str) -> None:
        with self.session() as s, s.begin():
            s.get(StudyRow, study).mlflow_experiment_id = experiment_id

    def set_cell_run(self, study: str, cell_hash: str, run_id: str) -> None:
        with self.session() as s, s.begin():
            s.get(CellRow, (study, cell_hash)).mlflow_run_id = run_id

    # --- submissions and leases ------------------------------------------------------------------

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
        statuses: tuple[str, ...] = ("pending", "cancelled"),
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
            runnable = or_(TrialRow.status.in_(statuses), and_(TrialRow.status == "running", TrialRow.owner.in_(dead)))
            for i in range(0, len(keys), 500):
                s.execute(
                    update(TrialRow)
                    .where(TrialRow.trial_key.in_(keys[i : i + 500]), runnable, free)
                    # A finished trial keeps its outcome until an attempt of it starts (start_attempt):
                    # a command that stops before then leaves it as it was.
                    .values(
                        status=case((TrialRow.status == "running", "pending"), else_=TrialRow.status),
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
            result = s.execute(
                update(TrialRow)
                .where(TrialRow.study == study, TrialRow.status == "pending", TrialRow.owner.is_(None))
                .values(status="cancelled", failure_class="cancelled", error="cancelled before it started")
            )
        return len(live), result.rowcount

    def release(self, submission: str, *, cancelled: bool = False, died: bool = False) -> list[str]:
        """End a submission: its unfinished trials go back to `pending` (or `cancelled`), their open
        attempts end `interrupted` (or `cancelled`), and its leases are dropped. Returns those trials.

        `died`: the process was killed without releasing anything (reap_dead). It may have died in the
        middle of any MLflow write, so every trial it ran an attempt of is flagged `mlflow_dirty`, for
        `sync-mlflow` (and `resume`, which syncs) to compare and mend."""
        status = "cancelled" if cancelled else "pending"
        why = "cancelled" if cancelled else "interrupted"
        mine = TrialRow.owner == submission
        with self.session() as s, s.begin():
            # Conditional UPDATEs, never read-then-write: two resumes reap the same dead submission at once,
            # and the slower one's list of its trials may be old by the time it writes; writing those rows
            # by key would drop the lease the faster one has taken since (both then ran every trial).
            unfinished = list(
                s.scalars(
                    update(TrialRow)
                    .where(mine, TrialRow.status.not_in(FINISHED))
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
            self._end_open_attempts(s, unfinished, why, f"{why} {by}")
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

    # --- one trial's attempts ------------------------------------------------------------------

    def start_attempt(
        self, trial_key: str, submission: str | None = None, run_id: str | None = None, ray_trial_id: str | None = None
    ) -> int:
        """The trial is running a new attempt; returns the attempt's number (1, 2, ...)."""
        with self.session() as s, s.begin():
            r = s.get(TrialRow, trial_key)
            self._end_open_attempts(s, [trial_key], "interrupted", "superseded by a new attempt")
            r.status, r.started_at, r.finished_at = "running", utcnow(), None
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
            self._end_open_attempts(s, [trial_key], "failed", message, error_class, traceback_artifact)

    def finish(
        self,
        trial_key: str,
        status: str,
        *,
        metrics: dict[str, Any] | None = None,
        error: str | None = None,
        failure_class: str | None = None,
        traceback_artifact: str | None = None,
        mlflow_dirty: bool | None = None,
    ) -> None:
        """The trial ended `succeeded`, `failed` or `diverged` (metrics kept when given). `mlflow_dirty`:
        set the flag in the same transaction (the driver sets it until MLflow shows the outcome too)."""
        assert status in FINISHED, status
        with self.session() as s, s.begin():
            r = s.get(TrialRow, trial_key)
            r.status, r.finished_at, r.error, r.failure_class, r.owner = status, utcnow(), error, failure_class, None
            if mlflow_dirty is not None:
                r.mlflow_dirty = mlflow_dirty
            if metrics:
                r.metrics = _json_safe(metrics)
                longform.write_metrics(s, r.study, trial_key, metrics)
            message = (error or "").strip().splitlines()[0] if error else None
            self._end_open_attempts(s, [trial_key], status, message, failure_class, traceback_artifact)

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

    @staticmethod
    def _end_open_attempts(s, keys, status, message=None, error_class=None, traceback_artifact=None) -> None:
        if not keys:
            return
        q = select(AttemptRow).where(AttemptRow.trial_key.in_(keys), AttemptRow.ended_at.is_(None))
        for a in s.scalars(q):
            a.status, a.ended_at = status, utcnow()
            a.message = f"{a.message}; {message}" if a.message and message else (message or a.message)
            a.error_class = error_class if error_class else (None if status == "succeeded" else status)
            a.traceback_artifact = traceback_artifact

    # Simple transitions, for tests, notebooks and the analysis fixtures.
    def mark_running(self, trial_key: str, run_id: str | None = None) -> None:
        self.start_attempt(trial_key, run_id=run_id)

    def mark_succeeded(self, trial_key: str, metrics: dict[str, Any]) -> None:
        self.finish(trial_key, "succeeded", metrics=metrics)

    def mark_failed(self, trial_key: str, error: str, metrics: dict[str, Any] | None = None) -> None:
        self.finish(trial_key, "failed", metrics=metrics, error=error, failure_class="error")

    # --- searches (`search:`, orchestrate/search.py) -------------------------------------------------

    def add_search_point(
        self,
        study: str,
        search: str,
        number: int,
        base_hash: str,
        params: dict[str, Any],
        cell_hash: str | None,
        *,
        state: str = "running",
        error: str | None = None,
    ) -> None:
        """Record a configuration a search suggested (Optuna trial `number` of Optuna study `search`) and the
        cell it made; a point already recorded is left as it is."""
        with self.session() as s, s.begin():
            if s.get(SearchPointRow, (study, search, number)) is None:
                s.add(
                    SearchPointRow(
                        study=study,
                        search=search,
                        number=number,
                        base_hash=base_hash,
                        cell_hash=cell_hash,
                        params=params,
                        state=state,
                        error=error,
                    )
                )

    def tell_search_point(
        self, study: str, search: str, number: int, state: str, value: float | None, seeds: int | None
    ) -> None:
        """What Optuna was told of a point: `complete` with the value (over `seeds` seeds), or `failed`."""
        with self.session() as s, s.begin():
            row = s.get(SearchPointRow, (study, search, number))
            row.state, row.value, row.seeds, row.told_at = state, value, seeds, utcnow()

    def search_points(self, study: str) -> list[SearchPointRow]:
        q = select(SearchPointRow).where(SearchPointRow.study == study)
        with self.session() as s:
            return list(s.scalars(q.order_by(SearchPointRow.search, SearchPointRow.number)))

    # --- sequential studies (`seeds: {start, max}`, orchestrate/waves.py) ----------------------------

    def record_look(
        self, study: str, look: dict[str, Any], claims: list[dict[str, Any]], trials: list[tuple[str, str, int]]
    ) -> None:
        """A look of a sequential study, its claims, and the trials (key, cell_hash, seed) of the wave it adds, in
        one transaction: after a crash the ledger holds the look and its wave, or neither. Raises StudyrunnerError
        when the look is already recorded (another process took it)."""
        try:
            with self.session() as s, s.begin():
                s.add(LookRow(study=study, **look))
                s.flush()
                for row in claims:
                    s.add(LookClaimRow(study=study, look=look["number"], **_json_safe(row)))
                for key, cell_hash, seed in trials:
                    s.add(TrialRow(trial_key=key, study=study, cell_hash=cell_hash, seed=seed))
        except IntegrityError:
            raise StudyrunnerError(
                f"look {look['number']} of study {study!r} was recorded by another process meanwhile; submit again "
                "to continue from it"
            ) from None

    def looks(self, study: str) -> list[tuple[LookRow, list[LookClaimRow]]]:
        """The study's looks in order, each with its claims in the study file's order."""
        with self.session() as s:
            looks = list(s.scalars(select(LookRow).where(LookRow.study == study).order_by(LookRow.number)))
            claims = list(
                s.scalars(
                    select(LookClaimRow)
                    .where(LookClaimRow.study == study)
                    .order_by(LookClaimRow.look, LookClaimRow.claim)
                )
            )
        by_look: dict[int, list[LookClaimRow]] = {}
        for row in claims:
            by_look.setdefault(row.look, []).append(row)
        return [(look, by_look.get(look.number, [])) for look in looks]

    # --- reads -----------------------------------------------------------------------------------

    def studies(self) -> list[StudyRow]:
        with self.session() as s:
            return list(s.scalars(select(StudyRow).order_by(StudyRow.created_at)))

    def get_study(self, name: str) -> StudyRow:
        with self.session() as s:
            row = s.get(StudyRow, name)
        if row is None:
            known = ", ".join(r.name for r in self.studies()) or "none yet"
            raise StudyrunnerError(f"no study named {name!r} in {mask_url(self.url)}; known studies: {known}")
        return row

    def cells(self, study: str) -> list[CellRow]:
        with self.session() as s:
            return list(s.scalars(select(CellRow).where(CellRow.study == study)))

    def trials(
        self, study: str, keys: list[str] | None = None, statuses: tuple[str, ...] | None = None
    ) -> list[TrialRow]:
        """The study's trials (those of `keys`, those in `statuses`: filtered in SQL, so listing the few
        failed trials of a 100,000-trial study does not load the other 99,000)."""
        q = select(TrialRow).where(TrialRow.study == study).order_by(TrialRow.created_at, TrialRow.trial_key)
        if keys is not None:
            q = q.where(TrialRow.trial_key.in_(keys))
        if statuses is not None:
            q = q.where(TrialRow.status.in_(statuses))
        with self.session() as s:
            return list(s.scalars(q))

    def attempts(self, trial_key: str) -> list[AttemptRow]:
        with self.session() as s:
            q = select(AttemptRow).where(AttemptRow.trial_key == trial_key).order_by(AttemptRow.number)
            return list(s.scalars(q))

    def provenance(self, study: str) -> dict[str, dict[str, Any]]:
        """trial_key -> provenance of its latest attempt that reported one (code and runtime versions)."""
        q = (
            select(AttemptRow.trial_key, AttemptRow.number, AttemptRow.provenance)
            .join(TrialRow, TrialRow.trial_key == AttemptRow.trial_key)
            .where(TrialRow.study == study, AttemptRow.provenance.is_not(None))
            .order_by(AttemptRow.trial_key, AttemptRow.number)
        )
        with self.session() as s:
            return {key: prov for key, _n, prov in s.execute(q)}  # later attempts overwrite earlier

    def stale_keys(self, study: str | None = None, stale_after: float = STALE_AFTER_S) -> set[str]:
        """Unfinished trials nobody is running: held by a dead submission, or `running` with no holder
        (left by a driver from before leases existed). `resume` runs them; `status` shows them."""
        with self.session() as s:
            return set(s.scalars(select(TrialRow.trial_key).where(self._stale(study, stale_after))))

    def _stale(self, study: str | None, stale_after: float):
        dead = [r.id for r in self.dead_submissions(study, stale_after)]
        where = and_(
            TrialRow.status.in_(("pending", "running")),
            or_(TrialRow.owner.in_(dead), and_(TrialRow.status == "running", TrialRow.owner.is_(None))),
        )
        return where if study is None else and_(where, TrialRow.study == study)

    def status_counts(self, study: str | None = None, stale_after: float = STALE_AFTER_S) -> dict[str, Counter]:
        """Trials per status per study; `stale` counts unfinished trials whose holder is gone."""
        q = select(TrialRow.study, TrialRow.status, func.count()).group_by(TrialRow.study, TrialRow.status)
        if study is not None:
            self.get_study(study)
            q = q.where(TrialRow.study == study)
        stale = (
            select(TrialRow.study, TrialRow.status, func.count())
            .where(self._stale(study, stale_after))
            .group_by(TrialRow.study, TrialRow.status)
        )
        out: dict[str, Counter] = {}
        with self.session() as s:
            for name, status, n in s.execute(q):
                out.setdefault(name, Counter({k: 0 for k in (*STATUSES, "stale")}))[status] = n
            for name, status, n in s.execute(stale):
                out[name][status] -= n
                out[name]["stale"] += n
        return out

    def trials_by_key(self, keys: list[str]) -> list[TrialRow]:
        with self.session() as s:
            return [
                r
                for i in range(0, len(keys), 500)
                for r in s.scalars(select(TrialRow).where(TrialRow.trial_key.in_(keys[i : i + 500])))
            ]
