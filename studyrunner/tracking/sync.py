"""`studyrunner sync-mlflow` (and the end of every `submit`/`resume`/`rerun`): find and mend every way the
ledger, the Parquet curves, the trial checkpoints and MLflow disagree about a study's trials.

The sources of truth are the ledger (status, final metrics) and each trial's checkpoint, which carries every
record the trial made up to it (train/trial_progress.py). Per trial that ever ran:

- **curve**: missing, unreadable, or ending before the trial's newest checkpoint (a driver killed before it
  wrote what its worker had checkpointed) -> written again from the checkpoint's records (an unreadable one
  is set aside first, never deleted);
- **run**: none, or gone from the store -> the one MLflow holds under the trial's key, else a new one the
  ledger then names (one trial, one run);
- **points**: every (metric, step) of the curve and every final metric the curve lacks, compared with the
  run's history, so what is missing is logged and nothing twice (a second sync logs nothing);
- **status**: the run's status and `status`/`failure_class` tags mirror the ledger's;
- the error text of a failed trial as the traceback artifact the driver would have saved.

A full sync audits every trial that ran (one history query per metric and trial); `only_dirty` (what the
commands that run trials do at their end) looks only at trials flagged `mlflow_dirty` (MLflow was down, or
the driver that ran them died), and asks MLflow nothing when none is. Trials a live submit holds are left
to it. Callers reap dead drivers first (orchestrate/submission.py `reap_dead`: their trials flagged, their
local Ray stopped), so a dead driver's half-written records are found; stopping processes is the orchestrator's
job, not the tracking layer's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

from rich.console import Console

from ..errors import StudyrunnerError
from ..store import CurveStore, Ledger
from ..store.curves import CurveUnreadable
from ..store.db import CellRow, StudyRow, TrialRow
from ..store.status import TrialStatus
from ..study import Cell, Trial
from ..urls import mask_text, mask_url
from ..workspace import checkpoint_location
from .guard import first_line
from .tracker import RUN_STATUS, Points, RunHistory, Tracker, final_points, gone, record_points


@dataclass
class SyncReport:
    study: str
    experiment_id: str = ""
    trials_synced: int = 0  # trials something was mended for
    runs_created: int = 0  # trial runs
    runs_continued: int = 0  # runs found again (by the ledger's id or their trial_key tag) and mended
    cell_runs_created: int = 0
    points_logged: int = 0  # metric points sent to MLflow (curves, final metrics, cell aggregates)
    statuses_set: int = 0  # runs whose status did not mirror the ledger's
    curves_rebuilt: int = 0  # curves written again from checkpoints
    held: list[str] = field(default_factory=list)  # trials a live submit is running: not touched
    problems: list[str] = field(default_factory=list)  # what could not be mended, one line each

    @property
    def changed(self) -> bool:
        return bool(self.trials_synced or self.cell_runs_created or self.points_logged or self.curves_rebuilt)


def _ever_ran(row: TrialRow) -> bool:
    # A trial that never started has no run in a healthy study either (cancelled or pending before it ran).
    ended = row.status in (TrialStatus.SUCCEEDED, TrialStatus.FAILED)
    return bool(row.attempts or row.mlflow_run_id or row.mlflow_dirty or ended)


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


def _run_alive(client, run_id: str | None, active: dict[str, SimpleNamespace]) -> bool:
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


def _curve_rows(frame) -> list[dict]:
    rows = frame.drop(columns=["trial_key"], errors="ignore").to_dict("records")
    return [{k: v for k, v in r.items() if v == v} for r in rows]


class _Sync:
    def __init__(
        self,
        ledger: Ledger,
        tracker: Tracker,
        curves: CurveStore,
        study: StudyRow,
        report: SyncReport,
        storage: str | None,
    ):
        self.ledger, self.tracker, self.client, self.curves = ledger, tracker, tracker.client, curves
        self.study, self.spec, self.storage = study, _study(study), storage
        self.report = report
        self.cells = {c.cell_hash: c for c in ledger.cells(study.name)}
        self.parents: dict[str, str] = {}  # cell_hash -> parent run, once ensured
        self.by_tag: dict[tuple[str, str], str] = {}

    def parent(self, experiment_id: str, cell_hash: str) -> str:
        if cell_hash not in self.parents:
            row = self.cells[cell_hash]
            known = row.mlflow_run_id or self.by_tag.get(("cell", cell_hash))
            run_id = self.tracker.cell_run(experiment_id, self.spec, _cell(row), known)
            if run_id != row.mlflow_run_id:
                self.ledger.set_cell_run(self.study.name, cell_hash, run_id)
                if run_id != known:
                    self.report.cell_runs_created += 1
            self.parents[cell_hash] = run_id
        return self.parents[cell_hash]

    # --- curves -------------------------------------------------------------------------------

    def curve(self, row: TrialRow) -> list[dict]:
        """The trial's curve rows, written again from its newest checkpoint where the curve is missing,
        unreadable or ends before that checkpoint."""
        try:
            rows = _curve_rows(self.curves.read(self.study.name, row.trial_key))
            unreadable = None
        except FileNotFoundError:
            rows, unreadable = [], None
        except CurveUnreadable as exc:
            rows, unreadable = [], exc
        last = max((int(r["step"]) for r in rows), default=-1)
        newest = self._newest_checkpoint_step(row)
        if unreadable is None and (newest is None or newest <= last):
            return rows
        records = self._checkpoint_records(row)
        if records is None:
            if unreadable is not None:
                self.report.problems.append(f"{unreadable}, and no checkpoint holds its records; left as it is")
            return rows
        if unreadable is not None:
            self.curves.set_aside(self.study.name, row.trial_key)
        merged = {int(r["step"]): r for r in records}
        merged.update({int(r["step"]): r for r in rows})  # the same records; the curve's copy wins
        rows = [merged[s] for s in sorted(merged)]
        self.curves.write(self.study.name, row.trial_key, rows)
        self.report.curves_rebuilt += 1
        return rows

    def _location(self, row: TrialRow) -> str | None:
        return checkpoint_location(self.storage, self.study.name, row.trial_key) if self.storage else None

    def _newest_checkpoint_step(self, row: TrialRow) -> int | None:
        from ..train.checkpoint import open_storage, step_of

        location = self._location(row)
        if location is None:
            return None
        steps = [s for s in map(step_of, open_storage(location).names()) if s is not None]
        return max(steps, default=None)

    def _checkpoint_records(self, row: TrialRow) -> list[dict] | None:
        from ..train.checkpoint import Checkpoints, open_storage

        location = self._location(row)
        if location is None:
            return None
        config = self.cells[row.cell_hash].config
        state = Checkpoints(open_storage(location), config=config, seed=row.seed).latest()
        if state is None or not state["progress"].get("records"):
            return None
        return [dict(r) for r in state["progress"]["records"]]

    # --- one trial ----------------------------------------------------------------------------

    def trial(self, experiment_id: str, row: TrialRow, active: dict[str, SimpleNamespace]) -> None:
        rows = self.curve(row)
        run_id = row.mlflow_run_id if _run_alive(self.client, row.mlflow_run_id, active) else None
        created = changed = False
        if run_id is None and (found := self.by_tag.get(("trial", row.trial_key))):
            run_id, changed = found, True  # the ledger lost its id: one trial, one run
            self.tracker.describe_trial_run(run_id, self.spec, _trial(row, self.cells[row.cell_hash]))
            self.ledger.set_trial_run(row.trial_key, run_id)
        elif run_id is None:
            parent = self.parent(experiment_id, row.cell_hash)
            run_id = self.tracker.trial_run(experiment_id, parent, self.spec, _trial(row, self.cells[row.cell_hash]))
            self.ledger.set_trial_run(row.trial_key, run_id)
            created = changed = True
        else:
            self.parent(experiment_id, row.cell_hash)  # a cell run deleted by hand comes back too
        history = RunHistory(self.client, run_id, fresh=created)
        curve: Points = record_points(rows)
        logged = history.log_missing(curve) + history.log_missing(final_points(row.metrics, curve))
        self.report.points_logged += logged
        changed = self.traceback(run_id, row) or changed or bool(logged)
        if changed or self._status_differs(active.get(run_id), row):
            self.tracker.set_outcome(run_id, row.status, row.failure_class)
            self.report.statuses_set += not created
            changed = True
        if row.mlflow_dirty or changed:  # (naming a run flags the trial until its run holds everything)
            self.ledger.set_mlflow_dirty(row.trial_key, False)
        if changed:
            self.report.trials_synced += 1
            if created:
                self.report.runs_created += 1
            else:
                self.report.runs_continued += 1

    @staticmethod
    def _status_differs(run: SimpleNamespace | None, row: TrialRow) -> bool:
        if run is None:
            return True
        tags = run.tags
        return (
            run.status != RUN_STATUS[row.status]
            or tags.get("status") != row.status
            or (row.failure_class is not None and tags.get("failure_class") != row.failure_class)
        )

    def traceback(self, run_id: str, row: TrialRow) -> bool:
        """A failed trial's error text as the artifact the driver would have saved, if it could not."""
        attempts = self.ledger.attempts(row.trial_key) if row.status == TrialStatus.FAILED and row.error else []
        attempt = attempts[-1] if attempts else None
        if attempt is None or attempt.traceback_artifact:
            return False
        path = self.tracker.log_text(run_id, row.error, f"attempts/{attempt.number}/traceback.txt")
        self.ledger.set_traceback_artifact(attempt.id, path)
        return True

    def cell_aggregates(self, cell_hashes: set[str]) -> None:
        """The seed aggregates the driver logs on a cell's parent run as seeds finish, at the last count."""
        from ..study import loads
        from .aggregates import rule_from, seed_aggregates

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
                history = RunHistory(self.client, self.parents[cell_hash])
                self.report.points_logged += history.log_missing(points)


