"""What the Agent Protocol surface (app/protocols/agent_protocol) asks of sessions beyond the
native API: searching them as threads, merging their metadata, starting an idle session's first run
with its agent definition, and the log positions that bound its runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from app.db.pool import Connection
from app.domain import OwnerEventType, SessionEventType, Status
from app.store.events import owner_event_ctes
from app.store.notify import RUNS_CHANNEL, WORK_KEY, notifying, session_key
from app.store.sessions import LIST_COLUMNS, SESSION_COLUMNS, STATUS_EVENT_DATA, NewSession
from app.store.statements import statement

# The sort keys a thread search takes, and the column each orders by.
SORT_COLUMNS = {
    "thread_id": "id",
    "status": "status",
    "created_at": "created_at",
    "updated_at": "updated_at",
    "state_updated_at": "updated_at",
}

# A search reads what a session list reads (no big texts whole): a thread's view shows neither.
_SEARCH = f"""
    SELECT {LIST_COLUMNS} FROM sessions
    WHERE owner_id = %(owner)s AND deleted_at IS NULL
      AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
      AND (%(metadata)s::jsonb IS NULL OR metadata @> %(metadata)s::jsonb)
      AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
    ORDER BY {{column}} {{direction}}, id {{direction}}
    LIMIT %(limit)s OFFSET %(offset)s
"""
# One registered form per sort key and direction: the statement text never takes user input.
_SEARCHES = {
    (column, direction): statement(
        f"search_threads_{column}_{direction.lower()}",
        _SEARCH.format(column=column, direction=direction),
    )
    for column in sorted(set(SORT_COLUMNS.values()))
    for direction in ("ASC", "DESC")
}
_COUNT = statement(
    "count_threads",
    """
    SELECT count(*) AS n FROM sessions
    WHERE owner_id = %(owner)s AND deleted_at IS NULL
      AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
      AND (%(metadata)s::jsonb IS NULL OR metadata @> %(metadata)s::jsonb)
    """,
)
_MERGE_METADATA = statement(
    "merge_thread_metadata",
    f"""
    UPDATE sessions SET metadata = metadata || %s, updated_at = clock_timestamp()
    WHERE id = %s RETURNING {SESSION_COLUMNS}
    """,
)
# A thread's first run, in one statement: the owner's session that is idle and has no event
# yet takes the run's definition and its first message as the prompt, is queued, logs that
# message (seq 1) and announces its status; the session's stream and the workers are told.
# It answers nothing, and changes nothing, for any other session.
_START_FIRST_RUN = statement(
    "start_first_run",
    f"""
    WITH s AS (
        UPDATE sessions SET model = %(model)s, script = %(script)s, tools = %(tools)s,
                            instructions = %(instructions)s, model_settings = %(model_settings)s,
                            approval_required = %(approval_required)s, title = %(title)s,
                            client_tools = %(client_tools)s, compaction = %(compaction)s,
                            delegates = %(delegates)s, assistant_id = %(assistant_id)s,
                            assistant_version = %(assistant_version)s, prompt = %(text)s,
                            status = '{Status.QUEUED}', error = NULL, cancel_requested_at = NULL,
                            last_seq = 1, updated_at = clock_timestamp()
        WHERE id = %(id)s AND owner_id = %(owner)s AND deleted_at IS NULL
          AND status = '{Status.IDLE}' AND last_seq = 0
        RETURNING {SESSION_COLUMNS}
    ), appended AS (
        INSERT INTO session_events (session_id, seq, attempt, type, data)
        SELECT id, last_seq, attempt, '{SessionEventType.USER_MESSAGE}', %(data)s FROM s
    ), {owner_event_ctes("s", f"'{OwnerEventType.SESSION_STATUS}'", STATUS_EVENT_DATA)}
    SELECT * FROM s
    WHERE {notifying("%(session_key)s")} AND {notifying(f"'{WORK_KEY}'", RUNS_CHANNEL)}
    """,
)
# A later run's definition, for a session the caller locked, that has no run in progress.
_REDEFINE = statement(
    "redefine_thread",
    f"""
    UPDATE sessions SET model = %(model)s, script = %(script)s, tools = %(tools)s,
                        instructions = %(instructions)s, model_settings = %(model_settings)s,
                        approval_required = %(approval_required)s,
                        client_tools = %(client_tools)s, compaction = %(compaction)s,
                        delegates = %(delegates)s,
                        assistant_id = %(assistant_id)s, assistant_version = %(assistant_version)s,
                        updated_at = clock_timestamp()
    WHERE id = %(id)s RETURNING {SESSION_COLUMNS}
    """,
)
# The events that open and close runs, and nothing of their data but what says so (and what
# the Agent Protocol's run create gave the run: its metadata and multitask strategy).
_RUN_MARKS = statement(
    "thread_run_marks",
    f"""
    SELECT seq, type, created_at, data->>'status' AS status,
           data->'runMetadata' AS run_metadata, data->>'multitaskStrategy' AS multitask_strategy
    FROM session_events
    WHERE session_id = %s AND type IN ('{SessionEventType.USER_MESSAGE}',
        '{SessionEventType.TOOL_APPROVAL_DECIDED}', '{SessionEventType.CLIENT_TOOL_RESULT}',
        '{SessionEventType.SESSION_END}')
    ORDER BY seq
    """,
)


@dataclass(frozen=True)
class ThreadQuery:
    statuses: list[str] | None
    metadata: dict[str, Any] | None
    ids: list[UUID] | None
    limit: int
    offset: int
    sort_column: str = "created_at"
    descending: bool = True


async def search(conn: Connection, owner_id: str, query: ThreadQuery) -> list[dict[str, Any]]:
    sql = _SEARCHES[(query.sort_column, "DESC" if query.descending else "ASC")]
    cur = await conn.execute(
        sql,
        {
            "owner": owner_id,
            "statuses": query.statuses,
            "metadata": Jsonb(query.metadata) if query.metadata else None,
            "ids": query.ids,
            "limit": query.limit,
            "offset": query.offset,
            "excerpt": 0,
        },
    )
    return await cur.fetchall()


async def count(
    conn: Connection, owner_id: str, statuses: list[str] | None, metadata: dict[str, Any] | None
) -> int:
    cur = await conn.execute(
        _COUNT,
        {
            "owner": owner_id,
            "statuses": statuses,
            "metadata": Jsonb(metadata) if metadata else None,
        },
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def merge_metadata(
    conn: Connection, session_id: UUID, metadata: dict[str, Any]
) -> dict[str, Any]:
    """The locked session's metadata with `metadata`'s keys set (the protocol merges)."""
    cur = await conn.execute(_MERGE_METADATA, (Jsonb(metadata), session_id))
    row = await cur.fetchone()
    assert row is not None
    return row


async def start_first_run(
    conn: Connection,
    owner_id: str,
    session_id: UUID,
    new: NewSession,
    text: str,
    extra: dict[str, Any],
) -> dict[str, Any] | None:
    """Start the first run of the owner's idle session that has no event yet: its definition
    `new`, its first message `text` (seq 1, queued, with `extra` in its data), all in one
    statement. The session's row as it is now, or None (nothing changed) if it is no such
    session."""
    cur = await conn.execute(
        _START_FIRST_RUN,
        {
            **_definition(new),
            "title": new.title,
            "text": text,
            "data": Jsonb({**extra, "text": text, "delivery": "queued"}),
            "id": session_id,
            "owner": owner_id,
            "session_key": session_key(session_id),
        },
    )
    row: dict[str, Any] | None = await cur.fetchone()
    return row


async def redefine(conn: Connection, session_id: UUID, new: NewSession) -> dict[str, Any]:
    """Give the locked session the agent definition `new`; its row."""
    cur = await conn.execute(_REDEFINE, {**_definition(new), "id": session_id})
    row = await cur.fetchone()
    assert row is not None
    return row


def _definition(new: NewSession) -> dict[str, Any]:
    """The parameters of a session's agent definition columns."""
    return {
        "model": new.model,
        "script": Jsonb(new.script) if new.script is not None else None,
        "tools": Jsonb(new.tools) if new.tools is not None else None,
        "instructions": new.instructions,
        "model_settings": Jsonb(new.model_settings),
        "approval_required": Jsonb(new.approval_required)
        if new.approval_required is not None
        else None,
        "assistant_id": new.assistant_id,
        "assistant_version": new.assistant_version,
        "client_tools": Jsonb(new.client_tools) if new.client_tools is not None else None,
        "compaction": Jsonb(new.compaction) if new.compaction is not None else None,
        "delegates": Jsonb(new.delegates) if new.delegates is not None else None,
    }


