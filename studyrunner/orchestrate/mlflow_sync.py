"""`studyrunner sync-mlflow`: make MLflow show what the ledger and the Parquet curves hold.

A trial needs it when MLflow missed something while it ran (`mlflow_dirty`: the driver's MlflowGuard
found MLflow down), when it never got a run, or when its run is gone from the store. For each such trial
the sync ensures the study's experiment, the cell's parent run and the trial's ONE run (the ledger's,
continued, else a new one the ledger then names), logs the curve points the run lacks, compared per
(metric, step) with the run's history so that running it again logs nothing, mirrors the ledger's status
on the run, and clears the flag. Trials a live submit holds are left to it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from rich.console import Console

from ..errors import StudyrunnerError
from ..spec import Cell, Trial
from ..store import CurveStore, Ledger
from ..store.db import CellRow, StudyRow, TrialRow
from .mlflow_guard import first_line
from .tracking import Tracker, gone

BATCH = 1000  # MLflow's per-request metric limit


@dataclass
class SyncReport:
    study: str
    experiment_id: str = ""
    trials_synced: int = 0
    runs_created: int = 0  # trial runs
    runs_continued: int = 0
    cell_runs_created: int = 0
    points_logged: int = 0  # metric points sent to MLflow (curves, final metrics, cell aggregates)
    held: list[str] = field(default_factory=list)  # trials a live submit is running: not touched

    @property
    def changed(self) -> bool:
        return bool(self.trials_synced or self.cell_runs_created or self.points_logged)


# --- what a trial needs -----------------------------------------------------------------------


def _ever_ran(row: TrialRow) -> bool:
    # A trial that never started has no run in a healthy study either (cancelled or pending before it ran).
    return bool(row.attempts or row.mlflow_run_id or row.mlflow_dirty or row.status in ("succeeded", "failed"))


def _active_runs(client, experiment_id: str) -> set[str]:
    """Every active run of the experiment, in a few paged queries instead of one get_run per trial."""
    ids: set[str] = set()
    token = None
    while True:
        page = client.search_runs([experiment_id], max_results=BATCH, page_token=token)
        ids.update(r.info.run_id for r in page)
        token = page.token
        if not token:
            return ids


def _run_alive(client, run_id: str | None, active: set[str]) -> bool:
    if not run_id:
        return False
    if run_id in active:
        return True
    from mlflow.exceptions import MlflowException

    try:  # a run the ledger names in another experiment (renamed or moved by hand)
        return client.get_run(run_id).info.lifecycle_stage == "active"
    except MlflowException as exc:
        if gone(exc):
            return False
        raise


# --- curves and metrics -------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    """A loggable metric value; NaN is a metric a row does not carry (rows may differ in metrics)."""
    if isinstance(value, str) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def curve_points(curves: CurveStore, study: str, trial_key: str) -> dict[str, dict[int, float]]:
    """metric -> step -> value from the trial's Parquet curve (empty when it has none)."""
    try:
        frame = curves.read(study, trial_key)
    except FileNotFoundError:  # not a storage error: those stop the sync before the flag is cleared
        return {}
    points: dict[str, dict[int, float]] = {}
    steps = [int(s) for s in frame["step"]] if "step" in frame else []
    for column in frame.columns:
        if column in ("trial_key", "step"):
            continue
        for step, raw in zip(steps, frame[column], strict=True):
            value = _number(raw)
            if value is not None:
                points.setdefault(str(column), {})[step] = value
    return points


class _History:
    """The run's logged steps per metric, fetched once per metric."""

    def __init__(self, client, run_id: str):
        self.client, self.run_id = client, run_id
        self._steps: dict[str, set[int]] = {}

    def steps(self, key: str) -> set[int]:
        if key not in self._steps:
            self._steps[key] = {m.step for m in self.client.get_metric_history(self.run_id, key)}
        return self._steps[key]

    def missing(self, points: dict[str, dict[int, float]]) -> list[tuple[str, int, float]]:
        return [
            (key, step, value)
            for key, by_step in points.items()
            for step, value in sorted(by_step.items())
            if step not in self.steps(key)
        ]

    def add(self, items: list[tuple[str, int, float]]) -> None:
        for key, step, _ in items:
            self.steps(key).add(step)


