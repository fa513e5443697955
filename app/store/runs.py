"""What workers write: registration, claims, leases, fenced run events, settling, notes.

Every run write checks the fence `(workerId, attempt)` and an unexpired lease in the statement
that writes, so a worker that lost its lease writes nothing more.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any
from uuid import UUID

from app.db.pool import Connection
from app.domain import OwnerEventType, SessionEventType, Status
from app.errors import FenceRefused
from app.store.events import FENCE, Fence, append_owner_event, append_session_event
from app.store.notify import OWNER_KEY_PREFIX, WORK_KEY, WORKERS_KEY, notify, notifying
from app.store.sessions import SESSION_COLUMNS, set_status

# Advisory-lock namespace of worker liveness locks: pg_advisory_lock(WORKER_LOCK_NAMESPACE, key).
WORKER_LOCK_NAMESPACE = 0x4645


async def register_worker(conn: Connection, worker_id: str, pid: int, hostname: str) -> int:
    """Take this worker's liveness lock on `conn` (held for the connection's life) and record
    the worker. The lock is taken before the row exists, so no one can reap a live worker."""
    cur = await conn.execute("SELECT nextval('worker_lock_keys')::integer AS k")
    row = await cur.fetchone()
    assert row is not None
    key = int(row["k"])
    await conn.execute("SELECT pg_advisory_lock(%s, %s)", (WORKER_LOCK_NAMESPACE, key))
    # One transaction: were the worker live again before its old leases are given back, its
    # own claim loop could take a session in between, and the release would strip that new
    # lease (an attempt spent for nothing).
    async with conn.transaction():
        await conn.execute(
            """
            INSERT INTO workers (id, pid, hostname, lock_key) VALUES (%s, %s, %s, %s)
            ON CONFLICT (id) DO UPDATE SET lock_key = excluded.lock_key, stopped_at = NULL,
                heartbeat_at = clock_timestamp()
            """,
            (worker_id, pid, hostname, key),
        )
        await notify(conn, WORKERS_KEY)
        # Registering again means the old connection died and every run was aborted: give
        # their leases back now, so other workers need not wait out the TTL. (A run still
        # winding down writes nothing: its fence names a lease that is gone.)
        cur = await conn.execute(
            "UPDATE sessions SET lease_worker_id = NULL, lease_pid = NULL, lease_expires_at = NULL"
            " WHERE lease_worker_id = %s AND status = 'running' RETURNING id",
            (worker_id,),
        )
        if await cur.fetchone() is not None:
            await notify(conn, WORK_KEY)
    return key


async def mark_worker_stopped(conn: Connection, worker_id: str) -> None:
    await conn.execute(
        "UPDATE workers SET stopped_at = clock_timestamp() WHERE id = %s AND stopped_at IS NULL",
        (worker_id,),
    )


async def reap_dead_workers(conn: Connection) -> list[str]:
    """Mark stopped every worker whose liveness lock is gone: its process (or its connection)
    died. Their sessions become claimable at once."""
    cur = await conn.execute(
        """
        UPDATE workers w SET stopped_at = clock_timestamp()
        WHERE w.stopped_at IS NULL AND NOT EXISTS (
            SELECT 1 FROM pg_locks l
            WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
              AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND l.classid = %s::oid AND l.objid = w.lock_key::oid
        )
        RETURNING w.id
        """,
        (WORKER_LOCK_NAMESPACE,),
    )
    return [row["id"] for row in await cur.fetchall()]


async def next_peer(conn: Connection, worker_id: str) -> int | None:
    """The liveness key of the live worker after this one in key order, wrapping around: each
    worker watches one peer, and every worker is watched by one."""
    cur = await conn.execute(
        """
        SELECT lock_key FROM workers
        WHERE stopped_at IS NULL AND id <> %(id)s
        ORDER BY lock_key <= (SELECT lock_key FROM workers WHERE id = %(id)s), lock_key
        LIMIT 1
        """,
        {"id": worker_id},
    )
    row = await cur.fetchone()
    return int(row["lock_key"]) if row else None


async def await_death(conn: Connection, key: int) -> None:
    """Block until the liveness lock `key` is free, which happens the instant its holder's
    connection ends; then let go at once (a lock held here would make the dead worker look
    alive to `reap_dead_workers`)."""
    await conn.execute("SELECT pg_advisory_lock_shared(%s, %s)", (WORKER_LOCK_NAMESPACE, key))
    await conn.execute("SELECT pg_advisory_unlock_shared(%s, %s)", (WORKER_LOCK_NAMESPACE, key))


async def reap_and_wake(conn: Connection) -> list[str]:
    """Reap dead workers and, if there were any, wake every worker to claim their sessions."""
    dead = await reap_dead_workers(conn)
    if dead:
        await notify(conn, WORK_KEY)
    return dead


# One statement a beat. Leases whose rows are locked right now (a write of the run's own, a
# cancel) are skipped, not waited for: they are still held, and the next beat renews them.
# Waiting would put every lease the worker holds behind the slowest lock on any one of them.
_HEARTBEAT_SQL = """
    WITH beat AS (
        UPDATE workers SET heartbeat_at = clock_timestamp() WHERE id = %(worker)s
    ), renewed AS (
        UPDATE sessions s SET lease_expires_at = clock_timestamp() + make_interval(secs => %(ttl)s)
        FROM (SELECT id FROM sessions
              WHERE id = ANY(%(held)s::uuid[]) AND lease_worker_id = %(worker)s
                AND lease_expires_at > clock_timestamp()
              FOR UPDATE SKIP LOCKED) mine
        WHERE s.id = mine.id
        RETURNING s.id
    )
    SELECT s.id, s.cancel_requested_at IS NOT NULL AS cancel FROM sessions s
    WHERE s.id = ANY(%(held)s::uuid[]) AND s.lease_worker_id = %(worker)s
      AND (s.lease_expires_at > clock_timestamp() OR s.id IN (SELECT id FROM renewed))
