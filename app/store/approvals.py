"""Approvals across an owner's sessions (docs/approvals.md): the calls that wait for a
decision, and whose sessions a caller may decide (its owner's, or, for an approver key, the
owners it approves for)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any
from uuid import UUID

from app.db.pool import Connection
from app.domain import TERMINAL, SessionEventType
from app.errors import SessionNotFound
from app.store.sessions import session_row
from app.store.statements import statement

_TERMINAL = ", ".join(f"'{s}'" for s in sorted(TERMINAL))
# A request is pending while no decision and no result for its call follow it; the sessions
# of the owner that are not terminal, oldest request first.
_PENDING = statement(
    "pending_approvals",
    f"""
    SELECT s.id AS session_id, s.title, e.seq, e.data, e.created_at
    FROM sessions s
    JOIN session_events e ON e.session_id = s.id
         AND e.type = '{SessionEventType.TOOL_APPROVAL_REQUESTED}'
    WHERE s.owner_id = %s AND s.deleted_at IS NULL AND s.status NOT IN ({_TERMINAL})
      AND NOT EXISTS (
          SELECT 1 FROM session_events d
          WHERE d.session_id = e.session_id AND d.seq > e.seq
            AND d.type IN ('{SessionEventType.TOOL_APPROVAL_DECIDED}',
                           '{SessionEventType.TOOL_RESULT}')
            AND d.data->>'toolCallId' = e.data->>'toolCallId'
      )
    ORDER BY e.created_at, s.id, e.seq
    LIMIT %s
    """,
)


async def pending(conn: Connection, owner_id: str, limit: int) -> list[dict[str, Any]]:
    """The owner's tool calls that wait for a decision, oldest first, at most `limit`."""
    cur = await conn.execute(_PENDING, (owner_id, limit))
    return await cur.fetchall()


async def decidable_session(
    conn: Connection, owner_id: str, approver_for: Collection[str], session_id: UUID
) -> dict[str, Any]:
    """The session whose approvals the caller (of `owner_id`, approver for `approver_for`) may
    decide; SessionNotFound for any other, as for a session that does not exist."""
    row = await session_row(conn, session_id)
    if row is None or row["deleted_at"] is not None:
        raise SessionNotFound()
    if row["owner_id"] != owner_id and row["owner_id"] not in approver_for:
        raise SessionNotFound()
    return row
