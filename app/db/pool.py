"""The connection pool every request, stream read and run write borrows from."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

Connection = psycopg.AsyncConnection[DictRow]

# Errors that mean "the database cannot be reached right now": the API answers 503 and
# streams retry, instead of either turning into a 500.
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (psycopg.OperationalError, PoolTimeout)

# psycopg_pool doubles its reconnect delay without bound (1, 2, 4, ... 64 s): after an outage of
# a minute the pool would stay empty for another minute. Cap it so the pool is back within
# about this many seconds of the database.
MAX_RECONNECT_DELAY = 2.0


class _Pool(AsyncConnectionPool[Connection]):
    async def _add_connection(
        self, attempt: AttemptWithBackoff | None, growing: bool = False
    ) -> None:
        if attempt is not None:
            # The pool doubles `delay` after this attempt fails: keep the result under the cap.
            attempt.delay = min(attempt.delay, MAX_RECONNECT_DELAY / attempt.DELAY_BACKOFF)
        await super()._add_connection(attempt, growing=growing)


class Database:
    def __init__(self, url: str, *, min_size: int = 2, max_size: int = 20, timeout: float = 5.0):
        self.url = url
        self.pool: AsyncConnectionPool[Connection] = _Pool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            open=False,
            kwargs={"row_factory": dict_row, "autocommit": True},
            # A restarted server leaves dead connections in the pool: check each one on
            # checkout so the first request after a restart already succeeds.
            check=AsyncConnectionPool.check_connection,
            reconnect_timeout=float("inf"),
            name="ferryman",
        )

    async def open(self) -> None:
        await self.pool.open(wait=False)

    async def close(self) -> None:
        await self.pool.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """A connection in autocommit mode, for single-statement reads."""
        async with self.pool.connection() as conn:
            yield conn

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """A connection inside one transaction, committed when the block exits cleanly."""
        async with self.pool.connection() as conn, conn.transaction():
            yield conn

    async def ping(self) -> None:
        async with self.connection() as conn:
            await conn.execute("SELECT 1")

    def stats(self) -> dict[str, Any]:
        return dict(self.pool.get_stats())
