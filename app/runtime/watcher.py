"""Death watch: each worker looks every DEATH_POLL_SECONDS whether the liveness lock of one peer
is free, which it is the instant that peer's connection ends. The survivor then reaps it and
wakes every worker, so a dead worker's sessions are resumed within a tenth of a second instead
of at the next claim poll. The poll stays as the fallback: this only makes recovery earlier,
never different."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
from psycopg.rows import dict_row

from app.backoff import Backoff, Outage
from app.store import liveness

log = logging.getLogger(__name__)

Connection = psycopg.AsyncConnection[dict[str, object]]


# A look, not a wait: a statement blocked on the peer's lock holds its snapshot, and PostgreSQL
# keeps every row version deleted meanwhile, in the whole database, for as long as the peer
# lives. Under load an owner's cursor row piled up ~185 versions on its page that every owner
# event walked (`heap_hot_search_buffer` was 15 % of the server's CPU), and vacuum could clean
# nothing. A look is one short statement: 10 a second per worker.
DEATH_POLL_SECONDS = 0.1
# The peer is chosen again at least this often. Only a fallback: a worker that registers
# NOTIFYs `membership` (the bus wakes every subscriber after a reconnect), and every claim reaps
# dead workers anyway.
REPICK_SECONDS = 60.0


async def watch_peers(
    url: str,
    worker_id: str,
    membership: asyncio.Event,
    *,
    poll_seconds: float = DEATH_POLL_SECONDS,
    repick_seconds: float = REPICK_SECONDS,
) -> None:
    """Run until cancelled. The peer is chosen again when `membership` is set (a worker
    registered) and at least every `repick_seconds`.

    `url` reaches PostgreSQL directly: the liveness locks are session-level advisory locks."""
    backoff = Backoff()
    outage = Outage(log, "death watch")
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(
                url, autocommit=True, row_factory=dict_row
            ) as conn:
                backoff.reset()
                outage.recovered()
                while True:
                    membership.clear()
                    key = await liveness.next_peer(conn, worker_id)
                    if key is None:
                        await _until(membership, repick_seconds)
                        continue
                    if await _peer_died(conn, key, membership, poll_seconds, repick_seconds):
                        async with conn.transaction():
                            dead = await liveness.reap_and_wake(conn)
                        if dead:
                            log.info("workers died: %s", ", ".join(dead))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            outage.failed(exc)
            await backoff.wait()


async def _peer_died(
    conn: Connection, key: int, membership: asyncio.Event, poll: float, repick: float
) -> bool:
    """Look every `poll` s until the peer's lock is free (True), or until a worker joins or
    `repick` s have passed (False: choose again)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + repick
    while not membership.is_set() and loop.time() < deadline:
        if await liveness.liveness_lock_free(conn, key):
            return True
        await _until(membership, poll)
    return False


async def _until(event: asyncio.Event, seconds: float) -> None:
    """Wait for `event`, for at most `seconds`."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
