"""How a run writes: its pending writes (`Batch`) go out as one fenced statement (`send_batch`),
alone or with other runs' in one transaction (`send_writes`).

Every run write checks the fence `(workerId, attempt)` and an unexpired lease in the statement
that writes, so a worker that lost its lease writes nothing more.

The statement has two forms, each rendered once at import: `run_write`, and
`run_write_if_log_ends`, which writes nothing unless the session's log still ends where the
run knows and nothing waits for the run (`settling.at_once`). What a batch changes on the session
row is typed (`SessionChanges`) and goes in as parameters: a column a batch leaves alone is
assigned its own value, so one form serves every set of changes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from app.db.pool import Connection
from app.domain import Status
from app.store.events import FENCED, Cursor, Fence, owner_event_ctes
from app.store.notify import STREAMS_CHANNEL, ephemeral_payloads, session_key
from app.store.statements import statement


@dataclass
class SessionChanges:
    """What a run changes on its session row besides the end of its log."""

    # The model has seen the log up to here (later follow-ups re-queue); it only moves forward.
    delivered_seq: int | None = None
    # Tokens added to the session's running totals.
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    # The step the run is at (`tool:<name>`); None leaves it as it is.
    active_stage: str | None = None
    # The run settles: the session is left in `status` with `error`, its stage cleared.
    status: Status | None = None
    error: dict[str, Any] | None = None
    # The lease is given up (the run settles, or hands the session over).
    lease_released: bool = False

    def params(self) -> dict[str, Any]:
        """The parameters `_RUN_WRITE` names for these changes."""
        return {
            "delivered_seq": self.delivered_seq,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "active_stage": self.active_stage,
            "status": None if self.status is None else str(self.status),
            "error": None if self.error is None else Jsonb(self.error),
            "lease_released": self.lease_released,
        }


@dataclass
class Batch:
    """A run's writes not sent yet, sent as one fenced statement (`send_batch`): its events in
    order, changes to the session row, owner events about it, the session's notes the run's
    tools wrote, and frames that are not logged (token deltas), notified before the events
    they precede."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    owner_events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    ephemerals: list[tuple[str, str]] = field(default_factory=list)
    changes: SessionChanges = field(default_factory=SessionChanges)
    # Notes by key (the last text put wins).
    notes: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(
            self.events
            or self.owner_events
            or self.ephemerals
            or self.changes != SessionChanges()
            or self.notes
        )

    def add(self, type_: str, data: dict[str, Any]) -> None:
        self.events.append((type_, data))

    def announce(self, type_: str, data: dict[str, Any]) -> None:
        self.owner_events.append((type_, data))

    def deliver(self, seq: int) -> None:
        """The model has seen the log up to `seq` (undelivered messages re-queue)."""
        delivered = self.changes.delivered_seq
        self.changes.delivered_seq = seq if delivered is None else max(seq, delivered)

    def count_tokens(self, input_: int, output: int, cached: int) -> None:
        """A turn's tokens, added to the session's running totals."""
        self.changes.input_tokens += input_
        self.changes.output_tokens += output
        self.changes.cached_tokens += cached

    def put_note(self, key: str, text: str) -> None:
        self.notes[key] = text

    def set_stage(self, stage: str) -> None:
        self.changes.active_stage = stage

    def copy(self) -> Batch:
        return Batch(
            list(self.events),
            list(self.owner_events),
            list(self.ephemerals),
            dataclasses.replace(self.changes),
            dict(self.notes),
        )


# Follow-ups, approval decisions, client tools' results and children's ends the model has not
# seen: logged after `{after}` and after the session's `delivered_seq` (of the session row
# `sessions`).
UNDELIVERED = """
        SELECT FROM session_events e WHERE e.session_id = sessions.id
          AND e.type IN ('user_message', 'tool_approval_decided', 'client_tool_result',
                         'delegate_result')
          AND e.seq > greatest(sessions.delivered_seq, {after})"""

