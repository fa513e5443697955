"""Death watch: each worker blocks on the liveness lock of one peer, which PostgreSQL grants the
instant that peer's connection ends. The survivor then reaps it and wakes every worker, so a
dead worker's sessions are resumed within milliseconds instead of at the next claim poll. The
poll stays as the fallback: this only makes recovery earlier, never different."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
from psycopg.rows import dict_row

from app.backoff import Backoff, Outage
from app.store import runs

log = logging.getLogger(__name__)

Connection = psycopg.AsyncConnection[dict[str, object]]


# Each cut-short wait is an ERROR in PostgreSQL's log ("canceling statement due to statement
# timeout", for `pg_advisory_lock_shared`): at 5 s that was 17,280 a day per worker. The re-pick
# on a timer is only a fallback: a worker that registers NOTIFYs `membership` (the bus wakes every
# subscriber after a reconnect), a peer that stops or dies frees its lock, and every claim reaps
# dead workers anyway.
REPICK_SECONDS = 60.0


async def watch_peers(
    url: str,
    worker_id: str,
    membership: asyncio.Event,
    *,
    repick_seconds: float = REPICK_SECONDS,
) -> None:
    """Run until cancelled. The peer is chosen again when `membership` is set (a worker
    registered) and at least every `repick_seconds` (statement_timeout cuts the wait short).

    `url` reaches PostgreSQL directly, never through a transaction-mode pooler: the wait is on a
    session-level advisory lock."""
    backoff = Backoff()
    outage = Outage(log, "death watch")
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(
                url, autocommit=True, row_factory=dict_row
            ) as conn:
                # Only the re-pick cuts a wait short: not a lock_timeout the server or the role
                # may set by default (every wait would end in an error and a reconnect).
                await conn.execute(
                    f"SET statement_timeout = {int(repick_seconds * 1000)}; SET lock_timeout = 0"
                )
                backoff.reset()
                outage.recovered()
                while True:
                    membership.clear()
                    key = await runs.next_peer(conn, worker_id)
                    if key is None:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(membership.wait(), repick_seconds)
                        continue
                    if await _peer_died(conn, key, membership):
                        async with conn.transaction():
                            dead = await runs.reap_and_wake(conn)
                        if dead:
                            log.info("workers died: %s", ", ".join(dead))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            outage.failed(exc)
            await backoff.wait()


async def _peer_died(conn: Connection, key: int, membership: asyncio.Event) -> bool:
    """Wait for the peer's death; False when the wait was cut short to choose again."""
    death = asyncio.ensure_future(runs.await_death(conn, key))
    changed = asyncio.ensure_future(membership.wait())
    try:
        await asyncio.wait({death, changed}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        # The worker stops: end the wait now (psycopg cancels the statement in the server).
        # Left running, it would hold the connection, and closing it would wait for the lock
        # or the re-pick timeout.
        death.cancel()
        await asyncio.gather(death, return_exceptions=True)
        raise
    finally:
        changed.cancel()
    if not death.done():
        await conn.cancel_safe()  # a worker joined: stop waiting on the old ring
    try:
        await death
    except psycopg.errors.QueryCanceled:
        return False
    return True
