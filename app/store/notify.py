"""The one place that sends NOTIFY. Payloads are feed keys, never rows: the log is the truth."""

from __future__ import annotations

from uuid import UUID

from app.db.pool import Connection
from app.domain import check_owner_id

CHANNEL = "ferryman"
# Key of the notification that wakes workers when there may be work to claim.
WORK_KEY = "work"
# Key of the notification sent when a worker (re-)registers: death watches choose peers again.
WORKERS_KEY = "workers"


# `key|body`: an ephemeral frame (e.g. `message_delta`) riding on the notification itself.
EPHEMERAL_SEPARATOR = "|"
# NOTIFY payloads must stay under 8000 bytes.
MAX_EPHEMERAL_BYTES = 7000


def owner_key(owner_id: str) -> str:
    return f"o:{check_owner_id(owner_id)}"


def session_key(session_id: UUID | str) -> str:
    return f"s:{session_id}"


def inbox_key(session_id: UUID | str) -> str:
    """Wakes the lease holder of a session that was sent a message or an approval decision:
    it reads its log for them only when told (its finish still checks, in case a
    notification is lost)."""
    return f"i:{session_id}"


def cancel_key(session_id: UUID | str) -> str:
    """Wakes the lease holder of a session whose cancellation was requested."""
    return f"c:{session_id}"


async def publish_ephemeral(conn: Connection, key: str, body: str) -> None:
    """Send a frame that is not logged (token deltas): best effort, lost if no one listens."""
    payload = f"{key}{EPHEMERAL_SEPARATOR}{body}"
    if len(payload.encode()) <= MAX_EPHEMERAL_BYTES:
        await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))


async def notify(conn: Connection, key: str) -> None:
    # Sent inside the caller's transaction, so it is delivered only if the write commits;
    # duplicates within one transaction collapse into one notification.
    await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, key))
