"""Alembic environment for the ledger. Run through `studyrunner db upgrade` (studyrunner.store.schema_versions),
which passes the open connection in `config.attributes["connection"]`; there is no alembic.ini."""

from alembic import context

from studyrunner.store.db import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
