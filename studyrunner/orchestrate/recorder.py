"""Driver-side recording of every trial event: ledger rows and attempts, MLflow runs, Parquet curves.

How each way a trial attempt ends is recorded (the trainable ends every attempt it survives with one
final report saying which: trainable.py):
- `succeeded` / `diverged` (final metrics kept: a diverged seed is a data point) / code or config
  `error` (failed, not retried): from the final report, in `on_trial_complete`;
- the worker died, ran out of memory or lost its node (infrastructure): Ray Tune retries it up to the
  study's `retries:` (`on_trial_recover`: the attempt ends, the trial stays running and the retry resumes
  from the trial's last checkpoint), and once retries are spent it is failed (`on_trial_error`);
- the driver stopped (Ctrl-C, `cancel`): nothing here; the submission releases what it held.

One trial is one MLflow run however many attempts it takes: a retry, a rerun or a resume continues the
run the ledger names. MLflow being unreachable never stops a study (MlflowGuard): the ledger and the
curves get everything, the trial is flagged `mlflow_dirty`, and `studyrunner sync-mlflow` backfills.
"""

from __future__ import annotations

import logging
import pickle
import time
import traceback
from typing import Any

from ray import cloudpickle

from ..spec import CompiledStudy, Trial
from ..store import CurveStore, Ledger
from .driver_callback import DriverCallback
from .mlflow_guard import MlflowGuard
from .tracking import Tracker

TRIAL_HEARTBEAT_S = 5.0  # at most one ledger write per trial per this many seconds for heartbeats


