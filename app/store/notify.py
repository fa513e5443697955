"""The one place that sends NOTIFY. Payloads are feed keys, never rows: the log is the truth."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import psycopg

from app.db.pool import Connection
from app.domain import check_owner_id
from app.store.statements import statement

# Two channels, so that a process listens only for what it acts on: API processes hear the
# streams' keys and token deltas (many a second), workers hear about work, cancels and
# messages (few). Every listening backend reads the notification queue in a transaction of
# its own each time it is woken, and every listening process parses what it hears.
STREAMS_CHANNEL = "ferryman"
RUNS_CHANNEL = "ferryman_runs"
# Key of the notification that wakes workers when there may be work to claim.
WORK_KEY = "work"
# Key of the notification sent when a worker (re-)registers: death watches choose peers again.
WORKERS_KEY = "workers"


# `key|afterSeq|type|envelope`: an ephemeral frame (e.g. `message_delta`) riding on the
# notification itself; a payload may carry several, one per line (`ephemeral_body`).
EPHEMERAL_SEPARATOR = "|"
# NOTIFY payloads must stay under 8000 bytes.
MAX_EPHEMERAL_BYTES = 7000


# An owner stream's key is this prefix and the owner id (SQL that notifies owners builds it too).
OWNER_KEY_PREFIX = "o:"


def owner_key(owner_id: str) -> str:
    return f"{OWNER_KEY_PREFIX}{check_owner_id(owner_id)}"


SESSION_KEY_PREFIX = "s:"


def session_key(session_id: UUID | str) -> str:
    return f"{SESSION_KEY_PREFIX}{session_id}"


# A marker an API process's fallback poll sends itself (`streams.feed.FeedHub`): heard back,
# it says the process's LISTEN connection has passed every notification committed before it.
MARKER_KEY_PREFIX = "m:"


def marker_key(token: UUID | str) -> str:
    return f"{MARKER_KEY_PREFIX}{token}"


def channel_of(key: str) -> str:
    """The channel a key's notifications go on: the streams' keys (`s:`, `o:`, `m:`) on
    STREAMS_CHANNEL, the workers' (`work`, `workers`, `c:`, `i:`, `b:`) on RUNS_CHANNEL."""
    streams = (SESSION_KEY_PREFIX, OWNER_KEY_PREFIX, MARKER_KEY_PREFIX)
    return STREAMS_CHANNEL if key.startswith(streams) else RUNS_CHANNEL


def inbox_key(session_id: UUID | str) -> str:
    """Wakes the lease holder of a session that was sent a message or an approval decision:
    it reads its log for them only when told (its finish still checks, in case a
    notification is lost)."""
    return f"i:{session_id}"


def budget_slot_key(budget: str) -> str:
    """Wakes the workers' runs waiting for a slot of a provider budget: one was freed."""
    return f"b:{budget}"


def cancel_key(session_id: UUID | str) -> str:
    """Wakes the lease holder of a session whose cancellation was requested."""
    return f"c:{session_id}"


def ephemeral_body(after_seq: int, type_: str, envelope: str, chunk: int = 0) -> str:
    """What follows the key on an ephemeral frame's line: the id of the event it follows (and
    `.chunk`, its number among the frames that follow that event, when it is a stored chunk:
    app/store/deltas.py), its type and its envelope, one-line JSON exactly as streams send it
    (its `"phase":"live"` included). With those out in front, an API process frames it without
    parsing the JSON: at 2,000 streaming sessions, parsing and re-encoding every delta was half
    its time."""
    place = f"{after_seq}.{chunk}" if chunk else str(after_seq)
    return f"{place}{EPHEMERAL_SEPARATOR}{type_}{EPHEMERAL_SEPARATOR}{envelope}"


