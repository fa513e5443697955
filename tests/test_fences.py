"""The whole fence on every run write (SPEC section 1, "lease"): a holder whose lease ran out
writes nothing more, even when no one else has claimed the session, so its worker id and attempt
still match. Store-level and deterministic: the lease is put in the past with SQL, as a holder
frozen past its TTL would find it.

The process-level version of the same (a worker SIGSTOPped past its TTL) is in
tests/test_leases.py."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from app.db.pool import Connection, Database
from app.domain import OwnerEventType, Status
from app.errors import FenceRefused
from app.store import settling
from app.store.events import Fence, append_owner_event, fence_errors
from app.store.run_writes import Batch, send_batch
from tests.support import claimed_session, database_with_worker

WORKER = "frozen00:1"

Write = Callable[[Connection, Fence, dict[str, Any]], Awaitable[Any]]


def batch(*events: str) -> Batch:
    written = Batch()
    for type_ in events:
        written.add(type_, {"text": "late"})
    return written


def progress() -> Batch:
    written = batch("tool_call_start")
    written.deliver(99)
    written.count_tokens(1, 1, 1)
    written.set_stage("tool:late")
    written.announce(OwnerEventType.SESSION_ACTIVE_STAGE, {"stage": "tool:late"})
    written.ephemerals.append(("s:late", "{}"))
    return written


def noted() -> Batch:
    """A tool's result and the note the tool put."""
    written = batch("tool_result")
    written.put_note("k", "late")
    return written


def delivered_only() -> Batch:
    written = Batch()
    written.deliver(99)
    return written


WRITES: dict[str, Write] = {
    "events": lambda c, f, r: send_batch(c, f, r["id"], batch("assistant_message", "x")),
    "events_with_progress": lambda c, f, r: send_batch(c, f, r["id"], progress()),
    "session_row_only": lambda c, f, r: send_batch(c, f, r["id"], delivered_only()),
    "note": lambda c, f, r: send_batch(c, f, r["id"], noted()),
    "finish": lambda c, f, r: settling.finish(
        c, f, r, Status.SUCCEEDED, batch("assistant_message")
    ),
    "release": lambda c, f, r: settling.release(c, f, r, "shutdown", batch("tool_result")),
}


@pytest.fixture(scope="module")
async def database() -> AsyncIterator[Database]:
    async with database_with_worker("ferryman_fence", WORKER) as db:
        yield db


@contextlib.asynccontextmanager
async def run_transaction(db: Database) -> AsyncIterator[Connection]:
    """A transaction as a run writes it: pipelined, a refusal coming out as FenceRefused."""
    with fence_errors():
        async with db.pipeline() as conn:
            yield conn


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
    row = await claimed_session(database, WORKER)
    fence = Fence(WORKER, row["attempt"])
    # Held: the write goes through (so the refusal below is the lease's doing).
    async with database.transaction() as conn:
        await WRITES["session_row_only"](conn, fence, row)
    async with database.transaction() as conn:
        await conn.execute(
            "UPDATE sessions SET lease_expires_at = clock_timestamp() - interval '1 second'"
            " WHERE id = %s",
            (row["id"],),
        )
    before = await state(database, row["id"])
    assert before["lease_worker_id"] == WORKER  # no one else claimed it
    with pytest.raises(FenceRefused):
        async with run_transaction(database) as conn:
            await WRITES[name](conn, fence, row)
    assert await state(database, row["id"]) == before


async def test_another_attempt_is_refused_too(database: Database) -> None:
    row = await claimed_session(database, WORKER)
    stale = Fence(WORKER, row["attempt"] - 1)
    for name, write in WRITES.items():
        with pytest.raises(FenceRefused):
            async with run_transaction(database) as conn:
                await write(conn, stale, row)
        assert name


async def test_a_refused_write_takes_the_whole_pipelined_transaction_with_it(
    database: Database,
) -> None:
    """The statements queued behind a refused write in the pipeline are not committed, even
    one with no fence of its own."""
    row = await claimed_session(database, WORKER)
    stale = Fence(WORKER, row["attempt"] - 1)
    before = await state(database, row["id"])
    with pytest.raises(FenceRefused):
        async with run_transaction(database) as conn:
            await send_batch(conn, stale, row["id"], batch("tool_call_start"))
            await append_owner_event(
                conn, row["owner_id"], row["id"], OwnerEventType.SESSION_ACTIVE_STAGE, {}
            )
    assert await state(database, row["id"]) == before
    async with database.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM owner_events WHERE session_id = %s AND type = %s",
            (row["id"], OwnerEventType.SESSION_ACTIVE_STAGE),
        )
        counted = await cur.fetchone()
    assert counted is not None and counted["n"] == 0
    # The connection went back to the pool usable: the next transaction on it commits.
    async with database.transaction() as conn:
        await WRITES["session_row_only"](conn, Fence(WORKER, row["attempt"]), row)
