"""Alembic environment: raw-SQL migrations, run on the connection `ferryman migrate` passes."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes.get("connection")
if connection is None:
    raise SystemExit("run migrations with `ferryman migrate`, which connects from DATABASE_URL")
context.configure(connection=connection)
with context.begin_transaction():
    context.run_migrations()
