"""Driver-side recording of every trial event: ledger rows and attempts, MLflow runs, Parquet curves.

How each way a trial attempt ends is recorded (the trainable ends every attempt it survives with one
final report saying which: attempt.py):
- `succeeded` / `diverged` (final metrics kept: a diverged seed is a data point) / code or config
  `error` (failed, not retried): from the final report, in `on_trial_complete`;
- the worker died, ran out of memory or lost its node (infrastructure): Ray Tune retries it up to the
  study's `retries:` (`on_trial_recover`: the attempt ends, the trial stays running and the retry resumes
  from the trial's last checkpoint), and once retries are spent it is failed (`on_trial_error`);
- the driver stopped (Ctrl-C, `cancel`): nothing here; the submission releases what it held.

One trial is one MLflow run however many attempts it takes: a retry, a rerun or a resume continues the
run the ledger names (or, when the ledger lost its id, the run tagged with the trial key). MLflow being
unreachable never stops a study (MlflowGuard): the ledger and the curves get everything, the trial is
flagged `mlflow_dirty`, and `studyrunner sync-mlflow` backfills.

Nothing a worker reported is lost when a driver dies: the worker's checkpoint carries every record up to
it, a resumed attempt replays them, and the driver keeps what it lacks (curve rows by step, MLflow points by
(metric, step) against the run's history), so a resumed trial's curve is an uninterrupted run's.
"""

from __future__ import annotations

import logging
import pickle
import time
import traceback
from typing import Any

from ray import cloudpickle

