"""The connection pool every request, stream read and run write borrows from.

The pool may go through a transaction-mode pooler (PgBouncer): then each transaction may run on
another server connection, so the pool keeps no session state there. What needs a session of its
own (LISTEN, the workers' liveness locks and the death watch's looks at them, migrations) connects
to `direct_url` instead (docs/deploy.md).
"""

from __future__ import annotations

import contextlib
import select
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
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


async def check_idle_connection(conn: Connection) -> None:
    """The pool's check on checkout, without a round trip for a healthy connection: a server
    that closed it (a restart, an idle timeout) has left its goodbye or EOF on the socket, so
    only a connection with something to read is asked (and fails, and is replaced). Asking
    every connection cost a round trip per checkout: a third of a session's statements."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        await AsyncConnectionPool.check_connection(conn)


@dataclass(frozen=True)
class SessionLimits:
    """Server-side limits of every pooled connection (behind a transaction-mode pooler: of every
    transaction), in seconds (0: none): a stuck lock or a runaway statement gives the connection
    back, with an error the API answers 503, instead of holding it while requests queue behind
    it."""

    statement_timeout: float = 0
    lock_timeout: float = 0
    idle_in_transaction_timeout: float = 0

    def options(self, url: str) -> str:
        """libpq `options` for these limits, after any the URL already sets."""
        ours = " ".join(f"-c {name}={ms}" for name, ms in self._milliseconds().items())
        theirs = conninfo_to_dict(url).get("options")
        return f"{theirs} {ours}" if theirs else ours

    def begin(self) -> str:
        """BEGIN with these limits for the transaction alone (SET LOCAL): one simple-protocol
        query, so one round trip, as a bare BEGIN is."""
        sets = "".join(f"; SET LOCAL {name} = {ms}" for name, ms in self._milliseconds().items())
        return f"BEGIN{sets}"

    def set_local(self) -> str:
        """The limits for the transaction alone as one extended-protocol statement (a pipeline
        cannot send the several statements `begin()` sends)."""
        sets = ", ".join(
            f"set_config('{name}', '{ms}', true)" for name, ms in self._milliseconds().items()
        )
        return f"SELECT {sets}"

    def _milliseconds(self) -> dict[str, int]:
        return {
            "statement_timeout": round(self.statement_timeout * 1000),
            "lock_timeout": round(self.lock_timeout * 1000),
            "idle_in_transaction_session_timeout": round(self.idle_in_transaction_timeout * 1000),
        }


class Database:
    """The pool on `url`. `direct_url` (default: `url`) is where session state lives; when it
    differs, `url` is taken to be a transaction-mode pooler in front of it (`pooled`):

    - no server-side prepared statements (psycopg's `prepare_threshold=None`): a statement
      prepared in one transaction's server connection is unknown to the next one's;
    - the limits are set per transaction, by `SET LOCAL` in the query that begins it, instead
      of per connection by the `options` startup parameter (which PgBouncer refuses). A
      statement in autocommit (`connection()`) then has only the server's or role's limits.

    Round trips per transaction are the same either way: BEGIN (with the SET LOCALs), the
    statements, COMMIT."""

    def __init__(
        self,
        url: str,
        *,
        direct_url: str | None = None,
        min_size: int = 2,
        max_size: int = 20,
        timeout: float = 5.0,
        limits: SessionLimits | None = None,
    ):
        self.url = url
        self.direct_url = direct_url or url
        self.pooled = self.direct_url != url
        # Across a partition nothing answers and nothing fails: a statement sent would wait for
        # TCP's retransmissions (minutes). Unacknowledged data for longer than the pool timeout
        # fails the connection instead, so the request answers 503 and the connection is replaced.
        connect: dict[str, Any] = {
            "row_factory": dict_row,
            "autocommit": True,
            "tcp_user_timeout": int(timeout * 1000),
        }
        self._begin: str | None = None
        self._set_local: str | None = None
        if self.pooled:
            connect["prepare_threshold"] = None
            if limits is not None:
                self._begin = limits.begin()
                self._set_local = limits.set_local()
        elif limits is not None:
            connect["options"] = limits.options(url)
        self.pool: AsyncConnectionPool[Connection] = _Pool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            open=False,
            kwargs=connect,
            # A restarted server leaves dead connections in the pool: check each one on
            # checkout so the first request after a restart already succeeds.
            check=check_idle_connection,
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
        async with self.pool.connection() as conn:
            if self._begin is None:
                async with conn.transaction():
                    yield conn
                return
            # Begun by hand, with its limits; a `conn.transaction()` inside is a savepoint.
            await conn.execute(self._begin)
            try:
                yield conn
            except BaseException:
                with contextlib.suppress(psycopg.Error):  # a broken one leaves the pool
                    await conn.rollback()
                raise
            await conn.commit()

    @asynccontextmanager
    async def pipeline(self) -> AsyncIterator[Connection]:
        """A transaction whose statements are pipelined: each is sent without waiting for the
        answer to the one before, and COMMIT goes with the last, so the transaction is one
        round trip, and row locks it takes are held for no round trip at all. Reading a
        result inside the block waits for the answers up to it (one more round trip); the
        results are all there once the block has ended. An error may surface only at the end
        of the block: the statements after the one that failed are skipped, and the
        transaction is rolled back."""
        async with self.pool.connection() as conn:
            try:
                # BEGIN and COMMIT by hand: psycopg's `transaction()` waits for the server at
                # its start and before its COMMIT, which would cost three round trips more.
                async with conn.pipeline():
                    await conn.execute("BEGIN")
                    if self._set_local is not None:
                        await conn.execute(self._set_local)
                    yield conn
                    await conn.execute("COMMIT")
            except BaseException:
                # A statement that failed in the pipeline leaves the transaction aborted but
                # open (the COMMIT was skipped), as does an exception in the block: end it
                # before the connection goes back.
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        await conn.rollback()
                raise

    async def ping(self) -> None:
        async with self.connection() as conn:
            await conn.execute("SELECT 1")

    def stats(self) -> dict[str, Any]:
        return dict(self.pool.get_stats())
