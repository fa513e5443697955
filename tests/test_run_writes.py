"""A worker's run writes sent together (app/runtime/writes.py), store-level against a real
PostgreSQL: writes asked for at once commit in one transaction that moves the owner's cursor
once, with gap-free owner ids in order; a write whose lease is gone is refused alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.db.pool import Database
from app.domain import OwnerEventType
from app.errors import FenceRefused
from app.runtime.writes import RunWrites
from app.store import claims
from app.store import sessions as session_store
from app.store.events import Fence
from app.store.run_writes import Batch, Write
from tests.support import database_with_worker

WORKER = "writer:1"
OWNER = "owner-writes"


@pytest.fixture
async def database() -> AsyncIterator[Database]:
    async with database_with_worker("ferryman_run_writes", WORKER) as db:
        yield db


async def claimed(db: Database, count: int) -> list[dict[str, Any]]:
    """`count` new sessions of one owner, claimed by WORKER."""
    new = session_store.NewSession("hi", "hi", "scripted", None, None, {})
    async with db.transaction() as conn:
        for _ in range(count):
            await session_store.create_session(conn, OWNER, new, None)
        return await claims.claim(conn, WORKER, 1, 30, limit=count)


def tool_start(row: dict[str, Any]) -> Write:
    batch = Batch()
    batch.add("tool_call_start", {"toolCallId": f"call-{row['id']}", "name": "t", "arguments": {}})
    batch.set_stage("tool:t")
    batch.announce(OwnerEventType.SESSION_ACTIVE_STAGE, {"stage": "tool:t"})
    return Write(Fence(WORKER, row["attempt"]), row["id"], batch)


async def rows(db: Database, sql: str, *params: Any) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        return await (await conn.execute(sql, params)).fetchall()


async def test_writes_asked_at_once_commit_together(database: Database) -> None:
    sessions = await claimed(database, 6)
    writes = RunWrites(database)
    results = await asyncio.gather(*(writes.send(tool_start(row)) for row in sessions))
    assert all(result is not None and result["written"] == 1 for result in results)
    logged = await rows(
        database,
        "SELECT session_id, seq, xmin::text AS tx FROM session_events"
        " WHERE type = 'tool_call_start' ORDER BY session_id",
    )
    assert [(r["session_id"], r["seq"]) for r in logged] == sorted(
        (row["id"], row["last_seq"] + 1) for row in sessions
    )
    assert len({r["tx"] for r in logged}) == 1  # one transaction
    announced = await rows(
        database, "SELECT id, type, xmin::text AS tx FROM owner_events ORDER BY id"
    )
    # Gap-free and in order: each session's creation and claim, then the six stages together.
    assert [r["id"] for r in announced] == list(range(1, len(announced) + 1))
    stages = [r for r in announced if r["type"] == OwnerEventType.SESSION_ACTIVE_STAGE]
    assert len(stages) == 6 and {r["tx"] for r in stages} == {logged[0]["tx"]}
    assert stages[-1]["id"] == len(announced)


async def test_a_write_whose_lease_is_gone_is_refused_alone(database: Database) -> None:
    sessions = await claimed(database, 3)
    lapsed = sessions[1]
    async with database.connection() as conn:
        await conn.execute(
            "UPDATE sessions SET lease_expires_at = clock_timestamp() - interval '1 second'"
            " WHERE id = %s",
            (lapsed["id"],),
        )
    writes = RunWrites(database)
    results = await asyncio.gather(
        *(writes.send(tool_start(row)) for row in sessions), return_exceptions=True
    )
    assert isinstance(results[1], FenceRefused)
    assert all(isinstance(r, dict) and r["written"] == 1 for r in (results[0], results[2]))
    logged = await rows(
        database, "SELECT session_id FROM session_events WHERE type = 'tool_call_start'"
    )
    assert {r["session_id"] for r in logged} == {sessions[0]["id"], sessions[2]["id"]}


ROW_CHANGES = (
    "delivered_seq, input_tokens, output_tokens, cached_tokens, active_stage, status, error,"
    " lease_worker_id, lease_pid, lease_expires_at"
)


async def session_row(db: Database, session_id: Any) -> dict[str, Any]:
    [row] = await rows(db, f"SELECT {ROW_CHANGES} FROM sessions WHERE id = %s", session_id)
    return row


async def test_a_write_changes_only_the_columns_its_batch_names(database: Database) -> None:
    """One statement serves every set of changes: what a batch leaves alone keeps its value,
    and what it names changes as the batch says (token counts add up, the delivered seq only
    moves forward)."""
    [row] = await claimed(database, 1)
    fence = Fence(WORKER, row["attempt"])
    writes = RunWrites(database)
    progress = Batch()
    progress.deliver(row["last_seq"])
    progress.count_tokens(3, 2, 1)
    progress.set_stage("tool:t")
    await writes.send(Write(fence, row["id"], progress))
    before = await session_row(database, row["id"])
    assert before["active_stage"] == "tool:t" and before["delivered_seq"] == row["last_seq"]

    events_only = Batch()
    events_only.add("tool_result", {"toolCallId": "c", "name": "t", "content": "x"})
    await writes.send(Write(fence, row["id"], events_only))
    assert await session_row(database, row["id"]) == before

    more = Batch()
    more.deliver(0)  # behind what the model has seen: no step back
    more.count_tokens(10, 20, 30)
    await writes.send(Write(fence, row["id"], more))
    after = await session_row(database, row["id"])
    assert after == {
        **before,
        "input_tokens": before["input_tokens"] + 10,
        "output_tokens": before["output_tokens"] + 20,
        "cached_tokens": before["cached_tokens"] + 30,
    }
