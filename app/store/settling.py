"""How a run ends: settled in one write when nothing came in meanwhile (`at_once`), else under
the session row's lock (`finish`); or handed over mid-run (`release`)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from app.db.pool import Connection
from app.domain import TERMINAL, OwnerEventType, SessionEventType, Status
from app.errors import FenceRefused
from app.store import sessions
from app.store.events import FENCE, Cursor, Fence
from app.store.notify import WORK_KEY, notify
from app.store.run_writes import UNDELIVERED, Batch, Write, send_batch
from app.store.statements import statement

_LOCK_FOR_FINISH = statement(
    "lock_for_finish",
    f"""
    SELECT cancel_requested_at IS NOT NULL AS cancel, {FENCE} AS held FROM sessions
    WHERE id = %(session_id)s FOR UPDATE
    """,
)
_COUNT_UNDELIVERED = statement(
    "count_undelivered",
    f"""
    SELECT count(*) AS n FROM sessions, LATERAL ({UNDELIVERED.format(after="%(delivered)s")}) e
    WHERE sessions.id = %(session_id)s
    """,
)


def at_once(
    fence: Fence,
    row: dict[str, Any],
    status: Status,
    batch: Batch,
    last_seq: int,
    *,
    error: dict[str, Any] | None = None,
    note: str | None = None,
) -> Write:
    """`finish` as one write, for the common case: the session's log still ends at `last_seq`
    (the last event the run wrote or read), no cancel was requested, and no message waits
    undelivered. Writes nothing otherwise (`written` is 0 on its row: then `finish`). The
    conditions are checked on the locked row, so a follow-up or a cancel committed meanwhile
    (each moves the row) is never missed; the undelivered count is the statement's snapshot's,
    which is all there is when the log still ends at `last_seq`."""
    closing = _closing(batch, fence, status, status, error, note)
    return Write(fence, row["id"], closing, expected_last_seq=last_seq)


async def finish(
    conn: Connection,
    fence: Fence,
    row: dict[str, Any],
    status: Status,
    batch: Batch,
    *,
    error: dict[str, Any] | None = None,
    note: str | None = None,
    requeue_undelivered: bool = True,
) -> tuple[Status | None, Cursor]:
    """Close the run with what `batch` holds: `session_end`, the new status, the lease
    released. Returns the status it settled and `send_batch`'s cursor.

    A delegate's child that settles answers its parent's call in the same transaction
    (`sessions.answer_parent`), so the parent learns of every end exactly once.

    A cancel accepted before this commits wins: the row lock orders the two, so a cancel
    either finds the session terminal (409) or the session ends `cancelled`, never both.

    The same lock orders follow-ups (`post_message` locks the row too). One that came in
    during the run and never reached the model keeps the run going when it would end
    `succeeded` or `waiting`: None, only `batch` written, the caller delivers it. After a
    failure it re-queues the session (announced after the failure), unless
    `requeue_undelivered` is False.
    """
    child = row.get("parent_session_id") is not None
    if child:  # the parent first: its call is answered in this transaction
        await sessions.lock_parent(conn, row["id"])
    cur = await conn.execute(_LOCK_FOR_FINISH, {**fence.params(), "session_id": row["id"]})
    # Sent before the lock's answer is read (one round trip for both in a pipeline); after it
    # on the server, so it sees any follow-up committed while the lock was awaited.
    undelivered = await _send_undelivered_count(conn, row["id"], batch.changes.delivered_seq)
    locked = await cur.fetchone()
    if locked is None or not locked["held"]:
        raise FenceRefused(f"lease on {row['id']} is no longer held by {fence}")
    if locked["cancel"] and status != Status.FAILED:
        status, error, requeue_undelivered = Status.CANCELLED, None, False
    pending = requeue_undelivered and await _count(undelivered) > 0
    if pending and status in (Status.SUCCEEDED, Status.WAITING):
        return None, await send_batch(conn, fence, row["id"], batch)
    settled = status
    if pending and status == Status.FAILED:
        settled = Status.QUEUED
        await notify(conn, WORK_KEY)
    closing = _closing(batch, fence, status, settled, error, note)
    sent = await send_batch(conn, fence, row["id"], closing)
    if child and settled in TERMINAL:  # fenced: a refused write aborts this too
        await sessions.answer_parent(conn, row, settled, error)
    return settled, sent


async def _send_undelivered_count(
    conn: Connection, session_id: UUID, delivered: int | None
) -> Cursor:
    """Count the follow-ups and approval decisions logged after what the model has seen: the
    session's `delivered_seq`, or `delivered` if that is further (`_count` reads it)."""
    return await conn.execute(
        _COUNT_UNDELIVERED, {"delivered": delivered or 0, "session_id": session_id}
    )


async def _count(cur: Cursor) -> int:
    row = await cur.fetchone()
    return int(row["n"]) if row else 0


def _closing(
    batch: Batch,
    fence: Fence,
    status: Status,
    settled: Status,
    error: dict[str, Any] | None,
    note: str | None,
) -> Batch:
    """`batch` and the run's end: `session_end {status}`, its owner event, the lease released;
    the session left `settled` (QUEUED after a failure: a re-queue, announced too)."""
    batch = batch.copy()
    end: dict[str, Any] = {"status": str(status)}
    if error is not None:
        end["error"] = error
    if note is not None:
        end["note"] = note
    batch.add(SessionEventType.SESSION_END, end)
    announced: dict[str, Any] = {"status": str(status), "attempt": fence.attempt}
    if error is not None:
        announced["error"] = error
    batch.announce(OwnerEventType.SESSION_STATUS, announced)
    if settled != status:
        error = None
        batch.announce(
            OwnerEventType.SESSION_STATUS, {"status": str(settled), "attempt": fence.attempt}
        )
    batch.changes.status = settled
    batch.changes.error = error
    batch.changes.lease_released = True
    return batch


async def release(
    conn: Connection, fence: Fence, row: dict[str, Any], reason: str, batch: Batch
) -> Cursor:
    """Give the session up mid-run (shutdown) with what `batch` holds: `session_interrupted`,
    lease cleared, status left `running` so the next claim takes it over at once. Returns
    `send_batch`'s cursor."""
    batch = batch.copy()
    batch.add(SessionEventType.SESSION_INTERRUPTED, {"reason": reason})
    batch.changes.lease_released = True
    sent = await send_batch(conn, fence, row["id"], batch)
    await notify(conn, WORK_KEY)
    return sent


async def cancel_requested(conn: Connection, session_id: UUID) -> bool:
    """Whether a cancel of the session was requested (its holder then ends it `cancelled`)."""
    cur = await conn.execute(
        "SELECT cancel_requested_at IS NOT NULL AS c FROM sessions WHERE id = %s", (session_id,)
    )
    row = await cur.fetchone()
    return bool(row and row["c"])
