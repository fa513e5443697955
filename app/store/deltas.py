"""Token deltas kept for reconnects (table `session_deltas`, migration 0011): a worker's flush
stores its chunks in the statement that notifies them, and a stream that (re)connects mid-turn
reads the chunks of the open turn its client missed.

A chunk is `(session, afterSeq, chunk)`: one flush of one session's text, numbered 1, 2, 3...
for each afterSeq (a turn's text follows one event of its run: all its chunks share it). A
turn's chunks are obsolete once its end is logged (`assistant_message` or `model_retry`, which
carry or drop its text) or its run ended (`session_end`), but they stay until the sweep a flush
carries every SWEEP_SECONDS deletes every chunk older than MAX_CHUNK_AGE_SECONDS: a client that
saw some of a closed turn's chunks (an earlier turn of the run, or a run before the one now
streaming) and joins again from one of their ids gets exactly the rest of that turn, not its
whole text again. A turn stores at most MAX_STORED_CHUNKS_PER_TURN chunks (those after are
still sent live): rows stay under the chunks flushed in the last MAX_CHUNK_AGE_SECONDS +
SWEEP_SECONDS."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from app.db.pool import Connection
from app.domain import SessionEventType
from app.store.notify import STREAMS_CHANNEL, ephemeral_payloads
from app.store.statements import statement

# Chunks of one turn kept for reconnects; a longer turn's later chunks are sent live only.
MAX_STORED_CHUNKS_PER_TURN = 3000
# A chunk older than this is deleted whether or not its turn ended (the last turn of an idle
# session, a deleted session's, a worker's that died mid-turn): the table holds what the
# workers flushed in this time (docs/performance.md puts it at about 150 bytes a chunk, a
# streaming session flushing up to 10 a second).
MAX_CHUNK_AGE_SECONDS = 300
# How often (at most, per worker) a flush also sweeps the chunks past MAX_CHUNK_AGE_SECONDS.
SWEEP_SECONDS = 30.0

# Events after which a turn's stored chunks are never sent again: its text is in the log (or
# dropped by it), or its run is over.
CLOSING_TYPES = frozenset(
    {
        SessionEventType.ASSISTANT_MESSAGE,
        SessionEventType.MODEL_RETRY,
        SessionEventType.SESSION_END,
    }
)
_CLOSING = ", ".join(f"'{type_}'" for type_ in sorted(CLOSING_TYPES))


@dataclass(frozen=True)
class Chunk:
    """One chunk to store: a flush of one session's text."""

    session_id: UUID
    after_seq: int
    chunk: int
    text: str


# One statement, so one round trip and one transaction whatever a flush carries: the chunks are
# stored exactly when their NOTIFY is sent (a reader that heard of one can read it), and the
# notifications go out.
_PUBLISH = """
    WITH chunk AS (
        SELECT * FROM unnest(
            %(sessions)b::uuid[], %(afters)b::bigint[], %(chunks)b::integer[], %(texts)b::text[]
        ) AS c (session_id, after_seq, chunk, text)
    ), stored AS (
        INSERT INTO session_deltas (session_id, after_seq, chunk, text, created_at)
        SELECT session_id, after_seq, chunk, text, %(ts)s FROM chunk
        ON CONFLICT DO NOTHING
    ){sweep}
    SELECT pg_notify('{channel}', payload) FROM unnest(%(payloads)b::text[]) AS payload
"""
_SWEEP = """, swept AS (
        DELETE FROM session_deltas WHERE created_at < %(ts)s - %(max_age)s * interval '1 second'
    )"""
_PUBLISH_DELTAS = statement("publish_deltas", _PUBLISH.format(sweep="", channel=STREAMS_CHANNEL))
_PUBLISH_DELTAS_AND_SWEEP = statement(
    "publish_deltas_and_sweep", _PUBLISH.format(sweep=_SWEEP, channel=STREAMS_CHANNEL)
)


