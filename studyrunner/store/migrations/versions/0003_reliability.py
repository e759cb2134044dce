"""Reliability and queryable results: trial leases and failure classes, submissions, attempts, and the
long-format tables trial_metrics and cell_params (filled from the JSON columns of existing rows).

Revision ID: 0003
Revises: 0002
"""

import json
import math

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"

WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("failure_class", sa.String(32), nullable=True))
        batch.add_column(sa.Column("owner", sa.String(36), nullable=True))
        batch.add_column(sa.Column("heartbeat_at", WHEN, nullable=True))
        batch.add_column(sa.Column("mlflow_dirty", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.create_index("ix_trials_owner", ["owner"])
    op.create_table(
        "submissions",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("study", sa.String(64), sa.ForeignKey("studies.name"), nullable=False),
        sa.Column("command", sa.String(16), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", WHEN, nullable=False),
        sa.Column("heartbeat_at", WHEN, nullable=False),
        sa.Column("ended_at", WHEN, nullable=True),
        sa.Column("cancel_requested_at", WHEN, nullable=True),
        sa.Column("ray_session_dir", sa.Text(), nullable=True),
    )
    op.create_index("ix_submissions_study", "submissions", ["study"])
    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("trial_key", sa.String(160), sa.ForeignKey("trials.trial_key"), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("submission", sa.String(36), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("started_at", WHEN, nullable=False),
        sa.Column("ended_at", WHEN, nullable=True),
        sa.Column("host", sa.String(255), nullable=True),
        sa.Column("ray_trial_id", sa.String(64), nullable=True),
        sa.Column("resumed_from_step", sa.Integer(), nullable=True),
        sa.Column("error_class", sa.String(32), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("traceback_artifact", sa.Text(), nullable=True),
        sa.Column("provenance", sa.JSON(), nullable=True),
    )
    op.create_index("ix_attempts_trial_key", "attempts", ["trial_key"])
    op.create_table(
        "trial_metrics",
        sa.Column("trial_key", sa.String(160), sa.ForeignKey("trials.trial_key"), primary_key=True),
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("study", sa.String(64), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
    )
    op.create_index("ix_trial_metrics_study", "trial_metrics", ["study"])
    op.create_table(
        "cell_params",
        sa.Column("study", sa.String(64), primary_key=True),
        sa.Column("cell_hash", sa.String(32), primary_key=True),
        sa.Column("path", sa.String(300), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("value_num", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["study", "cell_hash"], ["cells.study", "cells.cell_hash"]),
    )
    _backfill()


def _backfill() -> None:
    """Long-format rows for the trials and cells already in the ledger. The rules (which values become
    rows, JSON text, bools as 0/1, non-finite numbers as NULL) are those of studyrunner.store.longform,
    copied here on purpose: this revision must fill the tables the same way whatever that module becomes."""
    conn = op.get_bind()
    trials = sa.table("trials", sa.column("trial_key"), sa.column("study"), sa.column("metrics", sa.JSON()))
    cells = sa.table("cells", sa.column("study"), sa.column("cell_hash"), sa.column("config", sa.JSON()))
    metric_rows = sa.table(
        "trial_metrics", sa.column("trial_key"), sa.column("name"), sa.column("study"), sa.column("value")
    )
    param_rows = sa.table(
        "cell_params",
        sa.column("study"),
        sa.column("cell_hash"),
        sa.column("path"),
        sa.column("value"),
        sa.column("value_num"),
    )
    rows = []
    for key, study, metrics in conn.execute(sa.select(trials.c.trial_key, trials.c.study, trials.c.metrics)):
        for name, value in (metrics if isinstance(metrics, dict) else {}).items():
            if isinstance(value, bool | int | float):
                rows.append({"trial_key": key, "name": name, "study": study, "value": _backfill_number(value)})
    _backfill_insert(conn, metric_rows, rows)
    rows = []
    for study, cell_hash, config in conn.execute(sa.select(cells.c.study, cells.c.cell_hash, cells.c.config)):
        for path, value in _backfill_flatten(config if isinstance(config, dict) else {}).items():
            text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
            rows.append(
                {
                    "study": study,
                    "cell_hash": cell_hash,
                    "path": path,
                    "value": text,
                    "value_num": _backfill_number(value),
                }
            )
    _backfill_insert(conn, param_rows, rows)


def _backfill_number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def _backfill_flatten(config: dict, prefix: str = "") -> dict:
    """{'model': {'params': {'loops': 4}}} -> {'model.params.loops': 4}; lists and empty dicts are leaves."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(_backfill_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _backfill_insert(conn, table, rows: list[dict], chunk: int = 1000) -> None:
    for start in range(0, len(rows), chunk):  # bounded statements for ledgers with many trials
        conn.execute(table.insert(), rows[start : start + chunk])
