"""search_points: the configurations Optuna searches suggested, and the cell each made (`search:`).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"

WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "search_points",
        sa.Column("study", sa.String(64), sa.ForeignKey("studies.name"), primary_key=True),
        sa.Column("search", sa.String(200), primary_key=True),
        sa.Column("number", sa.Integer(), primary_key=True),
        sa.Column("base_hash", sa.String(32), nullable=False),
        sa.Column("cell_hash", sa.String(32), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("seeds", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", WHEN, nullable=False),
        sa.Column("told_at", WHEN, nullable=True),
        sa.ForeignKeyConstraint(["study", "cell_hash"], ["cells.study", "cells.cell_hash"]),
    )