def _log_points(client, run_id: str, items: list[tuple[str, int, float]]) -> int:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(key, value, now, step) for key, step, value in items]
    for i in range(0, len(metrics), BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + BATCH])
    return len(metrics)


def _final_points(row: TrialRow, curve: dict[str, dict[int, float]]) -> dict[str, dict[int, float]]:
    """The ledger's final metrics the curve lacks (`train_time_s`, ...), at the curve's last step. A metric
    the curve has is its curve in MLflow, as the driver logs it: not a second point at the last step
    (`params` and `effective_depth` are recorded once, at step 0)."""
    last = max((step for by_step in curve.values() for step in by_step), default=0)
    final = {key: _number(value) for key, value in (row.metrics or {}).items() if key not in curve}
    return {key: {last: value} for key, value in final.items() if value is not None}


def _backfill(client, run_id: str, points: list[dict[str, dict[int, float]]]) -> int:
    """Log the points the run lacks, in order (a later set fills only what earlier ones did not)."""
    history, logged = _History(client, run_id), 0
    for batch in points:
        items = history.missing(batch)
        if items:
            logged += _log_points(client, run_id, items)
            history.add(items)
    return logged


# --- the study ------------------------------------------------------------------------------------


def _cell(row: CellRow) -> Cell:
    return Cell(row.cell_hash, row.config, row.overrides, row.label, tuple(tuple(t) for t in row.baseline_of or ()))


def _trial(row: TrialRow, cell: CellRow) -> Trial:
    # As the compiler makes it: a trial carries its cell's resolved config and label.
    return Trial(row.trial_key, row.study, row.cell_hash, row.seed, cell.config, cell.label)


def _study(row: StudyRow) -> SimpleNamespace:
    """What Tracker reads of a study (name, file text, source) from the ledger's copy of the file."""
    return SimpleNamespace(name=row.name, text=row.spec_text, source=f"<study {row.name} in the ledger>")


def _experiment(tracker: Tracker, ledger: Ledger, row: StudyRow, artifact_location: str | None) -> str:
    client = tracker.client
    if row.mlflow_experiment_id:
        from mlflow.exceptions import MlflowException

        try:
            exp = client.get_experiment(row.mlflow_experiment_id)
        except MlflowException as exc:
            if not gone(exc):
                raise
            exp = None
        if exp is not None and exp.lifecycle_stage == "active":
            return exp.experiment_id
    experiment_id = tracker.experiment(row.name, artifact_location, row.description or "")
    if experiment_id != row.mlflow_experiment_id:
        ledger.set_experiment(row.name, experiment_id)
    return experiment_id