def parse_ephemeral(body: str) -> tuple[int, int, str, str] | None:
    """(afterSeq, chunk or 0, type, envelope) of an `ephemeral_body`, or None if it is not
    one."""
    place, _, rest = body.partition(EPHEMERAL_SEPARATOR)
    type_, _, envelope = rest.partition(EPHEMERAL_SEPARATOR)
    after, dot, chunk = place.partition(".")
    if not after.isdigit() or (dot and not chunk.isdigit()) or not type_ or not envelope:
        return None
    return int(after), int(chunk) if dot else 0, type_, envelope


def delta_head(session_id: UUID | str, owner_id: str) -> str:
    """The start of a `message_delta` envelope of the session, up to its `ts` value
    (`delta_envelope` ends it). Spelled out rather than json.dumps of a dict: a worker's flush
    builds one per streaming session, 20 times a second."""
    return (
        f'{{"type":"message_delta","sessionId":"{session_id}",'
        f'"ownerId":{json_string(owner_id)},"ts":"'
    )


def delta_envelope(head: str, ts: str, after_seq: int, chunk: int, text: str, phase: str) -> str:
    """A `message_delta` envelope (`delta_head`'s), one-line JSON, as live streams send it and
    as a reconnect replays it from the stored chunks."""
    return (
        f'{head}{ts}","afterSeq":{int(after_seq)},"chunk":{int(chunk)},'
        f'"data":{{"text":{json_string(text)}}},"phase":"{phase}"}}'
    )


def json_string(text: str) -> str:
    """`text` as a JSON string literal in UTF-8 rather than \\u escapes (an emoji is 4 bytes on
    the wire, not 12); a lone surrogate, which UTF-8 cannot carry, stays an escape."""
    if text.isascii():
        return json.dumps(text)
    return json.dumps(text, ensure_ascii=False).encode("utf-8", "backslashreplace").decode()


def ephemeral_payloads(frames: list[tuple[str, str]]) -> list[str]:
    """Frames that are not logged (token deltas), `(key, body)` each, packed into as few
    NOTIFY payloads as fit them, one `key|body` line per frame (a body is one-line JSON). A
    frame bigger than a payload is left out."""
    payloads: list[str] = []
    lines: list[str] = []
    size = 0
    for key, body in frames:
        line = f"{key}{EPHEMERAL_SEPARATOR}{body}"
        length = len(line.encode()) + 1
        if length > MAX_EPHEMERAL_BYTES:
            continue
        if size + length > MAX_EPHEMERAL_BYTES:
            payloads.append("\n".join(lines))
            lines, size = [], 0
        lines.append(line)
        size += length
    if lines:
        payloads.append("\n".join(lines))
    return payloads


_LISTEN = {
    channel: statement(f"listen_{channel}", f"LISTEN {channel}")
    for channel in (STREAMS_CHANNEL, RUNS_CHANNEL)
}


async def listen(conn: psycopg.AsyncConnection[Any], channel: str) -> None:
    """Have `conn` hear `channel` (STREAMS_CHANNEL or RUNS_CHANNEL) from now on."""
    await conn.execute(_LISTEN[channel])


async def probe(conn: psycopg.AsyncConnection[Any]) -> None:
    """Ask the server for nothing: a dead server is not always noticed by a blocked read."""
    await conn.execute("SELECT 1")


def notifying(key: str, channel: str = STREAMS_CHANNEL) -> str:
    """A condition that is true and sends the notification whose key the SQL expression `key`
    gives (on `channel`: a stream's by default), for each row it is checked on: in a write's
    `WHERE` or `RETURNING`, it notifies in the write's own statement (one round trip fewer
    than `notify`), and only for rows written."""
    return f"pg_notify('{channel}', {key}) IS NOT NULL"


async def notify(conn: Connection, key: str) -> None:
    # Sent inside the caller's transaction, so it is delivered only if the write commits;
    # duplicates within one transaction collapse into one notification.
    await conn.execute("SELECT pg_notify(%s, %s)", (channel_of(key), key))