"""


async def heartbeat(
    conn: Connection, worker_id: str, ttl: float, session_ids: list[UUID]
) -> dict[UUID, bool]:
    """Record the beat and extend this worker's leases; {session id: cancel requested} for
    those still held."""
    cur = await conn.execute(_HEARTBEAT_SQL, {"worker": worker_id, "ttl": ttl, "held": session_ids})
    return {row["id"]: bool(row["cancel"]) for row in await cur.fetchall()}


# Every branch implies the `sessions_claimable` index's predicate (status queued or running), so
# a claim reads that index in creation order, never the finished sessions (tests/test_claim.py).
#
# One statement, so one round trip and no transaction around it: it takes up to %(limit)s
# sessions, numbers their `session_status` owner events (each owner's cursor moves once, by its
# count, so the cursor row is locked for the statement only, not across round trips; cursors are
# locked in owner order, so two claims of several owners cannot deadlock), sends the
# owner streams' notifications, and counts each session's claims since its last `session_end`
# (what `maxAttempts` bounds: `attempt` itself only grows, since it fences, so follow-ups that
# re-queue a finished session do not use up the budget).
CLAIM_SQL = f"""
    WITH candidate AS (
        SELECT s.id FROM sessions s
        WHERE EXISTS (SELECT 1 FROM workers me
                      WHERE me.id = %(worker)s AND me.stopped_at IS NULL)
          AND s.id <> ALL(%(busy)s::uuid[])
          AND ((s.status = 'queued' AND s.deleted_at IS NULL)
           OR (s.status = 'running' AND (
                s.lease_worker_id IS NULL
                OR s.lease_expires_at < clock_timestamp()
                OR EXISTS (SELECT 1 FROM workers w
                           WHERE w.id = s.lease_worker_id AND w.stopped_at IS NOT NULL))))
        ORDER BY s.created_at
        LIMIT %(limit)s
        FOR UPDATE OF s SKIP LOCKED
    ), claimed AS (
        UPDATE sessions s SET
            status = 'running', attempt = s.attempt + 1,
            lease_worker_id = %(worker)s, lease_pid = %(pid)s,
            lease_expires_at = clock_timestamp() + make_interval(secs => %(ttl)s),
            updated_at = clock_timestamp()
        FROM candidate WHERE s.id = candidate.id
        RETURNING {", ".join("s." + c.strip() for c in SESSION_COLUMNS.split(","))}
    ), cursor AS (
        INSERT INTO owner_cursors AS c (owner_id, last_id)
        SELECT owner_id, count(*) FROM claimed GROUP BY owner_id ORDER BY owner_id
        ON CONFLICT (owner_id) DO UPDATE SET last_id = c.last_id + excluded.last_id
        RETURNING owner_id, last_id, {notifying("%(owner_prefix)s || c.owner_id")} AS notified
    ), announced AS (
        INSERT INTO owner_events (owner_id, id, session_id, type, data)
        SELECT s.owner_id,
               c.last_id - count(*) OVER owner
                   + row_number() OVER (owner ORDER BY s.created_at, s.id),
               s.id, '{OwnerEventType.SESSION_STATUS}',
               jsonb_build_object('status', 'running', 'attempt', s.attempt)
        FROM claimed s JOIN cursor c ON c.owner_id = s.owner_id
        WINDOW owner AS (PARTITION BY s.owner_id)
    )
    SELECT s.*, s.attempt - coalesce((
        SELECT e.attempt FROM session_events e
        WHERE e.session_id = s.id AND e.type = '{SessionEventType.SESSION_END}'
        ORDER BY e.seq DESC LIMIT 1), 0) AS claims
    FROM claimed s ORDER BY s.created_at
