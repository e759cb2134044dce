"""The ledger as first released: studies, cells, trials.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None

WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "studies",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("spec_text", sa.Text(), nullable=False),
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("mlflow_experiment_id", sa.String(64), nullable=True),
        sa.Column("created_at", WHEN, nullable=False),
        sa.Column("updated_at", WHEN, nullable=False),
    )
    op.create_table(
        "cells",
        sa.Column("study", sa.String(64), sa.ForeignKey("studies.name"), primary_key=True),
        sa.Column("cell_hash", sa.String(32), primary_key=True),
        sa.Column("label", sa.Text(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("overrides", sa.JSON(), nullable=False),
        sa.Column("mlflow_run_id", sa.String(64), nullable=True),
    )
    op.create_table(
        "trials",
        sa.Column("trial_key", sa.String(160), primary_key=True),
        sa.Column("study", sa.String(64), nullable=False),
        sa.Column("cell_hash", sa.String(32), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", WHEN, nullable=False),
        sa.Column("started_at", WHEN, nullable=True),
        sa.Column("finished_at", WHEN, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("mlflow_run_id", sa.String(64), nullable=True),
        sa.ForeignKeyConstraint(["study", "cell_hash"], ["cells.study", "cells.cell_hash"]),
    )
    op.create_index("ix_trials_study", "trials", ["study"])
    op.create_index("ix_trials_status", "trials", ["status"])
