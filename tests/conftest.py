"""Fixtures: a real PostgreSQL (the embedded one, or DATABASE_URL), a fresh database per test
run, and real `ferryman serve` processes for anything that streams."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from app.db import migrate
from app.db.embedded import start_embedded
from app.db.pool import Database
from tests.support import ServerProcess, create_owner_key


def _test_data_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/ferryman-test")
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"ferryman-test-{os.getuid()}"


def _server_url() -> str:
    """URL of a database on the server under test (admin rights to create databases)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    return start_embedded(_test_data_dir())


def _with_database(url: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A fresh, migrated database for this test run, dropped afterwards."""
    admin_url = _server_url()
    name = f"ferryman_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = _with_database(admin_url, name)
    migrate.upgrade(url)
    yield url
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="session")
def server(database_url: str) -> Iterator[ServerProcess]:
    """One `ferryman serve` shared by the tests that do not need a server of their own."""
    proc = ServerProcess(database_url).start()
    yield proc
    proc.stop()


@pytest.fixture
def owner_key(database_url: str) -> tuple[str, str]:
    """A fresh owner (so tests never see each other's sessions) and its API key."""
    return create_owner_key(database_url)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url, min_size=1, max_size=10)
    await database.pool.open(wait=True)
    yield database
    await database.close()