"""


async def claim(
    conn: Connection,
    worker_id: str,
    pid: int,
    ttl: float,
    busy: Collection[UUID] = (),
    limit: int = 1,
) -> list[dict[str, Any]]:
    """Claim up to `limit` sessions: queued ones, or running ones whose lease expired, was
    released, or whose worker is dead. Adds 1 to each `attempt`; times come from the database
    clock. Each row carries `claims`, the claims since a run last closed with `session_end`
    (counting this one).

    `busy`: the sessions this worker still has a run of (one that lost its lease and has not
    noticed yet): it must not take them back before that run is gone, or the two would share
    the worker's one slot and heartbeat for that session.

    A worker itself marked dead (its liveness lock is gone, e.g. its heartbeat connection died
    with a database restart) claims nothing until its heartbeat registers it again: otherwise
    it would take back its own sessions claim after claim, each spending an attempt."""
    params = {
        "worker": worker_id,
        "pid": pid,
        "ttl": ttl,
        "busy": list(busy),
        "limit": limit,
        "owner_prefix": OWNER_KEY_PREFIX,
    }
    cur = await conn.execute(CLAIM_SQL, params)
    return await cur.fetchall()


async def append(
    conn: Connection,
    fence: Fence,
    session_id: UUID,
    type_: str,
    data: dict[str, Any],
    *,
    delivered: int | None = None,
    tokens: tuple[int, int, int] | None = None,
    stage: str | None = None,
) -> dict[str, Any]:
    """A fenced run event (FenceRefused once the lease is gone). In the same statement, on the
    session row: `delivered`, the log the model has seen up to (undelivered messages re-queue);
    `tokens`, a turn's (input, output, cached) added to the running totals; `stage`, the
    run's new active stage (announce it on the owner feed too)."""
    sets: list[str] = []
    params: dict[str, Any] = {}
    if delivered is not None:
        sets.append("delivered_seq = greatest(delivered_seq, %(delivered)s)")
        params["delivered"] = delivered
    if tokens is not None:
        sets.append(
            "input_tokens = input_tokens + %(input)s, output_tokens = output_tokens + %(output)s,"
            " cached_tokens = cached_tokens + %(cached)s"
        )
        params.update(zip(("input", "output", "cached"), tokens, strict=True))
    if stage is not None:
        sets.append("active_stage = %(stage)s")
        params["stage"] = stage
    return await append_session_event(
        conn,
        session_id,
        type_,
        data,
        fence=fence,
        session_sets="".join(f", {assignment}" for assignment in sets),
        **params,
    )


async def announce(
    conn: Connection, row: dict[str, Any], type_: OwnerEventType, data: dict[str, Any]
) -> None:
    """An owner event about a run (written in the same transaction as a fenced write)."""
    await append_owner_event(conn, row["owner_id"], row["id"], type_, data)


async def _fenced_update(
    conn: Connection, fence: Fence, session_id: UUID, assignments: str, **params: Any
) -> None:
    """`UPDATE sessions SET <assignments>` for the lease holder only (FenceRefused otherwise)."""
    cur = await conn.execute(
        f"UPDATE sessions SET {assignments} WHERE id = %(session_id)s AND {FENCE} RETURNING id",
        {**params, **fence.params(), "session_id": session_id},
    )
    if await cur.fetchone() is None:
        raise FenceRefused(f"lease on {session_id} is no longer held by {fence}")


async def mark_delivered(conn: Connection, fence: Fence, session_id: UUID, seq: int) -> None:
    """Record that the model has seen the log up to `seq` (undelivered messages re-queue)."""
    await _fenced_update(
        conn, fence, session_id, "delivered_seq = greatest(delivered_seq, %(seq)s)", seq=seq
    )


