"""looks and look_claims: the looks of a sequential study (`seeds: {start, max}`), one row per look and one per
claim at each look, written with the registration of the next wave's trials (orchestrate/feeds/waves.py).

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"

WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "looks",
        sa.Column("study", sa.String(64), sa.ForeignKey("studies.name"), primary_key=True),
        sa.Column("number", sa.Integer(), primary_key=True),
        sa.Column("seeds", sa.JSON(), nullable=False),
        sa.Column("next_seeds", sa.JSON(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("design", sa.JSON(), nullable=False),
        sa.Column("claims", sa.JSON(), nullable=False),
        sa.Column("created_at", WHEN, nullable=False),
    )
    op.create_table(
        "look_claims",
        sa.Column("study", sa.String(64), primary_key=True),
        sa.Column("look", sa.Integer(), primary_key=True),
        sa.Column("claim", sa.Integer(), primary_key=True),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("analysed", sa.Boolean(), nullable=False),
        sa.Column("decided_at", sa.Integer(), nullable=True),
        sa.Column("seeds", sa.Integer(), nullable=False),
        sa.Column("fraction", sa.Float(), nullable=True),
        sa.Column("nominal", sa.Float(), nullable=True),
        sa.Column("boundary", sa.Float(), nullable=True),
        sa.Column("z", sa.Float(), nullable=True),
        sa.Column("p_claimed", sa.Float(), nullable=True),
        sa.Column("p_opposite", sa.Float(), nullable=True),
        sa.Column("p_sequential", sa.Float(), nullable=True),
        sa.Column("estimate", sa.Float(), nullable=True),
        sa.Column("lo", sa.Float(), nullable=True),
        sa.Column("hi", sa.Float(), nullable=True),
        sa.Column("needed", sa.Integer(), nullable=True),
        sa.Column("test", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("cells", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["study", "look"], ["looks.study", "looks.number"]),
    )