async def run_marks(conn: Connection, session_id: UUID) -> list[dict[str, Any]]:
    """The session's user messages, approval decisions and ends, in log order: what runs are
    made of (app/protocols/agent_protocol/runs_model.py)."""
    cur = await conn.execute(_RUN_MARKS, (session_id,))
    return await cur.fetchall()


# The metadata of a stateless thread to delete once its run ended (`on_completion: delete`).
STATELESS_TO_DELETE = {"stateless": True, "on_completion": "delete"}
# Those whose run ended at least `grace` ago, oldest first: the delete their run's API process
# would have done, had it lived. The marker is a literal, as the partial index (migration
# 0012) that finds them has it.
_ENDED_STATELESS = statement(
    "ended_stateless_threads",
    f"""
    SELECT id, owner_id FROM sessions
    WHERE deleted_at IS NULL AND metadata @> '{json.dumps(STATELESS_TO_DELETE)}'::jsonb
      AND status NOT IN ('queued', 'running') AND updated_at < clock_timestamp() - %(grace)s
    ORDER BY updated_at LIMIT %(limit)s
    """,
)


async def ended_stateless(conn: Connection, grace: timedelta, limit: int) -> list[dict[str, Any]]:
    """Stateless threads to delete (id, owner_id), not busy, unchanged for `grace`."""
    cur = await conn.execute(_ENDED_STATELESS, {"grace": grace, "limit": limit})
    return await cur.fetchall()