async def publish_deltas(
    conn: Connection,
    frames: list[tuple[str, str]],
    chunks: list[Chunk],
    ts: datetime,
    *,
    sweep: bool = False,
) -> None:
    """Send the ephemeral `frames` (`ephemeral_payloads`) and store `chunks` (stamped `ts`, the
    time their frames carry) in one statement; with `sweep`, also delete every chunk older than
    MAX_CHUNK_AGE_SECONDS. Best effort: a failure loses them all, as a NOTIFY with no listener
    is lost."""
    payloads = ephemeral_payloads(frames)
    if not payloads and not chunks:
        return
    # Arrays in binary (%b): psycopg's text format escapes every quote of the JSON bodies with a
    # regex, ~15 ms of a worker's loop for 500 sessions' deltas.
    params: dict[str, Any] = {
        "sessions": [c.session_id for c in chunks],
        "afters": [c.after_seq for c in chunks],
        "chunks": [c.chunk for c in chunks],
        "texts": [c.text for c in chunks],
        "payloads": payloads,
        "ts": ts,
        "max_age": MAX_CHUNK_AGE_SECONDS,
    }
    query = _PUBLISH_DELTAS_AND_SWEEP if sweep else _PUBLISH_DELTAS
    await conn.execute(query, params)


@dataclass(frozen=True)
class OpenTurn:
    """The turn a reader at a cursor is in the middle of: its afterSeq, and its stored chunks
    the reader has not seen (`chunk`, `text`, `created_at` each), in order."""

    after_seq: int
    chunks: list[dict[str, Any]]


# The open turn at `cursor`: the newest afterSeq up to it with stored chunks, unless an event
# after that afterSeq (up to the cursor) closed it. One row with NULL chunk when none is left
# to send, so the reader still learns the turn's afterSeq.
_OPEN_TURN = statement(
    "open_turn_chunks",
    f"""
    WITH turn AS (
        SELECT max(after_seq) AS after_seq FROM session_deltas
        WHERE session_id = %(session_id)s AND after_seq <= %(cursor)s
    )
    SELECT turn.after_seq, d.chunk, d.text, d.created_at
    FROM turn LEFT JOIN session_deltas d
        ON d.session_id = %(session_id)s AND d.after_seq = turn.after_seq
        AND d.chunk > CASE WHEN turn.after_seq <= %(seen_seq)s THEN %(seen_chunk)s ELSE 0 END
    WHERE turn.after_seq IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM session_events e
        WHERE e.session_id = %(session_id)s AND e.seq > turn.after_seq AND e.seq <= %(cursor)s
            AND e.type IN ({_CLOSING})
    )
    ORDER BY d.chunk
    """,
)


async def open_turn(
    conn: Connection, session_id: UUID, cursor: int, seen_seq: int, seen_chunk: int
) -> OpenTurn | None:
    """The turn still open at event `cursor` and its stored chunks a reader has not seen, or
    None when no turn is open there. The reader had seen event `seen_seq` (<= `cursor`) and
    chunks 1..`seen_chunk` of the turn open at it: those are skipped when the open turn is
    that one (its afterSeq is at most `seen_seq`)."""
    params = {
        "session_id": session_id,
        "cursor": cursor,
        "seen_seq": seen_seq,
        "seen_chunk": seen_chunk,
    }
    rows = await (await conn.execute(_OPEN_TURN, params)).fetchall()
    if not rows:
        return None
    return OpenTurn(int(rows[0]["after_seq"]), [row for row in rows if row["chunk"] is not None])


_CHUNKS_AFTER = statement(
    "chunks_after",
    """
    SELECT after_seq, chunk, text, created_at FROM session_deltas
    WHERE session_id = %(session_id)s AND after_seq = %(after_seq)s AND chunk > %(chunk)s
        AND chunk < %(before)s
    ORDER BY chunk
    """,
)


async def chunks_after(
    conn: Connection, session_id: UUID, after_seq: int, chunk: int, before: int | None = None
) -> list[dict[str, Any]]:
    """The stored chunks of the session's turn that follows event `after_seq`, those numbered
    after `chunk` (and before `before`, when given), in order: `after_seq`, `chunk`, `text`,
    `created_at` each."""
    params = {
        "session_id": session_id,
        "after_seq": after_seq,
        "chunk": chunk,
        "before": MAX_STORED_CHUNKS_PER_TURN + 1 if before is None else before,
    }
    return await (await conn.execute(_CHUNKS_AFTER, params)).fetchall()
