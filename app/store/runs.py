"""What workers write: registration, claims, leases, fenced run events, settling, notes.

Every run write checks the fence `(workerId, attempt)` and an unexpired lease in the statement
that writes, so a worker that lost its lease writes nothing more.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from app.db.pool import Connection
from app.domain import OwnerEventType, SessionEventType, Status
from app.errors import FenceRefused
from app.store.events import FENCE, FENCED, Cursor, Fence, owner_event_ctes
from app.store.notify import (
    SESSION_KEY_PREFIX,
    STREAMS_CHANNEL,
    WORK_KEY,
    WORKERS_KEY,
    ephemeral_payloads,
    notify,
    notifying,
    session_key,
)
from app.store.sessions import SESSION_COLUMNS

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


# Every branch implies the `sessions_claimable` index's predicate (status queued or running), so
# a claim reads that index in creation order, never the finished sessions (tests/test_claim.py).
#
# One statement, so one round trip and no transaction around it: it takes up to %(limit)s
# sessions, appends their `session_status` owner events (`owner_event_ctes`: the cursor rows are
# locked for the statement only, not across round trips), and counts each session's claims
# since its last `session_end` (what `maxAttempts` bounds: `attempt` itself only grows, since
# it fences, so follow-ups that re-queue a finished session do not use up the budget).
#
# A session's first claim also logs its `session_start` (`started`): the run's start is durable
# and on its stream at once, without a write of the run's own before the model is first asked.
# Rows a statement inserts are invisible to its own reads, so the head gets that event appended,
# when the head reaches the event before it (else the run reads its log, which then has it).
CLAIM_SQL = f"""
    WITH candidate AS (
        SELECT s.id FROM sessions s
        WHERE EXISTS (SELECT 1 FROM workers me
                      WHERE me.id = %(worker)s AND me.stopped_at IS NULL)
          AND s.id <> ALL(%(busy)s::uuid[])
          AND (s.tools IS NULL OR s.tools <@ %(tools)s::jsonb)
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
            resumes = s.resumes + (s.status = 'running')::integer,
            last_seq = s.last_seq + (s.attempt = 0)::integer,
            lease_worker_id = %(worker)s, lease_pid = %(pid)s,
            lease_expires_at = clock_timestamp() + make_interval(secs => %(ttl)s),
            updated_at = clock_timestamp()
        FROM candidate WHERE s.id = candidate.id
        RETURNING {", ".join("s." + c.strip() for c in SESSION_COLUMNS.split(","))}
    ), started AS (
        INSERT INTO session_events (session_id, seq, attempt, type, data)
        SELECT s.id, s.last_seq, s.attempt, '{SessionEventType.SESSION_START}',
               jsonb_build_object('workerId', %(worker)s::text, 'pid', %(pid)s::integer,
                                  'attempt', s.attempt)
        FROM claimed s WHERE s.attempt = 1
        RETURNING session_id, seq, type, data,
            {notifying(f"'{SESSION_KEY_PREFIX}' || session_id")} AS notified
    ), {
    owner_event_ctes(
        "claimed",
        f"'{OwnerEventType.SESSION_STATUS}'",
        "jsonb_build_object('status', 'running', 'attempt', s.attempt, 'resumes', s.resumes)",
    )
}
    SELECT s.*, s.attempt - coalesce((
        SELECT e.attempt FROM session_events e
        WHERE e.session_id = s.id AND e.type = '{SessionEventType.SESSION_END}'
        ORDER BY e.seq DESC LIMIT 1), 0) AS claims,
      CASE WHEN st.seq IS NULL THEN h.events
           WHEN coalesce(h.last, 0) = st.seq - 1 THEN coalesce(h.events, '[]'::jsonb)
               || jsonb_build_array(jsonb_build_object('seq', st.seq, 'type', st.type,
                                                       'data', st.data))
      END AS head
    FROM claimed s
    LEFT JOIN started st ON st.session_id = s.id
    CROSS JOIN LATERAL (
        SELECT jsonb_agg(jsonb_build_object('seq', e.seq, 'type', e.type, 'data', e.data)
                         ORDER BY e.seq) AS events,
               max(e.seq) AS last
        FROM (SELECT seq, type, data, sum(size) OVER (ORDER BY seq) AS upto
              FROM session_events WHERE session_id = s.id ORDER BY seq LIMIT %(head_events)s) e
        WHERE e.upto <= %(head_bytes)s) h
    ORDER BY s.created_at