def sync_mlflow(
    ledger: Ledger,
    tracker: Tracker,
    curves: CurveStore,
    study_name: str,
    console: Console | None = None,
    artifact_location: str | None = None,
    *,
    storage: str | None = None,
    only_dirty: bool = False,
    on_trial: Callable[[int, int], None] | None = None,
    again: str | None = None,
) -> SyncReport:
    """Mend what MLflow and the curves lack of the study's trials (see the module docstring). Idempotent: a
    second sync finds nothing to do. `storage` (the workspace's) lets curves be rebuilt from checkpoints;
    `artifact_location` is used only when the experiment must be created; `on_trial(done, total)` is called
    as trials are audited (a progress display); `again` is the command to print for another try."""
    again = again or f"studyrunner sync-mlflow {study_name}"
    study = ledger.get_study(study_name)
    report = SyncReport(study_name)
    rows = [r for r in ledger.trials(study_name) if _ever_ran(r)]
    holders = {r.id for r in ledger.live_submissions(study_name)}
    report.held = [r.trial_key for r in rows if r.owner is not None and r.owner in holders]
    rows = [r for r in rows if r.trial_key not in set(report.held)]
    if only_dirty:
        rows = [r for r in rows if r.mlflow_dirty]
        if not rows:
            return report  # nothing flagged: MLflow is not even asked
    current = ""
    try:
        report.experiment_id = _experiment(tracker, ledger, study, artifact_location)
        runs = tracker.active_runs(report.experiment_id)
        active = {r.info.run_id: SimpleNamespace(status=r.info.status, tags=dict(r.data.tags)) for r in runs}
        sync = _Sync(ledger, tracker, curves, study, report, storage)
        sync.by_tag = tracker.runs_by_tag(report.experiment_id, runs)
        touched: set[str] = set()
        for i, row in enumerate(rows):
            current = row.trial_key
            before = report.trials_synced
            sync.trial(report.experiment_id, row, active)
            if report.trials_synced > before:
                touched.add(row.cell_hash)
            if on_trial is not None:
                on_trial(i + 1, len(rows))
        current = ""
        sync.cell_aggregates(touched)
    except StudyrunnerError:
        raise
    except Exception as exc:  # noqa: BLE001 - MLflow surfaces store and network errors under many types
        where = f" (at trial {current})" if current else ""
        raise StudyrunnerError(
            f"could not sync {study_name} to MLflow at {mask_url(tracker.uri)}{where}: "
            f"{mask_text(first_line(exc), tracker.uri)}; "
            f"{report.trials_synced} trials synced so far (kept): run `{again}` again once it answers"
        ) from None
    if console is not None and report.held:
        console.print(
            f"{len(report.held)} trials are being run by a live submit of {study_name}: left to it "
            "(sync again after it ends)",
            markup=False,
            highlight=False,
        )
    return report
