"""Forks: a new session of the same owner whose log starts as a copy of a prefix of another's
(docs/fork.md). The copy is one INSERT ... SELECT inside the statement that makes the session
row: one round trip whatever the prefix's length (bench/fork.py measures it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

from app.db.pool import Connection
from app.domain import (
    MAX_FORK_EVENTS,
    OwnerEventType,
    SessionEventType,
    Status,
    fork_status,
    session_view,
)
from app.errors import ForkNotUserMessage, ForkSeqOutOfRange, ForkTooLong
from app.store.events import append_owner_event, append_session_event
from app.store.notify import WORK_KEY, notify
from app.store.sessions import SESSION_COLUMNS, get_session, session_row
from app.store.statements import statement
from app.store.threads import STATELESS_TO_DELETE

_EVENT_AT = statement(
    "fork_event_at", "SELECT type, data FROM session_events WHERE session_id = %s AND seq = %s"
)
# The built-in tool whose calls write a session's notes (app/agent/tools/builtin.py).
PUT_NOTE = "put_note"
# The session row copies the parent's definition (the columns a run reads to drive it); its
# own run state (attempt, usage, lease, error) starts afresh. Its metadata leaves out the marks
# that have a stateless Agent Protocol thread deleted once its run ends: a fork is kept.
# Copied events are attempt 0, from before any run of the fork: a claim counts the runs since
# the last `session_end` by attempt, and the parent's attempts are not the fork's. The epoch
# is the log's now (the column's default): the rows are new rows of this log. The notes are
# as they stood at the fork's point: the last successful `put_note` of each key in the copied
# history (the parent's notes table has only their latest texts). `copied` and `noted` run
# though nothing reads them, as every data-modifying CTE does; the foreign keys are checked at
# the statement's end, when the fork's row is there.
_FORK = statement(
    "fork_session",
    f"""
    WITH forked AS (
        INSERT INTO sessions (id, owner_id, title, status, model, prompt, script, tools, metadata,
                              instructions, model_settings, approval_required, assistant_id,
                              assistant_version, client_tools, compaction, delegates,
                              last_seq, delivered_seq, forked_from_session_id, forked_from_seq,
                              created_by_key_id, priority)
        SELECT %(id)s, p.owner_id, coalesce(%(title)s, p.title), %(status)s, p.model,
               coalesce(%(prompt)s, p.prompt), p.script, p.tools,
               p.metadata - '{{{",".join(STATELESS_TO_DELETE)}}}'::text[], p.instructions,
               p.model_settings, p.approval_required, p.assistant_id, p.assistant_version,
               p.client_tools, p.compaction, p.delegates, %(copy)s,
               least(p.delivered_seq, %(copy)s), p.id, %(at)s, %(key)s, p.priority
        FROM sessions p WHERE p.id = %(parent)s
        RETURNING {SESSION_COLUMNS}
    ), copied AS (
        INSERT INTO session_events (session_id, seq, attempt, type, data, created_at)
        SELECT f.id, e.seq, 0, e.type, e.data, e.created_at
        FROM session_events e CROSS JOIN forked f
        WHERE e.session_id = %(parent)s AND e.seq <= %(copy)s
    ), noted AS (
        INSERT INTO notes (session_id, key, text, attempt)
        SELECT DISTINCT ON (c.data->'arguments'->>'key') f.id, c.data->'arguments'->>'key',
               c.data->'arguments'->>'text', 0
        FROM session_events c
        JOIN session_events r ON r.session_id = c.session_id
             AND r.type = '{SessionEventType.TOOL_RESULT}' AND r.seq <= %(copy)s
             AND r.data->>'toolCallId' = c.data->>'toolCallId' AND r.data->>'isError' = 'false'
        CROSS JOIN forked f
        WHERE c.session_id = %(parent)s AND c.seq <= %(copy)s
          AND c.type = '{SessionEventType.TOOL_CALL_START}' AND c.data->>'name' = '{PUT_NOTE}'
          AND c.data->'arguments'->>'text' IS NOT NULL
        ORDER BY c.data->'arguments'->>'key', r.seq DESC
    )
    SELECT * FROM forked
    """,
)


@dataclass(frozen=True)
class Fork:
    """What to fork: the parent's log through `at_seq`; with `message`, the user message at
    `at_seq` replaced by it; `title`, the fork's (None: the parent's)."""

    at_seq: int
    message: str | None = None
    title: str | None = None
    # The key that asks for the fork (docs/tenants.md); None: no key.
    created_by_key_id: UUID | None = None


async def fork_session(
    conn: Connection, owner_id: str, parent_id: UUID, fork: Fork
) -> dict[str, Any]:
    """Make the fork, announce it (`session_created`) and, when something is left to answer,
    queue it; the parent is read, never written. Only committed events are copied: `at_seq`
    past the parent's `last_seq` (read in this transaction) is ForkSeqOutOfRange."""
    parent = await get_session(conn, owner_id, parent_id)
    if fork.at_seq > MAX_FORK_EVENTS:
        raise ForkTooLong(fork.at_seq, MAX_FORK_EVENTS)
    if fork.at_seq > parent["last_seq"]:
        raise ForkSeqOutOfRange(fork.at_seq, parent["last_seq"])
    cur = await conn.execute(_EVENT_AT, (parent_id, fork.at_seq))
    last = await cur.fetchone()
    assert last is not None  # a log has no gaps up to last_seq
    edited = fork.message is not None
    if edited and last["type"] != SessionEventType.USER_MESSAGE:
        raise ForkNotUserMessage(fork.at_seq, last["type"])
    status = fork_status(last["type"], last["data"], edited)
    session_id = uuid4()
    cur = await conn.execute(
        _FORK,
        {
            "id": session_id,
            "parent": parent_id,
            "title": fork.title,
            "status": status,
            # The first message is the prompt: an edit of it is the fork's.
            "prompt": fork.message if edited and fork.at_seq == 1 else None,
            "copy": fork.at_seq - 1 if edited else fork.at_seq,
            "at": fork.at_seq,
            "key": fork.created_by_key_id,
        },
    )
    row = await cur.fetchone()
    assert row is not None
    if edited:
        await append_session_event(
            conn,
            session_id,
            SessionEventType.USER_MESSAGE,
            {"text": fork.message, "delivery": "queued"},
        )
        row = await session_row(conn, session_id)
        assert row is not None
    await append_owner_event(
        conn, owner_id, session_id, OwnerEventType.SESSION_CREATED, {"session": session_view(row)}
    )
    if status == Status.QUEUED:
        await notify(conn, WORK_KEY)
    return row
