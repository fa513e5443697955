"""Retention: prune old owner events, purge soft-deleted sessions and stale idempotency keys."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from app.db.pool import Connection


@dataclass(frozen=True)
class Pruned:
    owner_events: int
    sessions: int
    idempotency_keys: int


async def prune(
    conn: Connection,
    *,
    owner_events_older_than: timedelta,
    deleted_sessions_older_than: timedelta,
    idempotency_keys_older_than: timedelta,
) -> Pruned:
    """Delete what retention allows. A reader whose cursor falls before what is left gets
    `resync_required {reason: "expired"}`. The newest event of each owner is kept, so the
    oldest retained id always tells a reader whether it missed pruned events."""
    owner_events = await conn.execute(
        """
        DELETE FROM owner_events e USING owner_cursors c
        WHERE e.owner_id = c.owner_id AND e.id < c.last_id
          AND e.created_at < clock_timestamp() - %s
        """,
        (owner_events_older_than,),
    )
    sessions = await conn.execute(
        "DELETE FROM sessions WHERE deleted_at < clock_timestamp() - %s",
        (deleted_sessions_older_than,),
    )
    keys = await conn.execute(
        "DELETE FROM idempotency_keys WHERE created_at < clock_timestamp() - %s",
        (idempotency_keys_older_than,),
    )
    return Pruned(owner_events.rowcount, sessions.rowcount, keys.rowcount)
