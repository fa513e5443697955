"""Claims: a worker takes up to a batch of sessions (queued, or running under a lease that is
gone) in one statement, which also announces them and logs a first run's `session_start`.
It has one form: how many sessions it takes is a parameter (`%(limit)s`)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from app.db.pool import Connection
from app.domain import OwnerEventType, SessionEventType, Status
from app.store.events import owner_event_ctes
from app.store.notify import SESSION_KEY_PREFIX, notifying
from app.store.sessions import SESSION_COLUMNS
from app.store.statements import statement

# Every branch implies the `sessions_claimable` index's predicate (status queued or running), so
# a claim reads that index in the order of the sessions' priorities (highest first) and claim
# keys, never the finished sessions (tests/test_claim.py). The keys are fair across owners:
# each owner's queued sessions are spaced out on its own clock, one per priority
# (alembic/versions/0016_fair_claims.py, 0022_priority_limits.py, docs/fairness.md).
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
_CLAIM = f"""
    WITH {{running}}candidate AS (
        SELECT s.id{{candidate_columns}} FROM sessions s
        WHERE EXISTS (SELECT 1 FROM workers me
                      WHERE me.id = %(worker)s AND me.stopped_at IS NULL)
          AND s.id <> ALL(%(busy)s::uuid[])
          AND (s.tools IS NULL OR s.tools <@ %(tools)s::jsonb){{owner_limit}}
          AND ((s.status = 'queued' AND s.deleted_at IS NULL)
           OR (s.status = 'running' AND (
                s.lease_worker_id IS NULL
                OR s.lease_expires_at < clock_timestamp()
                OR EXISTS (SELECT 1 FROM workers w
                           WHERE w.id = s.lease_worker_id AND w.stopped_at IS NOT NULL))))
        ORDER BY s.priority DESC, s.claim_key
        LIMIT %(limit)s
        FOR UPDATE OF s SKIP LOCKED
    ), {{picked}}claimed AS (
        UPDATE sessions s SET
            status = 'running', attempt = s.attempt + 1,
            resumes = s.resumes + (s.status = 'running')::integer,
            last_seq = s.last_seq + (s.attempt = 0)::integer,
            lease_worker_id = %(worker)s, lease_pid = %(pid)s,
            lease_expires_at = clock_timestamp() + make_interval(secs => %(ttl)s),
            updated_at = clock_timestamp()
        FROM {{source}} c WHERE s.id = c.id
        RETURNING {", ".join("s." + c.strip() for c in SESSION_COLUMNS.split(","))}, s.claim_key
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
    ORDER BY s.priority DESC, s.claim_key
"""
CLAIM_SQL = statement(
    "claim",
    _CLAIM.replace("{running}", "")
    .replace("{candidate_columns}", "")
    .replace("{owner_limit}", "")
    .replace("{picked}", "")
    .replace("{source}", "candidate"),
)
# With FERRYMAN_OWNER_MAX_RUNNING: a queued session of an owner that has that many running is
# passed over (the scan goes on to other owners' sessions; a takeover of a running one is not
# held back). The running sessions are counted once a statement (`running`: as many as the
# workers' slots), whatever plan reads the queued ones. Of the candidates, an owner's queued
# ones are taken only as far as its free places go (`picked`), so one batch never takes more
# than an owner's limit. Run under CLAIM_LOCK, in a transaction whose statement before took
# it (so this one's snapshot sees every claim before it): no two claims count the same
# owner's sessions at once.
CLAIM_LIMITED_SQL = statement(
    "claim_owner_limited",
    _CLAIM.replace(
        "{running}",
        f"""running AS (
        SELECT r.owner_id, count(*) AS running FROM sessions r
        WHERE r.status = '{Status.RUNNING}' GROUP BY r.owner_id
    ), """,
    )
    .replace("{candidate_columns}", ", s.owner_id, s.status, s.priority, s.claim_key")
    .replace(
        "{owner_limit}",
        f"""
          AND (s.status <> '{Status.QUEUED}' OR s.owner_id NOT IN (
                SELECT owner_id FROM running WHERE running >= %(max_running)s))""",
    )
    .replace(
        "{picked}",
        f"""picked AS (
        SELECT c.id FROM (
            SELECT c.id, c.status, coalesce(r.running, 0) + count(*)
                       FILTER (WHERE c.status = '{Status.QUEUED}')
                       OVER (PARTITION BY c.owner_id ORDER BY c.priority DESC, c.claim_key
                             ROWS UNBOUNDED PRECEDING) AS place
            FROM candidate c LEFT JOIN running r ON r.owner_id = c.owner_id) c
        WHERE c.status <> '{Status.QUEUED}' OR c.place <= %(max_running)s
    ), """,
    )
    .replace("{source}", "picked"),
)
# The claims with an owner limit take turns across all workers: a transaction's lock.
CLAIM_LOCK = statement("claim_lock", "SELECT pg_advisory_xact_lock(7465726430)")
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
    max_running: int | None = None,
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
    it would take back its own sessions claim after claim, each spending an attempt.

    `max_running` (FERRYMAN_OWNER_MAX_RUNNING): no queued session is claimed of an owner that
    has this many running. Such claims take turns across workers (CLAIM_LOCK, held by one
    transaction, whose claim statement sees what the claims before it did), so two claims
    never both take an owner's last free place, and one claim takes no more than the places
    an owner has free."""
    params = claim_params(worker_id, pid, ttl, busy, limit, tools)
    if max_running is None:
        cur = await conn.execute(CLAIM_SQL, params)
        return await cur.fetchall()
    # Pipelined: the lock and the claim go in one round trip, so the lock is held for as
    # short a time as can be.
    async with conn.pipeline(), conn.transaction():
        await conn.execute(CLAIM_LOCK)
        cur = await conn.execute(CLAIM_LIMITED_SQL, {**params, "max_running": max_running})
    return await cur.fetchall()
