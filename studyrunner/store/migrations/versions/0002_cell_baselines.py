"""cells.baseline_of: which looped cells a matched baseline cell matches (`baselines:`).

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    with op.batch_alter_table("cells") as batch:
        batch.add_column(sa.Column("baseline_of", sa.JSON(), nullable=True))
