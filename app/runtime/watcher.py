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


async def watch_peers(
    url: str, worker_id: str, membership: asyncio.Event, *, repick_seconds: float = 5.0
) -> None:
    """Run until cancelled. The peer is chosen again when `membership` is set (a worker
    registered) and at least every `repick_seconds` (statement_timeout cuts the wait short)."""
    backoff = Backoff()
    outage = Outage(log, "death watch")
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(
                url, autocommit=True, row_factory=dict_row
            ) as conn:
                await conn.execute(f"SET statement_timeout = {int(repick_seconds * 1000)}")
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
        death.cancel()  # the worker stops: its connection closes under the wait
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