"""
# The start of each claimed session's log the claim brings along (`head`), at most this many
# events and bytes of data: a new session's whole log, so its run need not read it again.
CLAIM_HEAD_EVENTS = 50
CLAIM_HEAD_BYTES = 64 * 1024


def claim_params(
    worker_id: str,
    pid: int,
    ttl: float,
    busy: Collection[UUID],
    limit: int,
    tools: Collection[str] = (),
) -> dict[str, Any]:
    """The parameters of CLAIM_SQL."""
    return {
        "worker": worker_id,
        "pid": pid,
        "ttl": ttl,
        "busy": list(busy),
        "limit": limit,
        "tools": Jsonb(list(tools)),
        "head_events": CLAIM_HEAD_EVENTS,
        "head_bytes": CLAIM_HEAD_BYTES,
    }


async def claim(
    conn: Connection,
    worker_id: str,
    pid: int,
    ttl: float,
    busy: Collection[UUID] = (),
    limit: int = 1,
    tools: Collection[str] = (),
) -> list[dict[str, Any]]:
    """Claim up to `limit` sessions: queued ones, or running ones whose lease expired, was
    released, or whose worker is dead. Adds 1 to each `attempt`, and logs `session_start` for a
    session's first; times come from the database clock. Each row carries `claims`, the claims
    since a run last closed with `session_end` (counting this one), and `head`, the start of
    its log as a list of `{seq, type, data}` (CLAIM_HEAD_EVENTS, CLAIM_HEAD_BYTES; it may stop
    short of `last_seq`: the claim's snapshot may predate an event written just before it took
    the lock).

    `busy`: the sessions this worker still has a run of (one that lost its lease and has not
    noticed yet): it must not take them back before that run is gone, or the two would share
    the worker's one slot and heartbeat for that session.

    `tools`: the names of the tools this worker offers. A session that names tools is claimed
    only by a worker that offers every one of them; one that names none (all tools) by any.
    A claim that takes a running session over from a run that did not finish (its lease expired
    or was released, its worker died) adds 1 to its `resumes`.

    A worker itself marked dead (its liveness lock is gone, e.g. its heartbeat connection died
    with a database restart) claims nothing until its heartbeat registers it again: otherwise
    it would take back its own sessions claim after claim, each spending an attempt."""
    params = claim_params(worker_id, pid, ttl, busy, limit, tools)
    cur = await conn.execute(CLAIM_SQL, params)
    return await cur.fetchall()


@dataclass
class Batch:
    """A run's writes not sent yet, sent as one fenced statement (`send_batch`): its events in
    order, changes to the session row, owner events about it, the session's notes the run's
    tools wrote, and frames that are not logged (token deltas), notified before the events
    they precede."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    owner_events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    ephemerals: list[tuple[str, str]] = field(default_factory=list)
    # Session row changes: column -> SQL expression, with the parameters they name.
    assignments: dict[str, str] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    # Notes by key (the last text put wins).
    notes: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(
            self.events or self.owner_events or self.ephemerals or self.assignments or self.notes
        )

    def add(self, type_: str, data: dict[str, Any]) -> None:
        self.events.append((type_, data))

    def announce(self, type_: str, data: dict[str, Any]) -> None:
        self.owner_events.append((type_, data))

    def deliver(self, seq: int) -> None:
        """The model has seen the log up to `seq` (undelivered messages re-queue)."""
        self.params["delivered"] = max(seq, self.params.get("delivered", seq))
        self.assignments["delivered_seq"] = "greatest(delivered_seq, %(delivered)s)"

    def delivered(self) -> int | None:
        delivered: int | None = self.params.get("delivered")
        return delivered

    def count_tokens(self, input_: int, output: int, cached: int) -> None:
        """A turn's tokens, added to the session's running totals."""
        for column, tokens in (("input", input_), ("output", output), ("cached", cached)):
            self.params[column] = self.params.get(column, 0) + tokens
            self.assignments[f"{column}_tokens"] = f"{column}_tokens + %({column})s"

    def put_note(self, key: str, text: str) -> None:
        self.notes[key] = text

    def set_stage(self, stage: str | None) -> None:
        self.params["stage"] = stage
        self.assignments["active_stage"] = "%(stage)s"

    def copy(self) -> Batch:
        return Batch(
            list(self.events),
            list(self.owner_events),
            list(self.ephemerals),
            dict(self.assignments),
            dict(self.params),
            dict(self.notes),
        )


