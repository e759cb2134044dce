"""The ledger: the source of truth for what has run. Keyed by `trial_key`, so writes are idempotent.

One writer (the submitting driver) updates it; any number of readers (`status`, `results`,
analysis) may read it while a study runs.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ..errors import StudyrunnerError
from . import schema
from .db import STATUSES, CellRow, StudyRow, TrialRow, make_engine, utcnow


@dataclass(frozen=True)
class Registration:
    to_run: list[str]  # trial keys that must run (new, failed, or left pending/running)
    skipped: list[str]  # trial keys that already succeeded
    new: int  # trial rows inserted by this registration


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
        """Record the study, its cells and trials; say which trials still need to run."""
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
                elif baseline_of and known_cells[cell.cell_hash].baseline_of != baseline_of:
                    known_cells[cell.cell_hash].baseline_of = baseline_of  # baselines added to the study later
            s.flush()
            keys = [t.trial_key for t in compiled.trials]
            existing = {r.trial_key: r for r in s.scalars(select(TrialRow).where(TrialRow.trial_key.in_(keys)))}
            to_run, skipped, new = [], [], 0
            for t in compiled.trials:
                r = existing.get(t.trial_key)
                if r is None:
                    s.add(TrialRow(trial_key=t.trial_key, study=study.name, cell_hash=t.cell_hash, seed=t.seed))
                    new += 1
                elif r.status == "succeeded":
                    skipped.append(t.trial_key)
                    continue
                else:
                    r.status = "pending"  # a failed trial, or one orphaned by a crashed driver
                to_run.append(t.trial_key)
        return Registration(to_run, skipped, new)

    def set_experiment(self, study: str, experiment_id: str) -> None:
        with self.session() as s, s.begin():
            s.get(StudyRow, study).mlflow_experiment_id = experiment_id

    def set_cell_run(self, study: str, cell_hash: str, run_id: str) -> None:
        with self.session() as s, s.begin():
            s.get(CellRow, (study, cell_hash)).mlflow_run_id = run_id

    def mark_running(self, trial_key: str, run_id: str | None = None) -> None:
        with self.session() as s, s.begin():
            r = s.get(TrialRow, trial_key)
            r.status, r.started_at, r.finished_at, r.error = "running", utcnow(), None, None
            r.attempts += 1
            if run_id:
                r.mlflow_run_id = run_id

    def mark_succeeded(self, trial_key: str, metrics: dict[str, Any]) -> None:
        with self.session() as s, s.begin():
            r = s.get(TrialRow, trial_key)
            r.status, r.finished_at, r.metrics, r.error = "succeeded", utcnow(), metrics, None

    def mark_failed(self, trial_key: str, error: str, metrics: dict[str, Any] | None = None) -> None:
        with self.session() as s, s.begin():
            r = s.get(TrialRow, trial_key)
            r.status, r.finished_at, r.error = "failed", utcnow(), error
            if metrics:
                r.metrics = metrics

    def reset_to_pending(self, keys: list[str]) -> None:
        with self.session() as s, s.begin():
            for r in s.scalars(select(TrialRow).where(TrialRow.trial_key.in_(keys))):
                r.status, r.error = "pending", "interrupted before it finished"

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

    def trials(self, study: str, keys: list[str] | None = None) -> list[TrialRow]:
        q = select(TrialRow).where(TrialRow.study == study).order_by(TrialRow.created_at, TrialRow.trial_key)
        if keys is not None:
            q = q.where(TrialRow.trial_key.in_(keys))
        with self.session() as s:
            return list(s.scalars(q))

    def status_counts(self, study: str | None = None) -> dict[str, Counter]:
        q = select(TrialRow.study, TrialRow.status, func.count()).group_by(TrialRow.study, TrialRow.status)
        if study is not None:
            self.get_study(study)
            q = q.where(TrialRow.study == study)
        out: dict[str, Counter] = {}
        with self.session() as s:
            for name, status, n in s.execute(q):
                out.setdefault(name, Counter({k: 0 for k in STATUSES}))[status] = n
        return out
