"""Retention deletes a large backlog in batches, each its own short transaction: under the
statement timeout every pooled connection has, deleting it in one statement is cancelled every
time, so the backlog would never shrink."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import timedelta

import psycopg
import pytest

from app.db.pool import Database, SessionLimits
from app.store import retention

BACKLOG = 200_000
OWNER = "retention-backlog"
# Low enough that deleting the whole backlog in one statement is cancelled (it takes about
# 90 ms), as the 10 s limit is on a backlog a hundred times larger; a batch of 500 takes 2-5 ms.
STATEMENT_TIMEOUT = 0.04
KEEP = timedelta(days=1)
FOREVER = timedelta(days=36500)


async def plant_backlog(db: Database) -> None:
    """BACKLOG old events of one owner, and its cursor at the newest."""
    async with db.transaction() as conn:
        await conn.execute("DELETE FROM owner_events WHERE owner_id = %s", (OWNER,))
        await conn.execute(
            "INSERT INTO owner_events (owner_id, id, session_id, type, data, created_at)"
            " SELECT %s, n, gen_random_uuid(), 'stage', '{}', now() - interval '2 days'"
            " FROM generate_series(1, %s) AS n",
            (OWNER, BACKLOG),
        )
        await conn.execute(
            "INSERT INTO owner_cursors (owner_id, last_id) VALUES (%s, %s)"
            " ON CONFLICT (owner_id) DO UPDATE SET last_id = excluded.last_id",
            (OWNER, BACKLOG),
        )
    async with db.connection() as conn:
        await conn.execute("ANALYZE owner_events")


async def left(db: Database) -> int:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM owner_events WHERE owner_id = %s", (OWNER,)
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


@pytest.fixture
async def db(isolated_db: str) -> AsyncIterator[Database]:
    """A pool without limits, to plant the backlog."""
    database = Database(isolated_db, min_size=1, max_size=1)
    await database.pool.open(wait=True)
    yield database
    await database.close()


async def test_a_backlog_is_deleted_in_batches_under_the_statement_timeout(
    isolated_db: str, db: Database
) -> None:
    await plant_backlog(db)
    limited = Database(
        isolated_db, min_size=1, max_size=1, limits=SessionLimits(STATEMENT_TIMEOUT, 5, 30)
    )
    await limited.pool.open(wait=True)
    try:
        # All of it in one statement: cancelled, nothing deleted.
        with pytest.raises(psycopg.errors.QueryCanceled):
            async with limited.transaction() as conn:
                await conn.execute(
                    "DELETE FROM owner_events e USING owner_cursors c"
                    " WHERE e.owner_id = c.owner_id AND e.id < c.last_id"
                    " AND e.created_at < clock_timestamp() - %s",
                    (KEEP,),
                )
        assert await left(db) == BACKLOG

        started = time.monotonic()
        pruned = await retention.prune(
            limited,
            owner_events_older_than=KEEP,
            deleted_sessions_older_than=FOREVER,
            idempotency_keys_older_than=FOREVER,
            batch_rows=500,
        )
        print(f"{BACKLOG} events pruned in {time.monotonic() - started:.1f}s")
        assert pruned.complete
        assert pruned.owner_events == BACKLOG - 1
        assert await left(db) == 1  # the newest is kept
    finally:
        await limited.close()


async def test_a_run_stops_at_its_time_budget_and_the_next_goes_on(db: Database) -> None:
    await plant_backlog(db)
    ages = {
        "owner_events_older_than": KEEP,
        "deleted_sessions_older_than": FOREVER,
        "idempotency_keys_older_than": FOREVER,
    }
    first = await retention.prune(db, **ages, budget=0)
    assert not first.complete and first.owner_events == 0
    assert await left(db) == BACKLOG
    second = await retention.prune(db, **ages)
    assert second.complete and second.owner_events == BACKLOG - 1
