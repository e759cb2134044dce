"""studies.owner: the submission that runs a study that runs from one submit at a time (a search study's
search, a sequential study's waves), taken by one conditional UPDATE so that of two submits started at once
exactly one runs it (store/leases.py, `claim_owner`).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    with op.batch_alter_table("studies") as batch:
        batch.add_column(sa.Column("owner", sa.String(36), nullable=True))
