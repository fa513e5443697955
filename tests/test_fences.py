"""The whole fence on every run write (SPEC section 1, "lease"): a holder whose lease ran out
writes nothing more, even when no one else has claimed the session, so its worker id and attempt
still match. Store-level and deterministic: the lease is put in the past with SQL, as a holder
frozen past its TTL would find it.

The process-level version of the same (a worker SIGSTOPped past its TTL) is in
tests/test_leases.py."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from app.db.pool import Connection, Database
from app.domain import Status
from app.errors import FenceRefused
from app.store import runs
from app.store import sessions as session_store
from app.store.events import Fence
from tests.support import fresh_database

WORKER = "frozen00:1"

Write = Callable[[Connection, Fence, dict[str, Any]], Awaitable[Any]]

WRITES: dict[str, Write] = {
    "append": lambda c, f, r: runs.append(c, f, r["id"], "assistant_message", {"text": "late"}),
    "append_with_progress": lambda c, f, r: runs.append(
        c, f, r["id"], "tool_call_start", {}, delivered=99, tokens=(1, 1, 1), stage="tool:late"
    ),
    "mark_delivered": lambda c, f, r: runs.mark_delivered(c, f, r["id"], 99),
    "put_note": lambda c, f, r: runs.put_note(c, f, r["id"], "k", "late"),
    "finish": lambda c, f, r: runs.finish(c, f, r, Status.SUCCEEDED),
    "release": lambda c, f, r: runs.release(c, f, r, "shutdown"),
}


@pytest.fixture(scope="module")
async def database() -> AsyncIterator[Database]:
    with fresh_database("ferryman_fence") as url:
        db = Database(url, min_size=1, max_size=4)
        await db.pool.open(wait=True)
        async with db.transaction() as conn:
            await conn.execute(
                "INSERT INTO workers (id, pid, hostname) VALUES (%s, 1, 'test')", (WORKER,)
            )
        yield db
        await db.close()


async def claimed_session(db: Database) -> dict[str, Any]:
    new = session_store.NewSession("hi", "hi", "scripted", None, None, {})
    async with db.transaction() as conn:
        await session_store.create_session(conn, f"owner-{uuid.uuid4().hex[:8]}", new, None)
        [row] = await runs.claim(conn, WORKER, 1, 30)
    return row


async def state(db: Database, session_id: uuid.UUID) -> dict[str, Any]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT status, last_seq, delivered_seq, active_stage, input_tokens,"
            " lease_worker_id, (SELECT count(*) FROM notes WHERE session_id = s.id) AS notes"
            " FROM sessions s WHERE id = %s",
            (session_id,),
        )
        row = await cur.fetchone()
    assert row is not None
    return row


@pytest.mark.parametrize("name", sorted(WRITES))
async def test_a_lapsed_lease_refuses_every_run_write(database: Database, name: str) -> None:
    row = await claimed_session(database)
    fence = Fence(WORKER, row["attempt"])
    # Held: the write goes through (so the refusal below is the lease's doing).
    async with database.transaction() as conn:
        await WRITES["mark_delivered"](conn, fence, row)
    async with database.transaction() as conn:
        await conn.execute(
            "UPDATE sessions SET lease_expires_at = clock_timestamp() - interval '1 second'"
            " WHERE id = %s",
            (row["id"],),
        )
    before = await state(database, row["id"])
    assert before["lease_worker_id"] == WORKER  # no one else claimed it
    with pytest.raises(FenceRefused):
        async with database.transaction() as conn:
            await WRITES[name](conn, fence, row)
    assert await state(database, row["id"]) == before


async def test_another_attempt_is_refused_too(database: Database) -> None:
    row = await claimed_session(database)
    stale = Fence(WORKER, row["attempt"] - 1)
    for name, write in WRITES.items():
        with pytest.raises(FenceRefused):
            async with database.transaction() as conn:
                await write(conn, stale, row)
        assert name
