"""What the Agent Protocol surface (app/protocols/agent_protocol) asks of sessions beyond the
native API: searching them as threads, merging their metadata, fixing an idle session's agent
definition at its first run, and the log positions that bound its runs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from app.db.pool import Connection
from app.domain import SessionEventType
from app.store.sessions import SESSION_COLUMNS, NewSession
from app.store.statements import statement

# The sort keys a thread search takes, and the column each orders by.
SORT_COLUMNS = {
    "thread_id": "id",
    "status": "status",
    "created_at": "created_at",
    "updated_at": "updated_at",
    "state_updated_at": "updated_at",
}

_SEARCH = f"""
    SELECT {SESSION_COLUMNS} FROM sessions
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
# The first run's definition, and its first message as the prompt, for a session of the owner
# that is idle and has no event yet; it locks the row (and answers nothing for any other).
_SET_DEFINITION = statement(
    "set_thread_definition",
    f"""
    UPDATE sessions SET model = %s, script = %s, tools = %s, instructions = %s,
                        model_settings = %s, approval_required = %s, title = %s,
                        assistant_id = %s, assistant_version = %s, prompt = %s,
                        updated_at = clock_timestamp()
    WHERE id = %s AND owner_id = %s AND deleted_at IS NULL AND status = 'idle' AND last_seq = 0
    RETURNING {SESSION_COLUMNS}
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
        '{SessionEventType.TOOL_APPROVAL_DECIDED}', '{SessionEventType.SESSION_END}')
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


async def set_definition(
    conn: Connection, owner_id: str, session_id: UUID, new: NewSession, prompt: str
) -> dict[str, Any] | None:
    """Give the owner's idle session that has no event yet its agent definition and `prompt`
    (its first message's text, which it would take anyway): the locked row, or None (and
    nothing changed, nothing locked) if it is no such session."""
    cur = await conn.execute(
        _SET_DEFINITION,
        (
            new.model,
            Jsonb(new.script) if new.script is not None else None,
            Jsonb(new.tools) if new.tools is not None else None,
            new.instructions,
            Jsonb(new.model_settings),
            Jsonb(new.approval_required) if new.approval_required is not None else None,
            new.title,
            new.assistant_id,
            new.assistant_version,
            prompt,
            session_id,
            owner_id,
        ),
    )
    row: dict[str, Any] | None = await cur.fetchone()
    return row


async def run_marks(conn: Connection, session_id: UUID) -> list[dict[str, Any]]:
    """The session's user messages, approval decisions and ends, in log order: what runs are
    made of (app/protocols/agent_protocol/runs_model.py)."""
    cur = await conn.execute(_RUN_MARKS, (session_id,))
    return await cur.fetchall()


# Stateless threads to delete (metadata `on_completion: delete`) whose run has ended at least
# `grace` ago, oldest first: the delete their run's API process would have done, had it lived.
_ENDED_STATELESS = statement(
    "ended_stateless_threads",
    """
    SELECT id, owner_id FROM sessions
    WHERE deleted_at IS NULL AND metadata @> %(marker)s::jsonb
      AND status NOT IN ('queued', 'running') AND updated_at < clock_timestamp() - %(grace)s
    ORDER BY updated_at LIMIT %(limit)s
    """,
)


async def ended_stateless(
    conn: Connection, marker: dict[str, Any], grace: timedelta, limit: int
) -> list[dict[str, Any]]:
    """Sessions (id, owner_id) whose metadata holds `marker`, not busy, unchanged for `grace`."""
    cur = await conn.execute(
        _ENDED_STATELESS, {"marker": Jsonb(marker), "grace": grace, "limit": limit}
    )
    return await cur.fetchall()
