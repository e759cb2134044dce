"""Registering a study: its row, its cells and trials, and which of them a submit runs."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from . import longform
from .db import CellRow, StudyRow, TrialRow, utcnow
from .opening import LedgerDatabase
from .status import SUBMIT_RUNS, TrialStatus  # SUBMIT_RUNS: what `submit` and `resume` run besides new trials


@dataclass(frozen=True)
class Registration:
    to_run: list[str]  # trial keys a submit runs: new, pending (interrupted, never run) or cancelled
    skipped: list[str]  # trial keys that already succeeded
    new: int  # trial rows inserted by this registration
    held: list[str] = field(default_factory=list)  # failed, diverged or running: not a submit's to run


def _study_row(study) -> StudyRow:
    return StudyRow(
        name=study.name,
        spec_text=study.text,
        spec_hash=hashlib.sha256(study.text.encode()).hexdigest(),
        description=study.description,
    )


class Registering(LedgerDatabase):
    """What a study is, written by the driver: its row, cells and trials, its MLflow experiment and cell runs
    (part of the `Ledger`)."""

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
                elif r.status == TrialStatus.SUCCEEDED:
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
