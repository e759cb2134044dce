"""Driver-side recording of every trial event: ledger rows, MLflow runs and Parquet curves."""

from __future__ import annotations

import logging
import pickle
import traceback

from ray import cloudpickle

from ..spec import CompiledStudy, Trial
from ..store import CurveStore, Ledger
from .driver_callback import DriverCallback
from .tracking import Tracker


def _error_text(trial) -> str:
    """First line `ExceptionType: message` (what `results` shows), then the worker's traceback."""
    # At on_trial_error Tune has written the error files to the trial's local folder only.
    summary, details = "", ""
    try:
        with open(trial.pickled_error_file, "rb") as f:
            err = cloudpickle.load(f)
        cause = getattr(err, "cause", None) or err  # a RayTaskError wraps the worker's exception
        summary = "".join(traceback.format_exception_only(type(cause), cause)).strip()
    except (OSError, TypeError, AttributeError, pickle.UnpicklingError):
        pass
    try:
        with open(trial.error_file) as f:
            details = f.read()[-8000:]
    except (OSError, TypeError):
        pass
    return "\n".join(part for part in (summary, details) if part) or "trial failed; see the Ray logs"


class Recorder(DriverCallback):
    def __init__(
        self,
        compiled: CompiledStudy,
        ledger: Ledger,
        tracker: Tracker,
        curves: CurveStore,
        experiment_id: str,
        parent_runs: dict[str, str],
    ):
        self.study = compiled.study
        self.trials: dict[str, Trial] = {t.trial_key: t for t in compiled.trials}
        self.ledger, self.tracker, self.curves = ledger, tracker, curves
        self.experiment_id, self.parent_runs = experiment_id, parent_runs
        self.runs: dict[str, str] = {}  # trial_key -> MLflow run of the current attempt
        self.rows: dict[str, list[dict]] = {}
        self.finished: set[str] = set()

    @staticmethod
    def _key(trial) -> str:
        return trial.config["trial"]["trial_key"]

    def _ensure_run(self, key: str) -> str:
        if key not in self.runs:
            t = self.trials[key]
            self.runs[key] = self.tracker.trial_run(self.experiment_id, self.parent_runs[t.cell_hash], self.study, t)
            self.rows[key] = []
            self.ledger.mark_running(key, self.runs[key])
        return self.runs[key]

    def on_trial_start(self, iteration, trials, trial, **info):
        self._ensure_run(self._key(trial))

    def on_trial_result(self, iteration, trials, trial, result, **info):
        key = self._key(trial)
        run_id = self._ensure_run(key)
        if result.get("facts"):  # how the trial computes (train/device.py), once per attempt
            self.tracker.log_params(run_id, {f"runtime.{k}": str(v) for k, v in result["facts"].items()})
        if result.get("final"):
            return  # the summary repeats the last records; it is stored at completion
        step, metrics = int(result["step"]), result["metrics"]
        self.rows[key].append({"step": step, **metrics})
        self.tracker.log_metrics(run_id, step, metrics)

    def _close(self, key: str, status: str) -> None:
        self.curves.write(self.study.name, key, self.rows.pop(key, []))
        self.tracker.end(self.runs.pop(key), status)
        self.finished.add(key)

    def on_trial_complete(self, iteration, trials, trial, **info):
        key = self._key(trial)
        self._ensure_run(key)
        result = trial.last_result or {}
        final = result.get("metrics", {}) if result.get("final") else {}
        self._close(key, "FINISHED")
        if final:
            self.ledger.mark_succeeded(key, final)
        else:
            self.ledger.mark_failed(key, "trial ended without reporting final metrics")
        self._log_cell_aggregates(key)

    def on_trial_recover(self, iteration, trials, trial, **info):
        """A retry (FailureConfig.max_failures): close this attempt as failed; the next gets a new run."""
        key = self._key(trial)
        if key in self.runs:
            self.tracker.end(self.runs.pop(key), "FAILED")
            self.rows.pop(key, None)

    def on_trial_error(self, iteration, trials, trial, **info):
        key = self._key(trial)
        self._ensure_run(key)
        self._close(key, "FAILED")
        self.ledger.mark_failed(key, _error_text(trial))
        self._log_cell_aggregates(key)

    def _log_cell_aggregates(self, key: str) -> None:
        """The cell's parent run gets the study metric's seed aggregates (mean, sd, n, failure rate) at
        step = seeds finished, so the MLflow runs table compares cells while the study runs."""
        from ..analysis.live import rule_from, seed_aggregates

        cell_hash = self.trials[key].cell_hash
        parent = self.parent_runs.get(cell_hash)
        if parent is None:
            return
        try:
            keys = [k for k, t in self.trials.items() if t.cell_hash == cell_hash]
            rows = [(r.status, r.metrics) for r in self.ledger.trials(self.study.name, keys)]
            aggregates = seed_aggregates(rows, self.study.metric.name, rule_from(self.study.failure))
            self.tracker.log_metrics(parent, int(aggregates["seeds_done"]), aggregates)
            self.tracker.end(parent, "FINISHED")  # the parent run spans its seeds
        except Exception as exc:  # noqa: BLE001 - a summary must never stop the study
            logging.getLogger(__name__).warning("could not log seed aggregates of cell %s: %s", cell_hash, exc)

    def abandon(self) -> list[str]:
        """After an interrupted fit: close the runs still open as KILLED, keep their partial curves."""
        open_keys = list(self.runs)
        for key in open_keys:
            self._close(key, "KILLED")
        return open_keys
