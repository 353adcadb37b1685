"""Alembic environment: runs jobman's migrations on the connection jobman hands it."""

from alembic import context

from jobman.jobdb.schema import VERSION_TABLE, metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - jobman always passes its connection
    raise RuntimeError("run migrations through `jobman db upgrade`")

context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
