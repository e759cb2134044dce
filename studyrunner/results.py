"""Read a study's outcomes as pandas frames: one row per trial, and per-step curves.

>>> from studyrunner import results
>>> df = results.load("quickstart")
>>> df.groupby("cell")["eval_accuracy"].agg(["mean", "std", "count"])
"""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd

from .spec import flatten_config
from .store import CurveStore, Ledger
from .workspace import Workspace

ID_COLUMNS = [
    "study",
    "trial_key",
    "cell_hash",
    "cell",
    "baseline_of",
    "seed",
    "status",
    "attempts",
    "started_at",
    "finished_at",
    "duration_s",
    "mlflow_run_id",
    "error",
]


def _utc(moment: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; the ledger writes UTC, so say so."""
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment


def trials_frame(ledger: Ledger, study: str) -> pd.DataFrame:
    """Identity and status columns, then the flattened resolved config, then final metrics."""
    ledger.get_study(study)
    cells = {c.cell_hash: c for c in ledger.cells(study)}
    rows, config_cols, metric_cols = [], {}, {}
    for t in ledger.trials(study):
        cell = cells[t.cell_hash]
        started, finished = _utc(t.started_at), _utc(t.finished_at)
        duration = (finished - started).total_seconds() if finished and started else None
        config = flatten_config(cell.config)
        metrics = t.metrics or {}
        config_cols.update(dict.fromkeys(config))
        metric_cols.update(dict.fromkeys(metrics))
        rows.append(
            {
                "study": study,
                "trial_key": t.trial_key,
                "cell_hash": t.cell_hash,
                "cell": cell.label,
                "baseline_of": ",".join(f"{kind}:{h}" for kind, h in (cell.baseline_of or [])),
                "seed": t.seed,
                "status": t.status,
                "attempts": t.attempts,
                "started_at": started,
                "finished_at": finished,
                "duration_s": duration,
                "mlflow_run_id": t.mlflow_run_id,
                "error": t.error,
                **config,
                **metrics,
            }
        )
    return pd.DataFrame(rows, columns=ID_COLUMNS + list(config_cols) + sorted(metric_cols))


def load(study: str, db: str | None = None, workspace: str | None = None) -> pd.DataFrame:
    """One row per trial of `study` from the ledger (default: the workspace's SQLite)."""
    return trials_frame(Ledger(Workspace.resolve(workspace, db=db).db_url), study)


def curves(study: str, storage: str | None = None, workspace: str | None = None) -> pd.DataFrame:
    """Every per-step record of `study` (columns: trial_key, step, metrics; NaN where not logged)."""
    return CurveStore(Workspace.resolve(workspace, storage=storage).storage).read_study(study)


def cell_summary(df: pd.DataFrame, metric: str, mode: str = "max") -> pd.DataFrame:
    """Per cell: mean, std and count of `metric` over succeeded seeds, and how many seeds failed;
    best cell first by `mode`."""
    columns = ["cell", "mean", "std", "seeds", "failed"]
    if df.empty:
        return pd.DataFrame(columns=columns)
    values = df[metric].where(df.status == "succeeded") if metric in df.columns else pd.Series(float("nan"), df.index)
    if values.isna().all() and not (df.status == "failed").any():
        return pd.DataFrame(columns=columns)  # nothing reported yet, and nothing failed
    grouped = values.groupby(df["cell"], sort=False)
    stats = grouped.agg(["mean", "std", "count"]).rename(columns={"count": "seeds"})
    # Cells whose seeds all failed stay in the table (mean NaN), with their failure count.
    stats["failed"] = (df.status == "failed").groupby(df["cell"], sort=False).sum().astype(int)
    stats = stats.sort_values("mean", ascending=(mode == "min"), na_position="last")
    return stats.reset_index()[columns]
