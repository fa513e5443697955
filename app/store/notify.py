"""The one place that sends NOTIFY. Payloads are feed keys, never rows: the log is the truth."""

from __future__ import annotations

from uuid import UUID

from app.db.pool import Connection

CHANNEL = "ferryman"
# Key of the notification that wakes workers when there may be work to claim.
WORK_KEY = "work"


def owner_key(owner_id: str) -> str:
    return f"o:{owner_id}"


def session_key(session_id: UUID | str) -> str:
    return f"s:{session_id}"


async def notify(conn: Connection, key: str) -> None:
    # Sent inside the caller's transaction, so it is delivered only if the write commits;
    # duplicates within one transaction collapse into one notification.
    await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, key))
