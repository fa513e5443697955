"""How a run ends (`settling.finish`), store-level and deterministic: what it writes with the run's
pending batch when the run ends plainly, when a follow-up came in that the model has not seen,
and when a cancel was requested (SPEC sections 2 and 5)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.db.pool import Database
from app.domain import Status
from app.store import sessions as session_store
from app.store import settling
from app.store.events import Fence, fence_errors
from app.store.run_writes import Batch
from tests.support import claimed_session, database_with_worker

WORKER = "finisher:1"
# A claimed session's log: its message, and the `session_start` its first claim logged.
STARTED = ["user_message", "session_start"]


@pytest.fixture  # one per test: a session one re-queues must not be the next one's claim
async def database() -> AsyncIterator[Database]:
    async with database_with_worker("ferryman_finish", WORKER) as db:
        yield db


def reply(delivered: int) -> Batch:
    batch = Batch()
    batch.add("assistant_message", {"text": "done", "toolCalls": [], "stopReason": "stop"})
    batch.deliver(delivered)
    return batch


async def finish(db: Database, row: dict[str, Any], status: Status, **details: Any) -> Any:
    with fence_errors():
        async with db.pipeline() as conn:
            settled, sent = await settling.finish(
                conn, Fence(WORKER, row["attempt"]), row, status, reply(row["last_seq"]), **details
            )
    return settled, await sent.fetchone()


async def log_of(db: Database, row: dict[str, Any]) -> list[str]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT type FROM session_events WHERE session_id = %s ORDER BY seq", (row["id"],)
        )
        return [r["type"] for r in await cur.fetchall()]


async def statuses(db: Database, row: dict[str, Any]) -> tuple[str, list[str]]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT status FROM sessions WHERE id = %s", (row["id"],))
        status = await cur.fetchone()
        cur = await conn.execute(
            "SELECT data->>'status' AS s FROM owner_events"
            " WHERE session_id = %s AND type = 'session_status' ORDER BY id",
            (row["id"],),
        )
        announced = [r["s"] for r in await cur.fetchall()]
    assert status is not None
    return status["status"], announced


async def test_a_plain_end_writes_the_batch_then_session_end(database: Database) -> None:
    row = await claimed_session(database, WORKER)
    settled, sent = await finish(database, row, Status.SUCCEEDED)
    assert settled == Status.SUCCEEDED
    assert await log_of(database, row) == [*STARTED, "assistant_message", "session_end"]
    assert sent["seq"] == 4  # the last event the statement wrote
    assert await statuses(database, row) == ("succeeded", ["running", "succeeded"])


async def test_an_unseen_follow_up_keeps_the_run_going(database: Database) -> None:
    row = await claimed_session(database, WORKER)
    async with database.transaction() as conn:
        await session_store.post_message(conn, row["owner_id"], row["id"], "and also")
    settled, _ = await finish(database, row, Status.SUCCEEDED)
    assert settled is None  # the run goes on to answer it: only the batch was written
    assert await log_of(database, row) == [*STARTED, "user_message", "assistant_message"]
    assert await statuses(database, row) == ("running", ["running"])


async def test_a_failure_with_an_unseen_follow_up_re_queues(database: Database) -> None:
    row = await claimed_session(database, WORKER)
    async with database.transaction() as conn:
        await session_store.post_message(conn, row["owner_id"], row["id"], "and also")
    error = {"code": "MODEL_UNAVAILABLE", "message": "down"}
    settled, _ = await finish(database, row, Status.FAILED, error=error)
    assert settled == Status.QUEUED
    assert (await log_of(database, row))[-1] == "session_end"
    # The failure is announced, then the re-queue, in that order, with one statement.
    assert await statuses(database, row) == ("queued", ["running", "failed", "queued"])


async def test_a_requested_cancel_wins(database: Database) -> None:
    row = await claimed_session(database, WORKER)
    async with database.transaction() as conn:
        await session_store.request_cancel(conn, row["owner_id"], row["id"])
    settled, _ = await finish(database, row, Status.SUCCEEDED)
    assert settled == Status.CANCELLED
    assert await statuses(database, row) == ("cancelled", ["running", "cancelled"])


async def at_once(db: Database, row: dict[str, Any], status: Status) -> dict[str, Any]:
    async with db.connection() as conn:
        write = settling.at_once(
            Fence(WORKER, row["attempt"]), row, status, reply(row["last_seq"]), row["last_seq"]
        )
        sent = await write.send(conn)
        written = await sent.fetchone()
    assert written is not None
    return written


async def test_at_once_a_plain_end_is_one_statement(database: Database) -> None:
    row = await claimed_session(database, WORKER)
    written = await at_once(database, row, Status.SUCCEEDED)
    assert (written["written"], written["seq"]) == (1, 4)
    assert await log_of(database, row) == [*STARTED, "assistant_message", "session_end"]
    assert await statuses(database, row) == ("succeeded", ["running", "succeeded"])


@pytest.mark.parametrize("meanwhile", ["follow_up", "cancel"])
async def test_at_once_writes_nothing_when_something_came_in(
    database: Database, meanwhile: str
) -> None:
    """A follow-up moves the log past what the run knows, a cancel marks the row: either way
    the one statement writes nothing (not even the batch) and `finish` takes over."""
    row = await claimed_session(database, WORKER)
    async with database.transaction() as conn:
        if meanwhile == "follow_up":
            await session_store.post_message(conn, row["owner_id"], row["id"], "and also")
        else:
            await session_store.request_cancel(conn, row["owner_id"], row["id"])
    before = await log_of(database, row)
    assert (await at_once(database, row, Status.SUCCEEDED))["written"] == 0
    assert await log_of(database, row) == before
    assert await statuses(database, row) == ("running", ["running"])


async def test_at_once_sees_a_message_the_model_never_got(database: Database) -> None:
    """A message logged before the run's last read but after what the model was told (its
    delivered mark) keeps the session from ending at once, though the log did not move."""
    row = await claimed_session(database, WORKER)
    async with database.transaction() as conn:
        await session_store.post_message(conn, row["owner_id"], row["id"], "and also")
    async with database.connection() as conn:
        write = settling.at_once(
            Fence(WORKER, row["attempt"]),
            row,
            Status.SUCCEEDED,
            reply(row["last_seq"]),
            row["last_seq"] + 1,
        )
        sent = await write.send(conn)
        written = await sent.fetchone()
    assert written is not None and written["written"] == 0