class _Sync:
    def __init__(self, ledger: Ledger, tracker: Tracker, curves: CurveStore, study: StudyRow, report: SyncReport):
        self.ledger, self.tracker, self.client, self.curves = ledger, tracker, tracker.client, curves
        self.study, self.spec = study, _study(study)
        self.report = report
        self.cells = {c.cell_hash: c for c in ledger.cells(study.name)}
        self.parents: dict[str, str] = {}  # cell_hash -> parent run, once ensured

    def parent(self, experiment_id: str, cell_hash: str) -> str:
        if cell_hash not in self.parents:
            row = self.cells[cell_hash]
            run_id = self.tracker.cell_run(experiment_id, self.spec, _cell(row), row.mlflow_run_id)
            if run_id != row.mlflow_run_id:
                self.ledger.set_cell_run(self.study.name, cell_hash, run_id)
                self.report.cell_runs_created += 1
            self.parents[cell_hash] = run_id
        return self.parents[cell_hash]

    def trial(self, experiment_id: str, row: TrialRow, alive: bool) -> None:
        run_id = row.mlflow_run_id if alive else None
        if run_id is None:
            parent = self.parent(experiment_id, row.cell_hash)
            run_id = self.tracker.trial_run(experiment_id, parent, self.spec, _trial(row, self.cells[row.cell_hash]))
            self.ledger.set_trial_run(row.trial_key, run_id)
            self.report.runs_created += 1
        else:
            self.parent(experiment_id, row.cell_hash)  # a cell run deleted by hand comes back too
            self.report.runs_continued += 1
        curve = curve_points(self.curves, self.study.name, row.trial_key)
        self.report.points_logged += _backfill(self.client, run_id, [curve, _final_points(row, curve)])
        self.traceback(run_id, row)
        self.tracker.set_outcome(run_id, row.status, row.failure_class)
        self.ledger.set_mlflow_dirty(row.trial_key, False)
        self.report.trials_synced += 1

    def traceback(self, run_id: str, row: TrialRow) -> None:
        """A failed trial's error text as the artifact the driver would have saved, if it could not."""
        attempts = self.ledger.attempts(row.trial_key) if row.status == "failed" and row.error else []
        attempt = attempts[-1] if attempts else None
        if attempt is None or attempt.traceback_artifact:
            return
        path = self.tracker.log_text(run_id, row.error, f"attempts/{attempt.number}/traceback.txt")
        self.ledger.set_traceback_artifact(attempt.id, path)

    def cell_aggregates(self, cell_hashes: set[str]) -> None:
        """The seed aggregates the driver logs on a cell's parent run as seeds finish, at the last count."""
        from ..analysis.live import rule_from, seed_aggregates
        from ..spec import loads

        try:
            spec = loads(self.study.spec_text, source=self.spec.source)
            metric, rule = spec.metric.name, rule_from(getattr(spec, "failure", None))
        except Exception:  # noqa: BLE001 - a file today's schema no longer reads: the trials are synced
            return
        by_cell: dict[str, list[TrialRow]] = {}
        for row in self.ledger.trials(self.study.name):
            by_cell.setdefault(row.cell_hash, []).append(row)
        for cell_hash in sorted(cell_hashes & set(self.parents)):
            aggregates = seed_aggregates([(r.status, r.metrics) for r in by_cell.get(cell_hash, [])], metric, rule)
            step = int(aggregates["seeds_done"])
            if step:
                points = {key: {step: float(value)} for key, value in aggregates.items()}
                self.report.points_logged += _backfill(self.client, self.parents[cell_hash], [points])


def sync_mlflow(
    ledger: Ledger,
    tracker: Tracker,
    curves: CurveStore,
    study_name: str,
    console: Console | None = None,
    artifact_location: str | None = None,
) -> SyncReport:
    """Backfill MLflow from the ledger and curves for the study's trials MLflow lacks (see the module
    docstring). Idempotent: a second sync finds nothing to do. `artifact_location` is used only when
    the experiment must be created."""
    study = ledger.get_study(study_name)
    report = SyncReport(study_name)
    rows = [r for r in ledger.trials(study_name) if _ever_ran(r)]
    holders = {r.id for r in ledger.live_submissions(study_name)}
    report.held = [r.trial_key for r in rows if r.owner is not None and r.owner in holders]
    rows = [r for r in rows if r.trial_key not in set(report.held)]
    current = ""
    try:
        report.experiment_id = _experiment(tracker, ledger, study, artifact_location)
        active = _active_runs(tracker.client, report.experiment_id)
        sync = _Sync(ledger, tracker, curves, study, report)
        touched: set[str] = set()
        for row in rows:
            alive = _run_alive(tracker.client, row.mlflow_run_id, active)
            if row.mlflow_dirty or not alive:
                current = row.trial_key
                sync.trial(report.experiment_id, row, alive)
                touched.add(row.cell_hash)
        current = ""
        sync.cell_aggregates(touched)
    except StudyrunnerError:
        raise
    except Exception as exc:  # noqa: BLE001 - MLflow surfaces store and network errors under many types
        where = f" (at trial {current})" if current else ""
        raise StudyrunnerError(
            f"could not sync {study_name} to MLflow at {tracker.uri}{where}: {first_line(exc)}; "
            f"{report.trials_synced} trials synced so far (kept): run `studyrunner sync-mlflow {study_name}` "
            "again once it answers"
        ) from None
    if console is not None and report.held:
        console.print(
            f"{len(report.held)} trials are being run by a live submit of {study_name}: left to it "
            "(sync again after it ends)",
            markup=False,
            highlight=False,
        )
    return report
