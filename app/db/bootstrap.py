"""Find the database (DATABASE_URL, or the embedded server) and bring its schema to head."""

from __future__ import annotations

import logging

from app.config import Settings
from app.db import migrate
from app.db.embedded import start_embedded
from app.db.urls import redact

log = logging.getLogger(__name__)


def database_url(settings: Settings) -> str:
    if settings.database_url:
        log.info("using database %s", redact(settings.database_url))
        return settings.database_url
    url = start_embedded(settings.data_dir)
    log.info(
        "embedded PostgreSQL running; data in %s, url %s",
        settings.data_dir / "pg",
        redact(url),
    )
    return url


def direct_url(settings: Settings, url: str) -> str:
    """Where session state lives for a pool on `url`: FERRYMAN_DIRECT_DATABASE_URL, else `url`
    itself (app/db/pool.py)."""
    return settings.direct_database_url or url


def prepare(settings: Settings) -> str:
    """The database URL (the pooled one), with migrations applied (serialized across replicas,
    on the direct connection: their lock is a session's)."""
    url = database_url(settings)
    if settings.direct_database_url:
        log.info(
            "direct connections (LISTEN, liveness locks, migrations) to %s; "
            "pooled connections through %s",
            redact(settings.direct_database_url),
            redact(url),
        )
    revision = migrate.upgrade(direct_url(settings, url))
    log.info("database schema at revision %s", revision)
    return url
