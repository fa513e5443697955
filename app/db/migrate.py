"""Apply Alembic migrations, serialized across processes by an advisory lock."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import psycopg
import sqlalchemy
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from psycopg.conninfo import conninfo_to_dict, make_conninfo

log = logging.getLogger(__name__)

# Arbitrary constant shared by every Ferryman process: replicas starting together take turns.
MIGRATION_LOCK_KEY = 0x46455252594D414E  # "FERRYMAN"
# Seconds to wait for the server's answer when the URL does not say: a host that never answers
# would otherwise hold start-up for the system's TCP timeout (minutes).
CONNECT_TIMEOUT = 5


@lru_cache(maxsize=1)
def migrations_dir() -> Path:
    """The Alembic scripts: app/migrations in an installed wheel (pyproject.toml maps the
    top-level alembic/ there), else the checkout's alembic/ beside app/ (a source tree or an
    editable install)."""
    app_dir = Path(__file__).resolve().parent.parent
    for candidate in (app_dir / "migrations", app_dir.parent / "alembic"):
        # env.py and no __init__.py: migration scripts, never the Alembic library's package.
        if (candidate / "env.py").is_file() and not (candidate / "__init__.py").exists():
            return candidate
    raise RuntimeError(f"no Alembic migrations in {app_dir / 'migrations'} or beside {app_dir}")


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    return cfg


@contextmanager
def _connection(url: str) -> Iterator[sqlalchemy.Connection]:
    # A creator accepts any libpq connection string (URL or key=value), as psycopg does.
    engine = sqlalchemy.create_engine(
        "postgresql+psycopg://",
        creator=lambda: psycopg.connect(_with_connect_timeout(url)),
        poolclass=sqlalchemy.pool.NullPool,
    )
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def _with_connect_timeout(url: str) -> str:
    if "connect_timeout" in conninfo_to_dict(url):
        return url
    return make_conninfo(url, connect_timeout=CONNECT_TIMEOUT)


@lru_cache(maxsize=1)
def head_revision() -> str | None:
    return ScriptDirectory.from_config(_config()).get_current_head()


def upgrade(url: str) -> str | None:
    """Upgrade to head under an advisory lock; return the revision now applied.

    `url` must reach the server directly, not through a transaction-mode pooler: the lock is a
    session's. The wait for another replica's migration, and the migration itself, are not cut
    short by a statement or lock timeout the role may set by default (docs/deploy.md)."""
    with _connection(url) as conn:
        conn.execute(
            sqlalchemy.text(
                "SELECT set_config('statement_timeout', '0', false),"
                " set_config('lock_timeout', '0', false)"
            )
        )
        conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        try:
            cfg = _config()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
            return MigrationContext.configure(conn).get_current_revision()
        finally:
            conn.execute(
                sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY}
            )
            conn.commit()
