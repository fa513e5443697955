"""Retention: prune old owner events, purge soft-deleted sessions and stale idempotency keys."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import LiteralString

from app.db.pool import Database

# Rows one statement deletes, each batch its own transaction: a backlog of millions is deleted
# in statements that each end well within the statement timeout, and what one run deleted stays
# deleted when a later batch fails.
BATCH_ROWS = 5000
# How long one run goes on deleting; what is left waits for the next run.
TIME_BUDGET = 300.0

_OWNER_EVENTS = """
    DELETE FROM owner_events WHERE (owner_id, id) IN (
        SELECT e.owner_id, e.id FROM owner_events e JOIN owner_cursors c USING (owner_id)
        WHERE e.created_at < clock_timestamp() - %(age)s AND e.id < c.last_id
        ORDER BY e.created_at LIMIT %(rows)s
    )
"""
_SESSIONS = """
    DELETE FROM sessions WHERE id IN (
        SELECT id FROM sessions WHERE deleted_at < clock_timestamp() - %(age)s
        ORDER BY deleted_at LIMIT %(rows)s
    )
"""
_IDEMPOTENCY_KEYS = """
    DELETE FROM idempotency_keys WHERE (owner_id, key) IN (
        SELECT owner_id, key FROM idempotency_keys
        WHERE created_at < clock_timestamp() - %(age)s ORDER BY created_at LIMIT %(rows)s
    )
"""


@dataclass(frozen=True)
class Pruned:
    owner_events: int
    sessions: int
    idempotency_keys: int
    # False when the time budget ran out first: the next run deletes the rest.
    complete: bool = True


async def prune(
    db: Database,
    *,
    owner_events_older_than: timedelta,
    deleted_sessions_older_than: timedelta,
    idempotency_keys_older_than: timedelta,
    batch_rows: int = BATCH_ROWS,
    budget: float = TIME_BUDGET,
) -> Pruned:
    """Delete what retention allows, `batch_rows` at a time, for at most about `budget`
    seconds. A reader whose cursor falls before what is left gets `resync_required {reason:
    "expired"}`. The newest event of each owner is kept, so the oldest retained id always tells
    a reader whether it missed pruned events."""
    deadline = time.monotonic() + budget
    events, events_done = await _delete_in_batches(
        db, _OWNER_EVENTS, owner_events_older_than, batch_rows, deadline
    )
    sessions, sessions_done = await _delete_in_batches(
        db, _SESSIONS, deleted_sessions_older_than, batch_rows, deadline
    )
    keys, keys_done = await _delete_in_batches(
        db, _IDEMPOTENCY_KEYS, idempotency_keys_older_than, batch_rows, deadline
    )
    return Pruned(events, sessions, keys, complete=events_done and sessions_done and keys_done)


async def _delete_in_batches(
    db: Database, statement: LiteralString, age: timedelta, rows: int, deadline: float
) -> tuple[int, bool]:
    """Rows deleted, and whether none that `statement` selects is left."""
    deleted = 0
    while time.monotonic() < deadline:
        async with db.transaction() as conn:
            batch = (await conn.execute(statement, {"age": age, "rows": rows})).rowcount
        deleted += batch
        if batch < rows:
            return deleted, True
    return deleted, False
