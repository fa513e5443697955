"""Worker liveness: registration under an advisory lock held for the connection's life, the
heartbeat that renews a worker's leases, and the death watch's looks at its peers' locks."""

from __future__ import annotations

from uuid import UUID

from app.db.pool import Connection
from app.store.notify import WORK_KEY, WORKERS_KEY, notify

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


async def liveness_lock_free(conn: Connection, key: int) -> bool:
    """Whether the liveness lock `key` is free, which it is the instant its holder's connection
    ends: taken shared and let go in one statement that waits for nothing. (A statement blocked
    on the lock would hold its snapshot for as long as it waited, and with it every row version
    deleted meanwhile in the whole database: no HOT pruning, no vacuum.)"""
    cur = await conn.execute(
        "SELECT CASE WHEN pg_try_advisory_lock_shared(%(ns)s, %(key)s)"
        " THEN pg_advisory_unlock_shared(%(ns)s, %(key)s) ELSE false END AS free",
        {"ns": WORKER_LOCK_NAMESPACE, "key": key},
    )
    row = await cur.fetchone()
    return bool(row and row["free"])


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