# The notifications go together, in order: the turn's last token deltas, then the stream's key
# (a stream gets a turn's last deltas before the message, which it reads from the log), and only
# if the session row was written. JSON arrays go in binary (`%b`): in text, psycopg escapes every
# quote in them with a regex.
_BATCH_SQL = """
    WITH bumped AS (
        UPDATE sessions SET last_seq = last_seq + %(n)s, updated_at = clock_timestamp(){sets}
        WHERE id = %(session_id)s AND {fenced}{conditions}
        RETURNING id, owner_id, last_seq, attempt
    ), appended AS (
        INSERT INTO session_events (session_id, seq, attempt, type, data)
        SELECT b.id, b.last_seq - %(n)s + e.ord, b.attempt, e.type, e.data
        FROM bumped b,
             unnest(%(types)s::text[], %(datas)b::jsonb[]) WITH ORDINALITY AS e(type, data, ord)
        RETURNING seq
    ), noted AS (
        INSERT INTO notes (session_id, key, text, attempt)
        SELECT b.id, n.key, n.text, b.attempt
        FROM bumped b, unnest(%(note_keys)b::text[], %(note_texts)b::text[]) AS n(key, text)
        ON CONFLICT (session_id, key) DO UPDATE
            SET text = excluded.text, attempt = excluded.attempt, updated_at = clock_timestamp()
    ), notified AS MATERIALIZED (
        SELECT count(pg_notify('{channel}', payload)) AS n
        FROM unnest(%(payloads)b::text[] || %(notify_key)s::text) AS payload
        WHERE EXISTS (SELECT FROM bumped)
    ), owner_rows AS (
        SELECT b.owner_id, b.id, o.ord, o.type, o.data
        FROM bumped b,
             unnest(%(owner_types)s::text[], %(owner_datas)b::jsonb[])
                 WITH ORDINALITY AS o(type, data, ord)
    ), {owner_events}
    SELECT (SELECT count(*) FROM bumped) AS written, (SELECT max(seq) FROM appended) AS seq,
           (SELECT n FROM notified) AS notified
"""


async def send_batch(
    conn: Connection, fence: Fence, session_id: UUID, batch: Batch, *, conditions: str = ""
) -> Cursor:
    """Write `batch` in one statement, fenced: the database refuses it (`events.fence_errors`)
    once the lease is gone. `conditions` (`AND ...` on the session row, with the batch's
    params): write nothing unless they hold. The returned cursor's row says whether it was
    `written` and the `seq` of its last event (in a pipelined transaction: once that ended)."""
    sets = "".join(f", {column} = {value}" for column, value in batch.assignments.items())
    query = _BATCH_SQL.format(
        channel=STREAMS_CHANNEL,
        sets=sets,
        fenced=FENCED,
        conditions=conditions,
        owner_events=owner_event_ctes("owner_rows", "s.type", "s.data", order="s.ord"),
    )
    params = {
        **batch.params,
        **fence.params(),
        "session_id": session_id,
        "notify_key": session_key(session_id),
        "payloads": ephemeral_payloads(batch.ephemerals),
        "n": len(batch.events),
        "types": [type_ for type_, _ in batch.events],
        "datas": [Jsonb(data) for _, data in batch.events],
        "owner_types": [type_ for type_, _ in batch.owner_events],
        "owner_datas": [Jsonb(data) for _, data in batch.owner_events],
        "note_keys": list(batch.notes),
        "note_texts": list(batch.notes.values()),
    }
    return await conn.execute(query, params)


# Follow-ups and approval decisions the model has not seen: logged after `{after}` and after the
# session's `delivered_seq` (of the session row `sessions`).
_UNDELIVERED = (
    "SELECT FROM session_events e WHERE e.session_id = sessions.id"
    " AND e.type IN ('user_message', 'tool_approval_decided')"
    " AND e.seq > greatest(sessions.delivered_seq, {after})"
)


async def _send_undelivered_count(
    conn: Connection, session_id: UUID, delivered: int | None
) -> Cursor:
    """Count the follow-ups and approval decisions logged after what the model has seen: the
    session's `delivered_seq`, or `delivered` if that is further (`_count` reads it)."""
    return await conn.execute(
        f"SELECT count(*) AS n FROM sessions, LATERAL ({_UNDELIVERED.format(after='%s')}) e"
        " WHERE sessions.id = %s",
        (delivered or 0, session_id),
    )