from ...store import CurveStore, Ledger, TrialStatus
from ...store.curves import CurveUnreadable
from ...study import CompiledStudy, Trial
from ...tracking.guard import MlflowGuard
from ...tracking.tracker import RunHistory, Tracker, final_points, record_points
from .driver_callback import DriverCallback
from .faults import kill_driver_at

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
        say=None,
        known_runs: dict[tuple[str, str], str] | None = None,
        sync_hint: str | None = None,
    ):
        self.study = compiled.study
        self.trials: dict[str, Trial] = {t.trial_key: t for t in compiled.trials}
        self.ledger, self.tracker, self.curves = ledger, tracker, curves
        self.mlflow = MlflowGuard(tracker, study=compiled.study.name, warn=warn, sync_hint=sync_hint)
        self.warn = warn or (lambda line: None)
        self.say = say or (lambda line: None)
        self.dirty: set[str] = set()  # trials MLflow lacks something of (flagged once each)
        self.inherited_dirty: set[str] = set()  # flagged before this driver ran them (e.g. by a dead one)
        self.experiment_id, self.parent_runs = experiment_id, parent_runs
        self.known_runs = known_runs or {}  # ("trial", trial_key) -> a run MLflow holds for it (by tag)
        self.submission = submission
        self.runs: dict[str, str | None] = {}  # trial_key -> its MLflow run, while an attempt is open
        self.histories: dict[str, RunHistory] = {}  # trial_key -> the points its run holds
        self.rows: dict[str, dict[int, dict]] = {}  # trial_key -> step -> record (every attempt's)
        self.beats: dict[str, float] = {}
        self.finished: set[str] = set()

    def admit(self, cell, trials: list[Trial]) -> None:
        """Trials of a cell this driver learns of mid-run (a search's new suggestion): the cell's parent run (the
        ledger's, one MLflow holds by tag, or a new one), then they are recorded as the others are."""
        known = next(
            (c.mlflow_run_id for c in self.ledger.cells(self.study.name) if c.cell_hash == cell.cell_hash), None
        )
        known = known or self.known_runs.get(("cell", cell.cell_hash))
        ok, run_id = self.mlflow.call(self.tracker.cell_run, self.experiment_id, self.study, cell, known)
        if ok and run_id != known:
            self.ledger.set_cell_run(self.study.name, cell.cell_hash, run_id)
        self.parent_runs[cell.cell_hash] = run_id if ok else known
        self.trials.update({t.trial_key: t for t in trials})

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
        """The trial's one MLflow run: the ledger's, else one MLflow holds under its trial key (continued,
        described again in case its maker died half way), else a new one."""
        known = next(iter(self.ledger.trials_by_key([key])), None)
        run_id = known.mlflow_run_id if known else None
        if known is not None and known.mlflow_dirty:  # MLflow already lacked something: the closing sync audits it
            self.inherited_dirty.add(key)
        if run_id and self._mlflow(key, self.tracker.continue_run, run_id):
            self.histories[key] = RunHistory(self.tracker.client, run_id)  # points an earlier driver logged
            return run_id
        t = self.trials[key]
        found = self.known_runs.get(("trial", key))
        if found and found != run_id and self._mlflow(key, self.tracker.continue_run, found):
            self._mlflow(key, self.tracker.describe_trial_run, found, self.study, t)
            self.histories[key] = RunHistory(self.tracker.client, found)
            return found
        run_id = self._mlflow(
            key, self.tracker.trial_run, self.experiment_id, self.parent_runs[t.cell_hash], self.study, t
        )
        if run_id:
            self.histories[key] = RunHistory(self.tracker.client, run_id, fresh=True)
        return run_id

    def _log_points(self, key: str, records: list[dict]) -> None:
        """Send MLflow the points of `records` its run lacks (each (metric, step) once, whoever sent it)."""
        history = self.histories.get(key)
        if self.runs.get(key) and history is not None:
            self._mlflow(key, history.log_missing, record_points(records))

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
        """Records of earlier attempts (a resume after a crash): the curve continues, not restarts. An
        unreadable curve is set aside (kept) and said so; the resumed attempt's replay rebuilds it."""
        try:
            frame = self.curves.read(self.study.name, key)
        except FileNotFoundError:
            return {}
        except CurveUnreadable as exc:
            aside = self.curves.set_aside(self.study.name, key)
            self.warn(f"{exc}; set aside as {aside}: it is written again from the trial's checkpoint and records")
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
        if result.get("replay") is not None:
            self._replay(key, result["replay"])
            return
        if result.get("checkpoint_step") is not None:  # the worker has a checkpoint: keep the curve to it
            self.curves.write(self.study.name, key, self._rows(key))
        elif result.get("note"):
            self._note(key, str(result["note"]))
        if result.get("final"):
            self._complete(key, result)
            return
        if result.get("heartbeat") or result.get("note") or "metrics" not in result:
            return
        step, metrics = int(result["step"]), result["metrics"]
        record = {"step": step, **metrics}
        self.rows[key][step] = record
        self._log_points(key, [record])

    def _replay(self, key: str, records: list[dict]) -> None:
        """A resumed attempt's history from its checkpoint: keep the rows this driver lacks (those of steps
        it has are the same records), and log what the run lacks."""
        rows = self.rows[key]
        for record in records:
            rows.setdefault(int(record["step"]), dict(record))
        self._log_points(key, records)
        self.curves.write(self.study.name, key, self._rows(key))

    def _note(self, key: str, message: str) -> None:
        """A line about the trial for the user (a resume, a corrupt checkpoint skipped): on the console and
        on the attempt's row, so `status`/`results` show what it started from."""
        self.say(f"{key}: {message}")
        self.ledger.add_attempt_note(key, message)

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
        # the final report's outcome (attempt.py: succeeded | diverged | error) -> the trial's status
        outcome = result.get("outcome", "succeeded")
        metrics = result.get("metrics") or {}
        if outcome == "succeeded":
            self._finish(key, TrialStatus.SUCCEEDED, metrics=metrics)
        elif outcome == "diverged":
            reason = result.get("reason")
            self._finish(key, TrialStatus.DIVERGED, metrics=metrics, error=reason, failure_class="divergence")
        else:
            error = f"{result.get('error_type', 'Error')}: {result.get('message', '')}"
            artifact = self._save_traceback(key, result.get("traceback") or error)
            full = f"{error}\n{result.get('traceback', '')}".strip()
            self._finish(
                key, TrialStatus.FAILED, metrics=metrics, error=full, failure_class="error", traceback_artifact=artifact
            )

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
            self.histories.pop(key, None)

    def on_trial_error(self, iteration, trials, trial, **info):
        """Retries spent (or none allowed) after infrastructure failures: the trial failed."""
        text = _error_text(trial)
        for key in self._keys(trial):
            if key in self.finished:
                continue
            if key not in self.runs:
                self.on_trial_start(iteration, trials, trial)
            artifact = self._save_traceback(key, text)
            self._finish(
                key, TrialStatus.FAILED, error=text, failure_class="infrastructure", traceback_artifact=artifact
            )

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

    def _finish(self, key: str, status: TrialStatus, **outcome) -> None:
        """The curve first, then the ledger's outcome, flagged `mlflow_dirty` until MLflow shows it as well
        (a driver killed in between leaves a trial `sync-mlflow` and `resume` mend), then MLflow: the final
        metrics the curve lacks, and the run's status."""
        rows = self._rows(key)
        self.curves.write(self.study.name, key, rows)
        run_id = self.runs.pop(key, None)
        self.ledger.finish(key, status, mlflow_dirty=True, **outcome)
        kill_driver_at("finish", key)  # fault injection (faults.py): a driver killed between the two
        if run_id:
            history = self.histories.get(key)
            if history is not None:
                self._mlflow(key, history.log_missing, final_points(outcome.get("metrics"), record_points(rows)))
            self._mlflow(key, self.tracker.set_outcome, run_id, status, outcome.get("failure_class"))
            if key not in self.dirty and key not in self.inherited_dirty:
                self.ledger.set_mlflow_dirty(key, False)
        self.histories.pop(key, None)
        self.finished.add(key)
        self._log_cell_aggregates(key)

    def _log_cell_aggregates(self, key: str) -> None:
        """The cell's parent run gets the study metric's seed aggregates (mean, sd, n, failure rate) at
        step = seeds finished, so the MLflow runs table compares cells while the study runs."""
        from ...tracking.aggregates import rule_from, seed_aggregates

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
        status = TrialStatus.CANCELLED if cancelled else TrialStatus.PENDING
        for key in open_keys:
            self.curves.write(self.study.name, key, self._rows(key))
            run_id = self.runs.pop(key)
            self.histories.pop(key, None)
            if run_id:
                self._mlflow(key, self.tracker.set_outcome, run_id, status, "cancelled" if cancelled else "interrupted")
        return open_keys
