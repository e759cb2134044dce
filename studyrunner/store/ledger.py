"""The ledger: the source of truth for what has run. Keyed by `trial_key`, so writes are idempotent.

One writer (the submitting driver) updates it; any number of readers (`status`, `results`,
analysis) may read it while a study runs.
"""

from __future__ import annotations

import hashlib
import math
import os
import socket
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ..errors import StudyrunnerError
from . import longform, schema
from .db import (
    FINISHED,
    STATUSES,
    AttemptRow,
    CellRow,
    StudyRow,
    SubmissionRow,
    TrialRow,
    make_engine,
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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _sqlite_path(url: str) -> Path | None:
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None


class Ledger:
    """Open the ledger at `url`. `create=False` (read-only commands) opens an existing ledger only,
    so a mistyped --db or workspace says so instead of looking like an empty ledger."""

    def __init__(self, url: str, create: bool = True):
        self.url = url
        path = _sqlite_path(url)
        if not create and path is not None and not path.is_file():
            raise StudyrunnerError(
                f"no results ledger at {str(path)!r}: nothing was submitted with this workspace "
                "(check --db / --workspace / STUDYRUNNER_HOME, or run: studyrunner submit FILE)"
            )
        try:
            if create and path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
            self.engine = make_engine(url)
            if schema.current(self.engine) is None:
                if not create:
                    raise StudyrunnerError(
                        f"{url!r} holds no studyrunner ledger (check --db / STUDYRUNNER_DB, or submit a study first)"
                    )
                schema.create(self.engine)
            schema.check_current(self.engine, url)
        except StudyrunnerError:
            raise
        except NoSuchModuleError:
            raise StudyrunnerError(
                f"cannot open results database {url!r}: not a database URL SQLAlchemy knows "
                "(--db / STUDYRUNNER_DB); use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
            ) from None
        except ImportError as exc:
            raise StudyrunnerError(
                f"--db / STUDYRUNNER_DB: cannot open {url!r}: its database driver is not installed ({exc}); "
                "install it (postgresql: EXTRAS=dev,postgres ./setup.sh) or use sqlite:///PATH"
            ) from None
        except (ArgumentError, SQLAlchemyError, OSError) as exc:
            first = str(exc.args[0] if exc.args else exc).strip().splitlines()[0]
            raise StudyrunnerError(
                f"cannot open results database {url!r}: {first} (check --db / STUDYRUNNER_DB)"
            ) from None
        self._session = sessionmaker(self.engine, expire_on_commit=False)

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
                row = StudyRow(name=study.name, spec_text=text, spec_hash="", description=study.description)
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
        cutoff = utcnow() - timedelta(seconds=stale_after)
        return _aware(row.heartbeat_at) < cutoff or (row.host == socket.gethostname() and not _pid_alive(row.pid))

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
                    .values(status="pending", owner=submission, heartbeat_at=utcnow())
                    .execution_options(synchronize_session=False)
                )
        with self.session() as s:
            return list(s.scalars(select(TrialRow.trial_key).where(TrialRow.owner == submission)))

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

    def release(self, submission: str, *, cancelled: bool = False) -> list[str]:
        """End a submission: its unfinished trials go back to `pending` (or `cancelled`), their open
        attempts end `interrupted` (or `cancelled`), and its leases are dropped. Returns those trials."""
        status = "cancelled" if cancelled else "pending"
        why = "cancelled" if cancelled else "interrupted"
        with self.session() as s, s.begin():
            rows = list(s.scalars(select(TrialRow).where(TrialRow.owner == submission)))
            unfinished = [r for r in rows if r.status not in FINISHED]
            for r in rows:
                r.owner = None
            for r in unfinished:
                r.status, r.failure_class = status, why
                r.error = f"{why} before it finished" if r.attempts else f"{why} before it started"
            self._end_open_attempts(s, [r.trial_key for r in unfinished], why, f"{why} by the submitting process")
            sub = s.get(SubmissionRow, submission)
            if sub is not None:
                sub.ended_at = utcnow()
        return [r.trial_key for r in unfinished]

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
    ) -> None:
        """The trial ended `succeeded`, `failed` or `diverged` (metrics kept when given)."""
        assert status in FINISHED, status
        with self.session() as s, s.begin():
            r = s.get(TrialRow, trial_key)
            r.status, r.finished_at, r.error, r.failure_class, r.owner = status, utcnow(), error, failure_class, None
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
            a.status, a.ended_at, a.message = status, utcnow(), message
            a.error_class = error_class if error_class else (None if status == "succeeded" else status)
            a.traceback_artifact = traceback_artifact

    # Simple transitions, for tests, notebooks and the analysis fixtures.
    def mark_running(self, trial_key: str, run_id: str | None = None) -> None:
        self.start_attempt(trial_key, run_id=run_id)

    def mark_succeeded(self, trial_key: str, metrics: dict[str, Any]) -> None:
        self.finish(trial_key, "succeeded", metrics=metrics)

    def mark_failed(self, trial_key: str, error: str, metrics: dict[str, Any] | None = None) -> None:
        self.finish(trial_key, "failed", metrics=metrics, error=error, failure_class="error")

    # --- reads -----------------------------------------------------------------------------------

    def studies(self) -> list[StudyRow]:
        with self.session() as s:
            return list(s.scalars(select(StudyRow).order_by(StudyRow.created_at)))

    def get_study(self, name: str) -> StudyRow:
        with self.session() as s:
            row = s.get(StudyRow, name)
        if row is None:
            known = ", ".join(r.name for r in self.studies()) or "none yet"
            raise StudyrunnerError(f"no study named {name!r} in {self.url}; known studies: {known}")
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
