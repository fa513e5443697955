"""The per-owner and per-key limits' statements (docs/tenants.md "Limits"): each is one
statement, run only when its limit is set."""

from __future__ import annotations

from typing import Any

from app.db.pool import Connection
from app.domain import Status
from app.store.statements import statement

# The label of the owners past the top ones in /metrics.
OTHER_OWNERS = "other"

# A fixed one-minute window per subject (a key, or an owner without one) and action: the
# window's count, and the seconds until the next window opens.
_COUNT_RATE = statement(
    "count_rate",
    """
    INSERT INTO rate_windows AS r (subject, action, window_start, count)
    VALUES (%(subject)s, %(action)s, date_trunc('minute', clock_timestamp()), 1)
    ON CONFLICT (subject, action) DO UPDATE SET
        count = CASE WHEN r.window_start = EXCLUDED.window_start THEN r.count + 1 ELSE 1 END,
        window_start = EXCLUDED.window_start
    RETURNING count,
        ceil(extract(epoch FROM window_start + interval '1 minute' - clock_timestamp()))::integer
            AS retry_after
    """,
)
# How many sessions the owner has queued, counted up to `limit` (the index
# `sessions_owner_active` holds them).
_QUEUED = statement(
    "owner_queued",
    f"""
    SELECT count(*) AS queued FROM (
        SELECT 1 FROM sessions
        WHERE owner_id = %(owner)s AND status = '{Status.QUEUED}' AND deleted_at IS NULL
        LIMIT %(limit)s) q
    """,
)


_RUNNING = statement(
    "owner_running",
    f"SELECT count(*) AS running FROM sessions WHERE owner_id = %s AND status = '{Status.RUNNING}'",
)
# The queue per owner for /metrics: the owners with the most queued sessions, and how long the
# one queued longest has been so (since its last change), the rest summed up as `other`.
_QUEUES = statement(
    "owner_queues_top",
    f"""
    WITH q AS (
        SELECT owner_id, count(*) AS depth,
               extract(epoch FROM clock_timestamp() - min(updated_at)) AS oldest
        FROM sessions WHERE status = '{Status.QUEUED}' AND deleted_at IS NULL
        GROUP BY owner_id
    ), ranked AS (
        SELECT q.*, row_number() OVER (ORDER BY depth DESC, owner_id) AS rank FROM q
    )
    SELECT CASE WHEN rank <= %(top)s THEN owner_id ELSE '{OTHER_OWNERS}' END AS owner,
           sum(depth)::bigint AS depth, max(oldest)::float8 AS oldest
    FROM ranked GROUP BY 1
    """,
)


async def owner_running(conn: Connection, owner_id: str) -> int:
    """How many sessions the owner has running."""
    cur = await conn.execute(_RUNNING, (owner_id,))
    row = await cur.fetchone()
    assert row is not None
    return int(row["running"])


async def owner_queues(conn: Connection, top: int) -> list[dict[str, Any]]:
    """`{owner, depth, oldest}` of the `top` owners by queued sessions, and OTHER_OWNERS."""
    cur = await conn.execute(_QUEUES, {"top": top})
    return await cur.fetchall()


async def count_rate(conn: Connection, subject: str, action: str) -> tuple[int, int]:
    """Count one more `action` of `subject` in this minute: (the minute's count with it, the
    seconds until the next minute)."""
    cur = await conn.execute(_COUNT_RATE, {"subject": subject, "action": action})
    row = await cur.fetchone()
    assert row is not None
    return row["count"], max(1, row["retry_after"])


async def queued_at_least(conn: Connection, owner_id: str, limit: int) -> bool:
    """Whether the owner has `limit` sessions queued or more."""
    cur = await conn.execute(_QUEUED, {"owner": owner_id, "limit": limit})
    row = await cur.fetchone()
    assert row is not None
    return int(row["queued"]) >= limit
