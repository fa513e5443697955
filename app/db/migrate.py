"""Apply Alembic migrations, serialized across processes by an advisory lock."""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path

import psycopg
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from alembic import command
from app.db.urls import sqlalchemy_url

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Arbitrary constant shared by every Ferryman process: replicas starting together take turns.
MIGRATION_LOCK_KEY = 0x46455252594D414E  # "FERRYMAN"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return cfg


@lru_cache(maxsize=1)
def head_revision() -> str | None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return ScriptDirectory.from_config(cfg).get_current_head()


def upgrade(url: str) -> str | None:
    """Upgrade to head under a session advisory lock; return the revision now applied."""
    with psycopg.connect(url, autocommit=True) as lock_conn:
        lock_conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            command.upgrade(alembic_config(url), "head")
        finally:
            lock_conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return current_revision(url)


def current_revision(url: str) -> str | None:
    engine = create_engine(sqlalchemy_url(url))
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
