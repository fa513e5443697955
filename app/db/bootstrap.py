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


def prepare(settings: Settings) -> str:
    """The database URL, with migrations applied (serialized across replicas)."""
    url = database_url(settings)
    revision = migrate.upgrade(url)
    log.info("database schema at revision %s", revision)
    return url