# The notifications go together, in order: the turn's last token deltas, then the stream's key
# (a stream gets a turn's last deltas before the message, which it reads from the log), and only
# if the session row was written. JSON arrays go in binary (`%b`): in text, psycopg escapes every
# quote in them with a regex.
_RUN_WRITE = """
    WITH bumped AS (
        UPDATE sessions SET
            last_seq = last_seq + %(n)s, updated_at = clock_timestamp(),
            delivered_seq = greatest(delivered_seq, %(delivered_seq)s::bigint),
            input_tokens = input_tokens + %(input_tokens)s,
            output_tokens = output_tokens + %(output_tokens)s,
            cached_tokens = cached_tokens + %(cached_tokens)s,
            active_stage = CASE WHEN %(status)s::text IS NULL
                                THEN coalesce(%(active_stage)s::text, active_stage) END,
            status = coalesce(%(status)s::text, status),
            error = CASE WHEN %(status)s::text IS NULL THEN error ELSE %(error)s::jsonb END,
            lease_worker_id = CASE WHEN %(lease_released)s THEN NULL ELSE lease_worker_id END,
            lease_pid = CASE WHEN %(lease_released)s THEN NULL ELSE lease_pid END,
            lease_expires_at = CASE WHEN %(lease_released)s THEN NULL ELSE lease_expires_at END
        WHERE id = %(session_id)s AND {fenced}{guard}
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
_OWNER_EVENTS = owner_event_ctes("owner_rows", "s.type", "s.data", order="s.ord")
RUN_WRITE = statement(
    "run_write",
    _RUN_WRITE.format(channel=STREAMS_CHANNEL, fenced=FENCED, guard="", owner_events=_OWNER_EVENTS),
)
# The guard checks the locked row: a follow-up or a cancel committed meanwhile moves it.
RUN_WRITE_IF_LOG_ENDS = statement(
    "run_write_if_log_ends",
    _RUN_WRITE.format(
        channel=STREAMS_CHANNEL,
        fenced=FENCED,
        guard="""
          AND last_seq = %(expected_last_seq)s AND cancel_requested_at IS NULL
          AND NOT EXISTS ("""
        + UNDELIVERED.format(after="%(delivered_seq)s::bigint")
        + ")",
        owner_events=_OWNER_EVENTS,
    ),
)


async def send_batch(
    conn: Connection,
    fence: Fence,
    session_id: UUID,
    batch: Batch,
    *,
    expected_last_seq: int | None = None,
) -> Cursor:
    """Write `batch` in one statement, fenced: the database refuses it (`events.fence_errors`)
    once the lease is gone. With `expected_last_seq`, write nothing unless the session's log
    still ends there, no cancel was requested and no message waits undelivered. The returned
    cursor's row says whether it was `written` and the `seq` of its last event (in a pipelined
    transaction: once that ended)."""
    params = {
        **batch.changes.params(),
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
    if expected_last_seq is None:
        return await conn.execute(RUN_WRITE, params)
    return await conn.execute(
        RUN_WRITE_IF_LOG_ENDS, {**params, "expected_last_seq": expected_last_seq}
    )


@dataclass(eq=False)  # compared by identity: two writes are never the same write
class Write:
    """A run's `send_batch`, ready to send: alone, or with other runs' (`send_writes`)."""

    fence: Fence
    session_id: UUID
    batch: Batch
    # Write nothing unless the session's log still ends here (`send_batch`).
    expected_last_seq: int | None = None

    async def send(self, conn: Connection) -> Cursor:
        return await send_batch(
            conn, self.fence, self.session_id, self.batch, expected_last_seq=self.expected_last_seq
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


async def get_note(conn: Connection, session_id: UUID, key: str) -> str | None:
    """A note of the session's, as its last committed write left it (`Batch.put_note`)."""
    cur = await conn.execute(
        "SELECT text FROM notes WHERE session_id = %s AND key = %s", (session_id, key)
    )
    row = await cur.fetchone()
    return row["text"] if row else None