async def _count(cur: Cursor) -> int:
    row = await cur.fetchone()
    return int(row["n"]) if row else 0


@dataclass(eq=False)  # compared by identity: two writes are never the same write
class Write:
    """A run's `send_batch`, ready to send: alone, or with other runs' (`send_writes`)."""

    fence: Fence
    session_id: UUID
    batch: Batch
    # `AND ...` on the session row, with the batch's params: write nothing unless they hold.
    conditions: str = ""

    async def send(self, conn: Connection) -> Cursor:
        return await send_batch(
            conn, self.fence, self.session_id, self.batch, conditions=self.conditions
        )


# Every writer locks a session's row before any owner's cursor row (a write's `bumped` comes
# first; cancels and follow-ups lock the session, then announce). Several runs' writes in one
# transaction lock all their session rows first, in id order, so no two transactions can each
# hold what the other waits for.
_LOCK_SESSIONS = "SELECT FROM sessions WHERE id = ANY(%s) ORDER BY id FOR UPDATE"


async def send_writes(conn: Connection, writes: list[Write]) -> list[Cursor]:
    """Several runs' writes in the caller's transaction (pipelined: one round trip for all).
    Each owner's cursor row is then locked once for all of them, not once a write."""
    await conn.execute(_LOCK_SESSIONS, ([write.session_id for write in writes],))
    return [await write.send(conn) for write in writes]


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
    batch = _closing(batch, fence, status, status, error, note)
    batch.params["expected_last_seq"] = last_seq
    conditions = (
        " AND last_seq = %(expected_last_seq)s AND cancel_requested_at IS NULL"
        f" AND NOT EXISTS ({_UNDELIVERED.format(after='%(delivered_or_zero)s')})"
    )
    batch.params["delivered_or_zero"] = batch.delivered() or 0
    return Write(fence, row["id"], batch, conditions)


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

    A cancel accepted before this commits wins: the row lock orders the two, so a cancel
    either finds the session terminal (409) or the session ends `cancelled`, never both.

    The same lock orders follow-ups (`post_message` locks the row too). One that came in
    during the run and never reached the model keeps the run going when it would end
    `succeeded` or `waiting`: None, only `batch` written, the caller delivers it. After a
    failure it re-queues the session (announced after the failure), unless
    `requeue_undelivered` is False.
    """
    cur = await conn.execute(
        f"SELECT cancel_requested_at IS NOT NULL AS cancel, {FENCE} AS held FROM sessions"
        " WHERE id = %(session_id)s FOR UPDATE",
        {**fence.params(), "session_id": row["id"]},
    )
    # Sent before the lock's answer is read (one round trip for both in a pipeline); after it
    # on the server, so it sees any follow-up committed while the lock was awaited.
    undelivered = await _send_undelivered_count(conn, row["id"], batch.delivered())
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
    return settled, await send_batch(conn, fence, row["id"], closing)


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
    batch.params.update(status=str(settled), error=Jsonb(error) if error is not None else None)
    batch.assignments.update(
        status="%(status)s",
        error="%(error)s",
        lease_worker_id="NULL",
        lease_pid="NULL",
        lease_expires_at="NULL",
        active_stage="NULL",
    )
    return batch


async def release(
    conn: Connection, fence: Fence, row: dict[str, Any], reason: str, batch: Batch
) -> Cursor:
    """Give the session up mid-run (shutdown) with what `batch` holds: `session_interrupted`,
    lease cleared, status left `running` so the next claim takes it over at once. Returns
    `send_batch`'s cursor."""
    batch = batch.copy()
    batch.add(SessionEventType.SESSION_INTERRUPTED, {"reason": reason})
    batch.assignments.update(lease_worker_id="NULL", lease_pid="NULL", lease_expires_at="NULL")
    sent = await send_batch(conn, fence, row["id"], batch)
    await notify(conn, WORK_KEY)
    return sent


async def cancel_requested(conn: Connection, session_id: UUID) -> bool:
    cur = await conn.execute(
        "SELECT cancel_requested_at IS NOT NULL AS c FROM sessions WHERE id = %s", (session_id,)
    )
    row = await cur.fetchone()
    return bool(row and row["c"])


async def get_note(conn: Connection, session_id: UUID, key: str) -> str | None:
    cur = await conn.execute(
        "SELECT text FROM notes WHERE session_id = %s AND key = %s", (session_id, key)
    )
    row = await cur.fetchone()
    return row["text"] if row else None