def _error_text(trial) -> str:
    """First line `ExceptionType: message`, then the traceback Ray saved (an attempt that died)."""
    # At on_trial_error Tune has written the error files to the trial's local folder only.
    summary, details = "", ""
    try:
        with open(trial.pickled_error_file, "rb") as f:
            err = cloudpickle.load(f)
        cause = getattr(err, "cause", None) or err  # a RayTaskError wraps the worker's exception
        summary = "".join(traceback.format_exception_only(type(cause), cause)).strip()
    except (OSError, TypeError, AttributeError, pickle.UnpicklingError, EOFError):
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
        submission: str | None = None,
        warn=None,
    ):
        self.study = compiled.study
        self.trials: dict[str, Trial] = {t.trial_key: t for t in compiled.trials}
        self.ledger, self.tracker, self.curves = ledger, tracker, curves
        self.mlflow = MlflowGuard(tracker, study=compiled.study.name, warn=warn)
        self.dirty: set[str] = set()  # trials MLflow lacks something of (flagged once each)
        self.experiment_id, self.parent_runs = experiment_id, parent_runs
        self.submission = submission
        self.runs: dict[str, str | None] = {}  # trial_key -> its MLflow run, while an attempt is open
        self.rows: dict[str, dict[int, dict]] = {}  # trial_key -> step -> record (every attempt's)
        self.logged_to: dict[str, int] = {}  # trial_key -> last step sent to MLflow by this driver
        self.beats: dict[str, float] = {}
        self.finished: set[str] = set()

    @staticmethod
    def _keys(trial) -> list[str]:
        """The trials a Tune trial runs: one, or a cell's seeds trained together (`vectorize_seeds`)."""
        payload = trial.config["trial"]
        return [m["trial_key"] for m in payload["group"]] if "group" in payload else [payload["trial_key"]]

    def _key_of(self, trial, result: dict) -> str:
        return result.get("trial_key") or self._keys(trial)[0]

    # --- MLflow, guarded ----------------------------------------------------------------------

    def _mlflow(self, key: str, fn, *args) -> Any:
        ok, value = self.mlflow.call(fn, *args)
        if not ok and key not in self.dirty:
            self.dirty.add(key)
            self.ledger.set_mlflow_dirty(key)
        return value

    def _open_run(self, key: str) -> str | None:
        """The trial's one MLflow run: the ledger's (continued), else a new one."""
        known = next(iter(self.ledger.trials_by_key([key])), None)
        run_id = known.mlflow_run_id if known else None
        if run_id and self._mlflow(key, self.tracker.continue_run, run_id):
            # Steps an earlier driver already logged (up to a crash) are not logged twice.
            last = self._mlflow(key, self.tracker.last_step, run_id, "train_loss")
            self.logged_to[key] = max(self.logged_to.get(key, -1), last if last is not None else -1)
            return run_id
        t = self.trials[key]
        return self._mlflow(
            key, self.tracker.trial_run, self.experiment_id, self.parent_runs[t.cell_hash], self.study, t
        )

    # --- Tune callbacks -----------------------------------------------------------------------

    def on_trial_start(self, iteration, trials, trial, **info):
        for key in self._keys(trial):
            if key in self.runs or key in self.finished:  # a retry Tune started without a recover callback
                continue
            self.runs[key] = run_id = self._open_run(key)
            if key not in self.rows:
                self.rows[key] = self._stored_rows(key)
            self.ledger.start_attempt(key, self.submission, run_id, getattr(trial, "trial_id", None))
            self.beats[key] = time.monotonic()

    def _stored_rows(self, key: str) -> dict[int, dict]:
        """Records of earlier attempts (a resume after a crash): the curve continues, not restarts."""
        try:
            frame = self.curves.read(self.study.name, key)
        except (OSError, FileNotFoundError):
            return {}
        rows = frame.drop(columns=["trial_key"]).to_dict("records")
        return {int(r["step"]): {k: v for k, v in r.items() if v == v} for r in rows}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        key = self._key_of(trial, result)
        if key in self.finished:
            return
        if key not in self.runs:
            self.on_trial_start(iteration, trials, trial)
        run_id = self.runs[key]
        self._heartbeat(key)
        self._note_attempt(key, run_id, result)
        if result.get("checkpoint_step") is not None:  # the worker has a checkpoint: keep the curve to it
            self.curves.write(self.study.name, key, self._rows(key))
        if result.get("final"):
            self._complete(key, result)
            return
        if result.get("heartbeat") or result.get("note") or "metrics" not in result:
            return
        step, metrics = int(result["step"]), result["metrics"]
        self.rows[key][step] = {"step": step, **metrics}
        if run_id and step > self.logged_to.get(key, -1):  # a retry resends steps since its checkpoint
            self._mlflow(key, self.tracker.log_metrics, run_id, step, metrics)
            self.logged_to[key] = step

    def _heartbeat(self, key: str) -> None:
        now = time.monotonic()
        if now - self.beats.get(key, 0.0) >= TRIAL_HEARTBEAT_S:
            self.beats[key] = now
            self.ledger.trial_heartbeat(key)

    def _note_attempt(self, key: str, run_id: str | None, result: dict) -> None:
        facts: dict[str, Any] = {}
        if result.get("provenance"):
            facts["provenance"] = {**result["provenance"], **(result.get("facts") or {})}
            facts["host"] = result["provenance"].get("host")
        if result.get("resumed_from_step") is not None:
            facts["resumed_from_step"] = int(result["resumed_from_step"])
        if facts:
            self.ledger.note_attempt(key, **facts)
        if result.get("facts") and run_id:  # how the trial computes (train/device.py), once per attempt
            params = {f"runtime.{k}": str(v) for k, v in result["facts"].items()}
            self._mlflow(key, self.tracker.log_params, run_id, params)

    def on_trial_complete(self, iteration, trials, trial, **info):
        """Every attempt the trainable survives ends in a final report per trial, recorded as it
        arrives (`_complete`); trials still open here were stopped by the driver (cancel) and are
        released with the submission."""

    def _complete(self, key: str, result: dict) -> None:
        outcome = result.get("outcome", "succeeded")
        metrics = result.get("metrics") or {}
        if outcome == "succeeded":
            self._finish(key, "succeeded", metrics=metrics)
        elif outcome == "diverged":
            self._finish(key, "diverged", metrics=metrics, error=result.get("reason"), failure_class="divergence")
        else:
            error = f"{result.get('error_type', 'Error')}: {result.get('message', '')}"
            artifact = self._save_traceback(key, result.get("traceback") or error)
            full = f"{error}\n{result.get('traceback', '')}".strip()
            self._finish(key, "failed", metrics=metrics, error=full, failure_class="error", traceback_artifact=artifact)

    def on_trial_recover(self, iteration, trials, trial, **info):
        """An infrastructure failure Tune retries: this attempt ends; the trial and its run go on."""
        text = _error_text(trial)
        for key in self._keys(trial):
            if key not in self.runs:
                continue  # finished before the failure (a seed of a group)
            artifact = self._save_traceback(key, text)
            self.ledger.end_attempt(key, "infrastructure", text.splitlines()[0], artifact)
            self.curves.write(self.study.name, key, self._rows(key))
            del self.runs[key]

    def on_trial_error(self, iteration, trials, trial, **info):
        """Retries spent (or none allowed) after infrastructure failures: the trial failed."""
        text = _error_text(trial)
        for key in self._keys(trial):
            if key in self.finished:
                continue
            if key not in self.runs:
                self.on_trial_start(iteration, trials, trial)
            artifact = self._save_traceback(key, text)
            self._finish(key, "failed", error=text, failure_class="infrastructure", traceback_artifact=artifact)

    # --- endings ------------------------------------------------------------------------------

    def _save_traceback(self, key: str, text: str) -> str | None:
        run_id = self.runs.get(key)
        if not run_id:
            return None
        attempts = self.ledger.attempts(key)
        path = f"attempts/{attempts[-1].number if attempts else 1}/traceback.txt"
        return self._mlflow(key, self.tracker.log_text, run_id, text, path)

    def _rows(self, key: str) -> list[dict]:
        return [self.rows.get(key, {})[s] for s in sorted(self.rows.get(key, {}))]

    def _finish(self, key: str, status: str, **outcome) -> None:
        self.curves.write(self.study.name, key, self._rows(key))
        self.ledger.finish(key, status, **outcome)
        run_id = self.runs.pop(key, None)
        if run_id:
            self._mlflow(key, self.tracker.set_outcome, run_id, status, outcome.get("failure_class"))
        self.finished.add(key)
        self._log_cell_aggregates(key)

    def _log_cell_aggregates(self, key: str) -> None:
        """The cell's parent run gets the study metric's seed aggregates (mean, sd, n, failure rate) at
        step = seeds finished, so the MLflow runs table compares cells while the study runs."""
        from ..analysis.live import rule_from, seed_aggregates

        cell_hash = self.trials[key].cell_hash
        parent = self.parent_runs.get(cell_hash)
        if parent is None or self.mlflow.down:
            return
        try:
            keys = [k for k, t in self.trials.items() if t.cell_hash == cell_hash]
            rows = [(r.status, r.metrics) for r in self.ledger.trials(self.study.name, keys)]
            aggregates = seed_aggregates(rows, self.study.metric.name, rule_from(self.study.failure))
            self.mlflow.call(self.tracker.log_metrics, parent, int(aggregates["seeds_done"]), aggregates)
            self.mlflow.call(self.tracker.end, parent, "FINISHED")  # the parent run spans its seeds
        except Exception as exc:  # noqa: BLE001 - a summary must never stop the study
            logging.getLogger(__name__).warning("could not log seed aggregates of cell %s: %s", cell_hash, exc)

    def abandon(self, cancelled: bool = False) -> list[str]:
        """After a stopped fit: runs still open say `pending` (or `cancelled`); partial curves are kept."""
        open_keys = list(self.runs)
        status = "cancelled" if cancelled else "pending"
        for key in open_keys:
            self.curves.write(self.study.name, key, self._rows(key))
            run_id = self.runs.pop(key)
            if run_id:
                self._mlflow(key, self.tracker.set_outcome, run_id, status, "cancelled" if cancelled else "interrupted")
        return open_keys