async def undelivered_messages(conn: Connection, session_id: UUID) -> int:
    """Follow-ups and approval decisions logged after the run last took in the log."""
    cur = await conn.execute(
        """
        SELECT count(*) AS n FROM session_events e JOIN sessions s ON s.id = e.session_id
        WHERE e.session_id = %s AND e.type IN ('user_message', 'tool_approval_decided')
          AND e.seq > s.delivered_seq
        """,
        (session_id,),
    )
    row = await cur.fetchone()
    return int(row["n"]) if row else 0


async def finish(
    conn: Connection,
    fence: Fence,
    row: dict[str, Any],
    status: Status,
    *,
    error: dict[str, Any] | None = None,
    note: str | None = None,
    requeue_undelivered: bool = True,
) -> Status | None:
    """Close the run: `session_end`, the new status, the lease released.

    A cancel accepted before this commits wins: the row lock orders the two, so a cancel
    either finds the session terminal (409) or the session ends `cancelled`, never both.

    The same lock orders follow-ups (`post_message` locks the row too). One that came in
    during the run and never reached the model keeps the run going when it would end
    `succeeded` or `waiting`: None, nothing written, the caller delivers it. After a failure
    it re-queues the session (announced after the failure), unless `requeue_undelivered` is
    False.
    """
    cur = await conn.execute(
        f"SELECT cancel_requested_at IS NOT NULL AS cancel, {FENCE} AS held FROM sessions"
        " WHERE id = %(session_id)s FOR UPDATE",
        {**fence.params(), "session_id": row["id"]},
    )
    locked = await cur.fetchone()
    if locked is None or not locked["held"]:
        raise FenceRefused(f"lease on {row['id']} is no longer held by {fence}")
    if locked["cancel"] and status != Status.FAILED:
        status, error, requeue_undelivered = Status.CANCELLED, None, False
    pending = requeue_undelivered and await undelivered_messages(conn, row["id"]) > 0
    if pending and status in (Status.SUCCEEDED, Status.WAITING):
        return None
    end: dict[str, Any] = {"status": str(status)}
    if error is not None:
        end["error"] = error
    if note is not None:
        end["note"] = note
    await append(conn, fence, row["id"], SessionEventType.SESSION_END, end)
    await set_status(
        conn,
        row,
        status,
        error=error,
        extra_sets=", lease_worker_id = NULL, lease_pid = NULL, lease_expires_at = NULL"
        ", active_stage = NULL",
    )
    if pending and status == Status.FAILED:
        await set_status(conn, row, Status.QUEUED)
        await notify(conn, WORK_KEY)
        return Status.QUEUED
    return status


async def release(conn: Connection, fence: Fence, row: dict[str, Any], reason: str) -> None:
    """Give the session up mid-run (shutdown): `session_interrupted`, lease cleared, status
    left `running` so the next claim takes it over at once."""
    await append(conn, fence, row["id"], SessionEventType.SESSION_INTERRUPTED, {"reason": reason})
    await conn.execute(
        "UPDATE sessions SET lease_worker_id = NULL, lease_pid = NULL, lease_expires_at = NULL"
        " WHERE id = %s AND attempt = %s",
        (row["id"], fence.attempt),
    )
    await notify(conn, WORK_KEY)


async def cancel_requested(conn: Connection, session_id: UUID) -> bool:
    cur = await conn.execute(
        "SELECT cancel_requested_at IS NOT NULL AS c FROM sessions WHERE id = %s", (session_id,)
    )
    row = await cur.fetchone()
    return bool(row and row["c"])


async def put_note(conn: Connection, fence: Fence, session_id: UUID, key: str, text: str) -> None:
    """Upsert a note, fenced: the session row is share-locked and checked in the statement."""
    cur = await conn.execute(
        f"""
        INSERT INTO notes (session_id, key, text, attempt)
        SELECT id, %(key)s, %(text)s, attempt FROM sessions
        WHERE id = %(id)s AND {FENCE}
        FOR SHARE
        ON CONFLICT (session_id, key) DO UPDATE
            SET text = excluded.text, attempt = excluded.attempt, updated_at = clock_timestamp()
        RETURNING key
        """,
        {"id": session_id, "key": key, "text": text, **fence.params()},
    )
    if await cur.fetchone() is None:
        raise FenceRefused(f"lease on {session_id} lost")


async def get_note(conn: Connection, session_id: UUID, key: str) -> str | None:
    cur = await conn.execute(
        "SELECT text FROM notes WHERE session_id = %s AND key = %s", (session_id, key)
    )
    row = await cur.fetchone()
    return row["text"] if row else None
