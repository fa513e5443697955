"""Fixtures: a real PostgreSQL (the embedded one, or DATABASE_URL), a fresh database per test
run, and real `ferryman serve` processes for anything that streams."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from app.db.pool import Database
from tests.support import ServerProcess, create_owner_key, fresh_database


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A fresh, migrated database for this test run, dropped afterwards."""
    with fresh_database("ferryman_test") as url:
        yield url


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
