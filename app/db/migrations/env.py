"""Alembic environment: raw-SQL migrations, no ORM metadata."""

from __future__ import annotations

from sqlalchemy import create_engine, pool

from alembic import context

url = context.config.get_main_option("sqlalchemy.url")
assert url, "sqlalchemy.url must be set (ferryman migrate sets it from DATABASE_URL)"

if context.is_offline_mode():
    context.configure(url=url, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
