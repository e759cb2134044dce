"""MLflow tracking from the driver: one experiment per study, a parent run per cell, a child per trial.

All writes happen in the submitting process (one writer), so the embedded SQLite store never sees
concurrent writers and workers need no access to the tracking server.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import subprocess
import time
import warnings
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from .. import __version__
from ..errors import StudyrunnerError
from ..store.lock import sqlite_file, stores_lock
from ..store.status import TrialStatus
from ..study import Cell, Trial, flatten_config
from ..urls import mask_text, mask_url
from ..workspace import unwritable_parent
from .http import bound_http_retries

MAX_PARAM_LEN = 6000  # MLflow's limit for a param value
# The ledger's trial status as an MLflow run status (the `status` tag says which of them it was).
RUN_STATUS = {
    TrialStatus.SUCCEEDED: "FINISHED",
    TrialStatus.DIVERGED: "FINISHED",  # a data point, not a crash
    TrialStatus.FAILED: "FAILED",
    TrialStatus.CANCELLED: "KILLED",
    TrialStatus.PENDING: "SCHEDULED",  # interrupted: it runs again on resume
    TrialStatus.RUNNING: "RUNNING",
}


def gone(exc: Exception) -> bool:
    """The store answered that it has no such run (or that the id is not one of its ids). Anything else
    (down, a timeout, a 5xx) says nothing about the run: replacing the run then would make a second one."""
    from mlflow.exceptions import MlflowException

    if not isinstance(exc, MlflowException):
        return False
    code = exc.get_http_status_code()
    return 400 <= code < 500 and code != 429


@cache
def git_sha(where: str = ".") -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


Points = dict[str, dict[int, float]]  # metric -> step -> value
BATCH = 1000  # MLflow's per-request metric limit


def loggable(value: Any) -> float | None:
    """A value MLflow can take as a metric point; None for text, None and NaN (a metric a record lacks)."""
    if isinstance(value, str | bytes) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def record_points(records: list[dict[str, Any]]) -> Points:
    """The metric points of records (`{"step": s, **metrics}`), as metric -> step -> value."""
    points: Points = {}
    for record in records:
        step = int(record["step"])
        for name, raw in record.items():
            value = loggable(raw) if name != "step" else None
            if value is not None:
                points.setdefault(name, {})[step] = value
    return points


def final_points(metrics: dict[str, Any] | None, curve: Points) -> Points:
    """The final metrics a curve lacks (`train_time_s`, ...), at the curve's last step. A metric the curve
    has is its curve in MLflow, not a second point at the last step (`params` and `effective_depth` are
    recorded once, at step 0)."""
    last = max((step for by_step in curve.values() for step in by_step), default=0)
    values = {key: loggable(value) for key, value in (metrics or {}).items() if key not in curve}
    return {key: {last: value} for key, value in values.items() if value is not None}


class RunHistory:
    """The (metric, step) points a run holds, so each point is logged once whoever logged it before (an
    earlier driver, a crashed one, a sync). Fetched from MLflow once per metric on first use; a run created
    just now is known to be empty (`fresh=True`) and costs no fetch."""

    def __init__(self, client, run_id: str, *, fresh: bool = False):
        self.client, self.run_id, self.fresh = client, run_id, fresh
        self._steps: dict[str, set[int]] = {}

    def steps(self, key: str) -> set[int]:
        if key not in self._steps:
            history = [] if self.fresh else self.client.get_metric_history(self.run_id, key)
            self._steps[key] = {m.step for m in history}
        return self._steps[key]

    def missing(self, points: Points) -> list[tuple[str, int, float]]:
        return [
            (key, step, value)
            for key, by_step in points.items()
            for step, value in sorted(by_step.items())
            if step not in self.steps(key)
        ]

    def log_missing(self, points: Points) -> int:
        """Log the points the run lacks; returns how many were logged."""
        from mlflow.entities import Metric

        items = self.missing(points)
        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, step, value in items]
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + BATCH])
        for key, step, _ in items:
            self.steps(key).add(step)
        return len(items)


def _params(config: dict[str, Any], seed: int | None = None) -> dict[str, str]:
    flat = flatten_config(config)
    if seed is not None:
        flat["seed"] = seed
    return {k: (json.dumps(v) if isinstance(v, list | tuple) else str(v))[:MAX_PARAM_LEN] for k, v in flat.items()}


def check_half_made(tracking_uri: str, error: str = "") -> None:
    """After MLflow failed (with `error`) to open an SQLite store: if a command that stopped (or, before
    stores_lock, raced another) while creating or migrating it left it half-made, say so in one line with how to
    mend it, instead of MLflow's `table ... already exists` at every command. Half-made: a leftover
    `_alembic_tmp_*` table, tables without a recorded schema revision, or a migration that made a table (or
    index) and did not record it (MLflow's `already exists`), or a store holding no runs whose schema stops
    between two revisions. Reads the file only; says nothing of a missing, empty or sound store, nor of an older
    store holding runs (MLflow's own message says to run `mlflow db upgrade`)."""
    path = sqlite_file(tracking_uri)
    if path is None or not path.is_file() or path.stat().st_size == 0:
        return
    try:
        con = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=30)
        try:
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            versioned = (
                "alembic_version" in tables and con.execute("SELECT count(*) FROM alembic_version").fetchone()[0]
            )
            runs = con.execute("SELECT count(*) FROM runs").fetchone()[0] if "runs" in tables else 0
        finally:
            con.close()
    except sqlite3.Error:
        return  # unreadable here: MLflow's own open says why
    leftovers = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    if leftovers:
        why = f"leftover table{'s' if len(leftovers) > 1 else ''} {', '.join(leftovers)}"
    elif tables and not versioned:
        why = "no schema revision recorded"
    elif "already exists" in error:
        why = f"a migration made a table or index it did not record: {error}"
    elif "out-of-date database schema" in error and runs == 0:  # stopped between two migrations
        why = "its schema stops between two revisions: " + error.split(". ")[0].removeprefix("Detected ")
    else:
        return  # a sound store, or an older one holding runs (MLflow's own message says `mlflow db upgrade`)
    beside = [p.name for p in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")) if p.exists()]
    if runs == 0:
        files = " and ".join([path.name, *beside])
        mend = f"it holds no runs: delete {files} (in {path.parent}) and run the command again"
        if "out-of-date" in why:
            mend += f" (or finish the migration: mlflow db upgrade sqlite:///{path})"
    else:  # made by an older MLflow and stopped in `mlflow db upgrade`: MLflow's to finish
        drops = "; ".join(f"DROP TABLE {t}" for t in leftovers)
        mend = f"it holds {runs} run{'s' if runs > 1 else ''}: back it up, " + (
            f"run sqlite3 {path} '{drops}', then " if drops else "then "
        )
        mend += f"finish MLflow's migration (mlflow db upgrade sqlite:///{path})"
    raise StudyrunnerError(
        f"the MLflow store {str(path)!r} is half-made ({why}; a command stopped while creating or migrating it); {mend}"
    )


class Tracker:
    def __init__(self, tracking_uri: str):
        # First use of a store runs migrations, which MLflow and alembic announce at INFO.
        for name in ("alembic", "mlflow.store.db.utils"):
            logging.getLogger(name).setLevel(logging.WARNING)
        warnings.filterwarnings("ignore", message="Unnamed CHECK constraint", category=UserWarning)
        self.uri = tracking_uri
        if tracking_uri.startswith("sqlite:///"):
            Path(tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        scheme = tracking_uri.split(":", 1)[0].split("+")[0]
        if scheme in ("sqlite", "postgresql", "mysql", "mssql"):
            self._check_reachable(tracking_uri)
        elif scheme in ("http", "https"):
            self._check_server(tracking_uri)
        # An SQLite store is made by one command at a time: two submits into a new workspace would race through
        # MLflow's migrations and leave `_alembic_tmp_*` tables behind.
        with stores_lock(tracking_uri):
            self._open(tracking_uri, scheme)

    @classmethod
    def probe(cls, tracking_uri: str) -> None:
        """Check that the tracking store can be used, writing nothing: a database or server answers; a local
        SQLite store that exists is not half-made, and one that does not can be made where it would be."""
        scheme = tracking_uri.split(":", 1)[0].split("+")[0]
        path = sqlite_file(tracking_uri)
        if path is not None:
            if path.is_file():
                check_half_made(tracking_uri)
            elif (above := unwritable_parent(path)) is not None:
                raise StudyrunnerError(
                    f"cannot make MLflow tracking store {str(path)!r}: {str(above)!r} is not a folder this user "
                    "can write to (check --tracking-uri / MLFLOW_TRACKING_URI)"
                )
        elif scheme in ("postgresql", "mysql", "mssql"):
            cls._check_reachable(tracking_uri)
        elif scheme in ("http", "https"):
            cls._check_server(tracking_uri)

    def _open(self, tracking_uri: str, scheme: str) -> None:
        from mlflow import MlflowClient

        for attempt in range(6):
            try:
                self.client = MlflowClient(tracking_uri)
                if scheme in ("sqlite", "postgresql", "mysql", "mssql"):
                    self.client.search_experiments(max_results=1)  # creates or migrates the store now
                break
            except Exception as exc:  # noqa: BLE001 - MLflow raises many types for a bad URI
                first = mask_text((str(exc).strip().splitlines() or [type(exc).__name__])[0], tracking_uri)
                check_half_made(tracking_uri, first)  # no use retrying: say how to mend it
                # Two submits racing through MLflow's table creation on a database server: the loser finds
                # the store ready a moment later (an SQLite store is made under stores_lock).
                if attempt == 5 or scheme not in ("sqlite", "postgresql", "mysql", "mssql"):
                    raise StudyrunnerError(
                        f"cannot open MLflow tracking store {mask_url(tracking_uri)!r}: {first}"
                    ) from None
                time.sleep(0.5 * (attempt + 1))

    @staticmethod
    def _check_reachable(uri: str) -> None:
        """Fail in one line, now: MLflow itself retries an unreachable database for ~100 s."""
        from sqlalchemy import create_engine

        try:
            with create_engine(uri).connect():
                pass
        except Exception as exc:  # noqa: BLE001 - drivers raise their own types
            first = mask_text(str(exc).strip().splitlines()[0], uri)
            raise StudyrunnerError(f"cannot open MLflow tracking store {mask_url(uri)!r}: {first}") from None

    @staticmethod
    def _check_server(uri: str) -> None:
        """MLflow's HTTP client retries a dead server with backoff for minutes; ask once, briefly."""
        import urllib.error
        import urllib.request

        bound_http_retries(uri)  # for the rest of the run too
        parts = urlsplit(uri)
        # urllib would read `user:password@host` as the host name; /health answers without them (or a 401)
        health = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])).rstrip("/") + "/health"
        try:
            urllib.request.urlopen(health, timeout=5).close()
        except urllib.error.HTTPError:
            pass  # something answers; MLflow itself will say if it is not a tracking server
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise StudyrunnerError(
                f"cannot reach MLflow tracking server {mask_url(uri)!r}: {mask_text(str(reason), uri)} "
                "(start it, or check --tracking-uri / MLFLOW_TRACKING_URI)"
            ) from None

    def experiment(self, study: str, artifact_location: str, description: str = "") -> str:
        from .ui_links import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG

        exp = self.client.get_experiment_by_name(study)
        if exp is None:  # tagged as model training, so MLflow's UI opens on the runs, not the GenAI pages
            return self.client.create_experiment(
                study,
                artifact_location=artifact_location,
                tags={"study": study, "mlflow.note.content": description, EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
            )
        if exp.lifecycle_stage == "deleted":
            self.client.restore_experiment(exp.experiment_id)
        if exp.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:  # an experiment from before the tag
            self.client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id

    def _tags(self, study: str, source: str) -> dict[str, str]:
        return {
            "study": study,
            "git_sha": git_sha(str(Path(source).parent) if Path(source).exists() else "."),
            "studyrunner_version": __version__,
        }

    def cell_run(self, experiment_id: str, study, cell: Cell, known_run_id: str | None) -> str:
        """The cell's parent run: the one the ledger knows, else a new one."""
        baseline_tags = {}
        if cell.baseline_of:  # a matched baseline: which looped cells, and as what
            baseline_tags = {
                "baseline": ",".join(sorted({kind for kind, _ in cell.baseline_of})),
                "baseline_of": ",".join(h for _, h in cell.baseline_of),
            }
        if known_run_id:
            try:
                run = self.client.get_run(known_run_id)
                if run.info.lifecycle_stage == "active":
                    for key, value in baseline_tags.items():
                        self.client.set_tag(known_run_id, key, value)
                    return known_run_id
            except Exception as exc:  # noqa: BLE001 - the run was deleted from the store by hand
                if not gone(exc):
                    raise
        run = self.client.create_run(
            experiment_id,
            run_name=cell.label,
            tags={**self._tags(study.name, study.source), "cell_hash": cell.cell_hash, "kind": "cell", **baseline_tags},
        )
        self._log_params(run.info.run_id, _params(cell.config))
        self.client.set_terminated(run.info.run_id, "FINISHED")
        return run.info.run_id

    def active_runs(self, experiment_id: str) -> list:
        """Every active run of the experiment, in a few paged queries instead of one get_run per trial."""
        runs, token = [], None
        while True:
            page = self.client.search_runs([experiment_id], max_results=BATCH, page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def runs_by_tag(self, experiment_id: str, runs: list | None = None) -> dict[tuple[str, str], str]:
        """The experiment's active runs by identity: ("trial", trial_key) and ("cell", cell_hash) -> run id
        (the oldest, should two claim one identity). How a ledger that lost a run's id (a new ledger beside
        an old tracking store, a driver killed between making a run and naming it) finds the run again
        instead of making a second one. `runs`: the experiment's active runs, when already fetched."""
        found: dict[tuple[str, str], tuple[int, str]] = {}
        for run in self.active_runs(experiment_id) if runs is None else runs:
            tags = run.data.tags
            kind = tags.get("kind")
            ident = tags.get("trial_key") if kind == "trial" else tags.get("cell_hash") if kind == "cell" else None
            older = found.get((kind, ident)) if ident else None
            if ident and (older is None or run.info.start_time < older[0]):
                found[(kind, ident)] = (run.info.start_time, run.info.run_id)
        return {key: run_id for key, (_, run_id) in found.items()}

    def trial_run(self, experiment_id: str, parent_run_id: str, study, trial: Trial) -> str:
        tags = {
            **self._tags(study.name, study.source),
            "cell_hash": trial.cell_hash,
            "trial_key": trial.trial_key,
            "seed": str(trial.seed),
            "kind": "trial",
            "mlflow.parentRunId": parent_run_id,
        }
        run = self.client.create_run(experiment_id, run_name=f"{trial.label} seed={trial.seed}", tags=tags)
        self.describe_trial_run(run.info.run_id, study, trial)
        return run.info.run_id

    def describe_trial_run(self, run_id: str, study, trial: Trial) -> None:
        """A trial run's params and files (idempotent: a run found again by its tags gets what a driver
        killed right after creating it did not write)."""
        self._log_params(run_id, _params(trial.config, trial.seed))
        self.client.log_text(run_id, study.text, "study.yaml")
        self.client.log_dict(
            run_id, {"trial_key": trial.trial_key, "seed": trial.seed, **trial.config}, "resolved_config.json"
        )

    def log_params(self, run_id: str, params: dict[str, str]) -> None:
        """Extra params of a run (a trial's `runtime.*` facts), cut to MLflow's length limit."""
        self._log_params(run_id, {k: v[:MAX_PARAM_LEN] for k, v in params.items()})

    def _log_params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's per-batch param limit
            self.client.log_batch(run_id, params=items[i : i + 100])

    def log_metrics(self, run_id: str, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items() if isinstance(v, int | float)]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[i : i + 1000])

    def end(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status)

    def continue_run(self, run_id: str) -> bool:
        """Reopen a trial's run for its next attempt (one run per trial); False if it is gone."""
        try:
            run = self.client.get_run(run_id)
        except Exception as exc:  # noqa: BLE001 - deleted from the store by hand
            if not gone(exc):
                raise  # MLflow is down: the run is not gone (MlflowGuard notes the outage)
            return False
        if run.info.lifecycle_stage != "active":
            return False
        self.client.update_run(run_id, status="RUNNING")
        return True

    def set_outcome(self, run_id: str, ledger_status: str, failure_class: str | None = None) -> None:
        """Mirror the ledger's status on the run: its MLflow status, and tags `status`/`failure_class`."""
        self.client.set_tag(run_id, "status", ledger_status)
        if failure_class:
            self.client.set_tag(run_id, "failure_class", failure_class)
        mlflow_status = RUN_STATUS[ledger_status]
        if mlflow_status == "SCHEDULED":
            self.client.update_run(run_id, status=mlflow_status)
        elif mlflow_status != "RUNNING":  # a running trial's run status is its driver's to set
            self.client.set_terminated(run_id, mlflow_status)

    def last_step(self, run_id: str, metric: str) -> int:
        """The highest step logged for `metric` on the run (-1 if none)."""
        return max((m.step for m in self.client.get_metric_history(run_id, metric)), default=-1)

    def log_text(self, run_id: str, text: str, path: str) -> str:
        self.client.log_text(run_id, text, path)
        return path
