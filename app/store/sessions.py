"""Sessions: creation, listing, and the state changes the API makes (rename, cancel, follow-up,
delete). Each function runs inside the caller's transaction and writes the row, its events and
their NOTIFY together. A statement with forms registers each (`statements`): reading a session
with or without its row lock, and a status change by what else it clears."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from psycopg.types.json import Jsonb

from app.db.pool import Connection
from app.domain import (
    EPOCH_SHIFT,
    REQUEUEABLE,
    TERMINAL,
    OwnerEventType,
    SessionEventType,
    Status,
    check_owner_id,
    rfc3339,
    session_view,
)
from app.errors import (
    ApprovalNotPending,
    ClientToolNotPending,
    IdempotencyKeyReused,
    OwnerQueueFull,
    SessionAlreadyTerminal,
    SessionNotCompactable,
    SessionNotFound,
)
from app.store import limits as limit_store
from app.store.events import (
    append_owner_event,
    append_session_event,
    owner_event_ctes,
)
from app.store.notify import (
    RUNS_CHANNEL,
    WORK_KEY,
    cancel_key,
    inbox_key,
    notify,
    notifying,
    session_key,
)
from app.store.statements import statement

SESSION_COLUMNS = """
    id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
    error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
    delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
    approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
    assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
    schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
    created_by_key_id, priority
"""

# What a list reads of a session: every column, but only the start of the two big texts (up to
# 100,000 characters each), one character past the excerpt so `domain.session_summary` knows
# whether it cut them. `left` reads a TOASTed value's slice, not all of it.
EXCERPTED = ("prompt", "instructions")
LIST_COLUMNS = ", ".join(
    f"left({c}, %(excerpt)s::int + 1) AS {c}" if c in EXCERPTED else c
    for c in (c.strip() for c in SESSION_COLUMNS.split(","))
)

_OWNED_SESSION = f"""
    SELECT {SESSION_COLUMNS} FROM sessions
    WHERE id = %s AND owner_id = %s AND deleted_at IS NULL{{lock}}
"""
_GET_SESSION = statement("get_session", _OWNED_SESSION.format(lock=""))
_GET_SESSION_FOR_UPDATE = statement(
    "get_session_for_update", _OWNED_SESSION.format(lock=" FOR UPDATE")
)
# Any session by id, deleted or not.
_SESSION_BY_ID = statement("session_by_id", f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = %s")
_CREATE_SESSION = statement(
    "create_session",
    f"""
    INSERT INTO sessions (id, owner_id, title, status, model, prompt, script, tools, metadata,
                          instructions, model_settings, approval_required, assistant_id,
                          assistant_version, client_tools, compaction, schedule_id,
                          schedule_fired_at, delegates, parent_session_id, parent_tool_call_id,
                          depth, created_by_key_id, priority)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,
            %s, %s, %s)
    ON CONFLICT (parent_session_id, parent_tool_call_id) WHERE parent_session_id IS NOT NULL
    DO NOTHING
    RETURNING {SESSION_COLUMNS}
    """,
)
# An idle session and its `session_created` in one statement, outside any transaction: the
# event's session view is built by `session_view` from what the insert writes, and the two
# timestamps the database chose are set into it here (`rfc3339`'s form: milliseconds, cut).
_RFC3339 = '\'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\''
_CREATE_IDLE_SESSION = statement(
    "create_idle_session",
    f"""
    WITH s AS (
        INSERT INTO sessions (id, owner_id, title, status, model, prompt, metadata, model_settings,
                              created_by_key_id, priority)
        VALUES (%(id)s, %(owner)s, %(title)s, '{Status.IDLE}', %(model)s, '', %(metadata)s, '{{}}',
                %(key)s, %(priority)s)
        ON CONFLICT (id) DO NOTHING
        RETURNING {SESSION_COLUMNS}
    ), {
        owner_event_ctes(
            "s",
            f"'{OwnerEventType.SESSION_CREATED}'",
            "jsonb_build_object('session', %(view)s::jsonb || jsonb_build_object("
            f"'createdAt', to_char(s.created_at AT TIME ZONE 'UTC', {_RFC3339}),"
            f" 'updatedAt', to_char(s.updated_at AT TIME ZONE 'UTC', {_RFC3339})))",
        )
    }
    SELECT * FROM s
    """,
)
# The creates of the API (no parent, no schedule), any number of them in one statement: each
# one's Idempotency-Key taken (none given: NULL, and nothing taken), then, for each create whose
# key was taken or that gave none, the session, its opening `user_message` (seq 1, written with
# the row: `last_seq` starts at 1) and its `session_created`. A create with no row back: its key
# was taken before (a replay, or a reuse: 409), maybe by an earlier create of the same
# statement. The event's session view is built by `session_view` from what the insert writes
# (`create_sessions`), with the two timestamps the database chose set into it here. Every value
# goes as a text array, cast here (an array of NULLs has no type of its own), in binary:
# psycopg escapes a text array's every element with a regex, a tenth of the API's CPU per
# create. A new session's
# own stream is not notified: no one can follow a session before its create has answered.
_SESSION_VALUES = {
    "id": "uuid",
    "owner_id": "text",
    "title": "text",
    "status": "text",
    "model": "text",
    "prompt": "text",
    "script": "jsonb",
    "tools": "jsonb",
    "metadata": "jsonb",
    "instructions": "text",
    "model_settings": "jsonb",
    "approval_required": "jsonb",
    "assistant_id": "uuid",
    "assistant_version": "integer",
    "client_tools": "jsonb",
    "compaction": "jsonb",
    "delegates": "jsonb",
    "last_seq": "bigint",
    "created_by_key_id": "uuid",
    "priority": "integer",
}
_CREATE_VALUES = [*_SESSION_VALUES, "key", "fingerprint", "opening", "view"]
_CREATE_SESSIONS = statement(
    "create_sessions",
    f"""
    WITH c AS (
        SELECT * FROM unnest({", ".join(f"%({name})b::text[]" for name in _CREATE_VALUES)})
        WITH ORDINALITY AS c({", ".join(_CREATE_VALUES)}, n)
    ), k AS (
        INSERT INTO idempotency_keys (owner_id, key, request_hash, session_id)
        SELECT c.owner_id, c.key, c.fingerprint, c.id::uuid FROM c
        WHERE c.key IS NOT NULL ORDER BY c.n
        ON CONFLICT DO NOTHING
        RETURNING session_id
    ), s AS (
        INSERT INTO sessions ({", ".join(_SESSION_VALUES)})
        SELECT {", ".join(f"c.{name}::{kind}" for name, kind in _SESSION_VALUES.items())}
        FROM c WHERE c.key IS NULL OR c.id::uuid IN (SELECT session_id FROM k) ORDER BY c.n
        RETURNING {SESSION_COLUMNS}
    ), opening AS (
        INSERT INTO session_events (session_id, seq, attempt, type, data)
        SELECT s.id, 1, s.attempt, '{SessionEventType.USER_MESSAGE}', c.opening::jsonb
        FROM s JOIN c ON c.id::uuid = s.id WHERE s.last_seq = 1
    ), {
        owner_event_ctes(
            "s",
            f"'{OwnerEventType.SESSION_CREATED}'",
            "jsonb_build_object('session', (SELECT c.view::jsonb FROM c WHERE c.id::uuid = s.id)"
            " || jsonb_build_object("
            f"'createdAt', to_char(s.created_at AT TIME ZONE 'UTC', {_RFC3339}),"
            f" 'updatedAt', to_char(s.updated_at AT TIME ZONE 'UTC', {_RFC3339})))",
        )
    }
    SELECT * FROM s
    WHERE s.status <> '{Status.QUEUED}' OR {notifying(f"'{WORK_KEY}'", RUNS_CHANNEL)}
    """,
)
_LIST_SESSIONS = statement(
    "list_sessions",
    f"""
    SELECT {LIST_COLUMNS} FROM sessions
    WHERE owner_id = %(owner)s AND deleted_at IS NULL
      AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
      AND (%(after_ts)s::timestamptz IS NULL OR (created_at, id) < (%(after_ts)s, %(after_id)s))
      AND (%(pattern)s::text IS NULL OR title ILIKE %(pattern)s)
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)
_RENAME = statement(
    "rename_session",
    f"""
    UPDATE sessions SET title = %s, updated_at = clock_timestamp() WHERE id = %s
    RETURNING {SESSION_COLUMNS}
    """,
)
# An idle session's first message becomes its prompt.
_SET_PROMPT = statement("set_prompt", "UPDATE sessions SET prompt = %s WHERE id = %s")
_REQUEST_CANCEL = statement(
    "request_cancel",
    f"""
    UPDATE sessions SET cancel_requested_at = clock_timestamp(), updated_at = clock_timestamp()
    WHERE id = %s RETURNING {SESSION_COLUMNS}
    """,
)


# A locked session's new status, announced on the owner feed, in one statement; in three forms,
# by what else the change clears.
# The data of a `session_status` owner event, over the changed row `s`.
STATUS_EVENT_DATA = (
    "jsonb_build_object('status', s.status, 'attempt', s.attempt)"
    " || CASE WHEN s.error IS NULL THEN '{}' ELSE jsonb_build_object('error', s.error) END"
)


def _set_status(clears: str = "") -> str:
    data = STATUS_EVENT_DATA
    return f"""
    WITH updated AS (
        UPDATE sessions SET status = %s, error = %s, updated_at = clock_timestamp(){clears}
        WHERE id = %s RETURNING {SESSION_COLUMNS}
    ), {owner_event_ctes("updated", f"'{OwnerEventType.SESSION_STATUS}'", data)}
    SELECT * FROM updated
    """


SET_STATUS = statement("set_status", _set_status())
# Cancelled while no worker held it: a lease left by a run that stopped is cleared too.
SET_STATUS_CANCELLED = statement(
    "set_status_cancelled",
    _set_status(
        ",\n            cancel_requested_at = coalesce(cancel_requested_at, clock_timestamp()),"
        "\n            lease_worker_id = NULL, lease_pid = NULL, lease_expires_at = NULL"
    ),
)
# Re-queued by a follow-up: a cancel requested before the session settled is forgotten.
SET_STATUS_CANCEL_CLEARED = statement(
    "set_status_cancel_cleared", _set_status(", cancel_requested_at = NULL")
)


_FIRST_FIELDS = frozenset({"prompt", "title", "model", "script", "tools", "metadata"})


@dataclass(frozen=True)
class NewSession:
    prompt: str | None  # None: the session is created idle, with no event until a message
    title: str
    model: str
    script: list[dict[str, Any]] | None
    tools: list[str] | None
    metadata: dict[str, Any]
    instructions: str | None = None
    model_settings: dict[str, Any] = field(default_factory=dict)
    approval_required: list[str] | None = None
    # The assistant version the definition was copied from.
    assistant_id: UUID | None = None
    assistant_version: int | None = None
    # The request as given, hashed instead of the fields when it named an assistant: a retry
    # after the assistant changed asked for the same thing.
    request: dict[str, Any] | None = None
    # The tools the session's client declared ({name, description, parameters}), which it
    # answers itself; None: none.
    client_tools: list[dict[str, Any]] | None = None
    # `compaction {triggerTokens, ...}` as given (docs/compaction.md); None: never compacted.
    compaction: dict[str, Any] | None = None
    # The schedule that fired it, and the tick it fired for.
    schedule_id: UUID | None = None
    schedule_fired_at: datetime | None = None
    # The assistants it may delegate to, resolved (`agent.delegation`); None: none.
    delegates: list[dict[str, Any]] | None = None
    # A delegate's child: the parent session and its call that made it, and how many
    # delegations deep it is (docs/delegation.md).
    parent_session_id: UUID | None = None
    parent_tool_call_id: str | None = None
    depth: int = 0
    # The key that asked for it (a child: its parent's); None: no key (docs/tenants.md). Not
    # part of the fingerprint: another key of the owner retrying the create asked the same.
    created_by_key_id: UUID | None = None
    # Claims take higher priorities first (-100..100; docs/tenants.md).
    priority: int = 0

    def fingerprint(self) -> str:
        """A hash of the request, to tell a retried create from a reused Idempotency-Key."""
        if self.request is not None:
            return request_fingerprint(self.request)
        # Fields left at their defaults are left out, so a request hashes as it did before
        # those fields existed (a create retried across an upgrade is still a replay).
        fields = {
            k: v
            for k, v in self.__dict__.items()
            if (k in _FIRST_FIELDS or v) and k != "created_by_key_id"
        }
        if self.delegates:  # the ids asked for, not their tool names (a rename in between)
            fields["delegates"] = [d["assistantId"] for d in self.delegates]
        return _hash(fields)


def request_fingerprint(request: dict[str, Any]) -> str:
    """The fingerprint of a create that named an assistant, from its request as given."""
    return _hash({"request": request})


def _hash(fields: dict[str, Any]) -> str:
    body = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode()).hexdigest()


@dataclass(frozen=True)
class PageKey:
    created_at: datetime
    id: UUID


async def get_session(
    conn: Connection, owner_id: str, session_id: UUID, *, for_update: bool = False
) -> dict[str, Any]:
    """The owner's live session, or SessionNotFound (also for another owner's or a deleted one)."""
    cur = await conn.execute(
        _GET_SESSION_FOR_UPDATE if for_update else _GET_SESSION, (session_id, owner_id)
    )
    row = await cur.fetchone()
    if row is None:
        raise SessionNotFound()
    return row


async def session_row(conn: Connection, session_id: UUID) -> dict[str, Any] | None:
    """Any session by id, whoever's, deleted or not (whether an id is taken)."""
    cur = await conn.execute(_SESSION_BY_ID, (session_id,))
    return await cur.fetchone()


async def create_session(
    conn: Connection,
    owner_id: str,
    new: NewSession,
    idempotency_key: str | None,
    *,
    session_id: UUID | None = None,
) -> tuple[dict[str, Any], bool]:
    """Create a queued session with its opening `user_message` (seq 1), or an idle one with
    no event when `new` has no prompt; (row, created)."""
    session_id = session_id or uuid4()
    if idempotency_key is not None:
        cur = await conn.execute(
            """
            INSERT INTO idempotency_keys (owner_id, key, request_hash, session_id)
            VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING session_id
            """,
            (owner_id, idempotency_key, new.fingerprint(), session_id),
        )
        if await cur.fetchone() is None:
            replayed = await replay_idempotent(conn, owner_id, idempotency_key, new.fingerprint())
            assert replayed is not None
            return replayed, False

    cur = await conn.execute(
        _CREATE_SESSION,
        (
            session_id,
            owner_id,
            new.title,
            Status.IDLE if new.prompt is None else Status.QUEUED,
            new.model,
            new.prompt or "",
            Jsonb(new.script) if new.script is not None else None,
            Jsonb(new.tools) if new.tools is not None else None,
            Jsonb(new.metadata),
            new.instructions,
            Jsonb(new.model_settings),
            Jsonb(new.approval_required) if new.approval_required is not None else None,
            new.assistant_id,
            new.assistant_version,
            Jsonb(new.client_tools) if new.client_tools is not None else None,
            Jsonb(new.compaction) if new.compaction is not None else None,
            new.schedule_id,
            new.schedule_fired_at,
            Jsonb(new.delegates) if new.delegates is not None else None,
            new.parent_session_id,
            new.parent_tool_call_id,
            new.depth,
            new.created_by_key_id,
            new.priority,
        ),
    )
    row = await cur.fetchone()
    if row is None:  # the child of this call exists already: one child per call
        return await _child_of_call(conn, new), False
    if new.prompt is not None:
        event = await append_session_event(
            conn,
            session_id,
            SessionEventType.USER_MESSAGE,
            {"text": new.prompt, "delivery": "queued"},
        )
        # Re-read: the event moved last_seq and updated_at, and the answer must match a later GET.
        cur = await conn.execute(_SESSION_BY_ID, (session_id,))
        row = await cur.fetchone()
        assert row is not None and row["last_seq"] == event["seq"]
    await append_owner_event(
        conn, owner_id, session_id, OwnerEventType.SESSION_CREATED, {"session": session_view(row)}
    )
    if new.prompt is not None:
        await notify(conn, WORK_KEY)
    return row, True


@dataclass(frozen=True, eq=False)  # each create is itself, however alike two requests are
class ApiCreate:
    """A create of the API: no parent, no schedule (`create_session` makes those)."""

    owner_id: str
    new: NewSession
    idempotency_key: str | None


def _text(value: Any, kind: str) -> str | None:
    if value is None:
        return None
    if kind == "jsonb":
        return json.dumps(value, separators=(",", ":"))
    return str(value)


async def create_sessions(
    conn: Connection, creates: list[ApiCreate]
) -> list[dict[str, Any] | None]:
    """The creates in one statement (`_CREATE_SESSIONS`), each one's new session row, or None
    when its Idempotency-Key was taken before (`replay_idempotent` says by what request). One
    statement, so no transaction around it: the workers are told of queued sessions in it."""
    columns: dict[str, list[str | None]] = {name: [] for name in _CREATE_VALUES}
    ids = []
    for create in creates:
        new = create.new
        assert new.parent_session_id is None and new.schedule_id is None
        session_id = uuid4()
        ids.append(session_id)
        queued = new.prompt is not None
        written: dict[str, Any] = {
            "id": session_id,
            "owner_id": check_owner_id(create.owner_id),
            "title": new.title,
            "status": Status.QUEUED if queued else Status.IDLE,
            "model": new.model,
            "prompt": new.prompt or "",
            "script": new.script,
            "tools": new.tools,
            "metadata": new.metadata,
            "instructions": new.instructions,
            "model_settings": new.model_settings,
            "approval_required": new.approval_required,
            "assistant_id": new.assistant_id,
            "assistant_version": new.assistant_version,
            "client_tools": new.client_tools,
            "compaction": new.compaction,
            "delegates": new.delegates,
            "last_seq": 1 if queued else 0,
            "created_by_key_id": new.created_by_key_id,
            "priority": new.priority,
        }
        for name, kind in _SESSION_VALUES.items():
            columns[name].append(_text(written[name], kind))
        columns["key"].append(create.idempotency_key)
        columns["fingerprint"].append(new.fingerprint())
        opening = {"text": new.prompt, "delivery": "queued"} if queued else None
        columns["opening"].append(_text(opening, "jsonb"))
        columns["view"].append(_text(session_view(_new_row(written)), "jsonb"))
    cur = await conn.execute(_CREATE_SESSIONS, columns)
    made = {row["id"]: row for row in await cur.fetchall()}
    return [made.get(session_id) for session_id in ids]


_CHILD_OF_CALL = statement(
    "child_of_call",
    f"""
    SELECT {SESSION_COLUMNS} FROM sessions
    WHERE parent_session_id = %s AND parent_tool_call_id = %s
    """,
)


async def _child_of_call(conn: Connection, new: NewSession) -> dict[str, Any]:
    cur = await conn.execute(_CHILD_OF_CALL, (new.parent_session_id, new.parent_tool_call_id))
    row = await cur.fetchone()
    assert row is not None
    return row


async def create_idle_session(
    conn: Connection,
    owner_id: str,
    session_id: UUID,
    title: str,
    model: str,
    metadata: dict[str, Any],
    created_by_key_id: UUID | None = None,
    priority: int = 0,
) -> dict[str, Any] | None:
    """An idle session with no event (its definition comes with its first run) and its
    `session_created`, in one statement; None when a session with this id exists."""
    written: dict[str, Any] = {
        "id": session_id,
        "owner_id": owner_id,
        "title": title,
        "status": Status.IDLE,
        "model": model,
        "prompt": "",
        "metadata": metadata,
        "model_settings": {},
        "created_by_key_id": created_by_key_id,
        "priority": priority,
    }
    cur = await conn.execute(
        _CREATE_IDLE_SESSION,
        {
            "id": session_id,
            "owner": owner_id,
            "title": title,
            "model": model,
            "metadata": Jsonb(metadata),
            "key": created_by_key_id,
            "priority": priority,
            "view": Jsonb(session_view(_new_row(written))),
        },
    )
    return await cur.fetchone()


def _new_row(written: dict[str, Any]) -> dict[str, Any]:
    """A `sessions` row as the insert of `written` makes it, every other column at its default
    (the timestamps left to the database)."""
    row = dict.fromkeys(c.strip() for c in SESSION_COLUMNS.split(","))
    counters = ("attempt", "last_seq", "delivered_seq", "input_tokens", "output_tokens")
    row.update(dict.fromkeys((*counters, "cached_tokens", "resumes"), 0))
    return {**row, **written}


async def replay_idempotent(
    conn: Connection, owner_id: str, key: str, fingerprint: str
) -> dict[str, Any] | None:
    """The session an earlier create with this key made (None: no create used it), or
    IdempotencyKeyReused when that create's request had another fingerprint."""
    cur = await conn.execute(
        "SELECT request_hash, session_id FROM idempotency_keys WHERE owner_id = %s AND key = %s",
        (owner_id, key),
    )
    found = await cur.fetchone()
    if found is None:
        return None
    if found["request_hash"] != fingerprint:
        raise IdempotencyKeyReused()
    cur = await conn.execute(_SESSION_BY_ID, (found["session_id"],))
    row = await cur.fetchone()
    if row is None or row["deleted_at"] is not None:  # deleted (or purged) since
        raise SessionNotFound()
    return row


# The owner's cursor as a position (`domain.position`): its last id, with that event's epoch.
_OWNER_POSITION = f"""
    SELECT coalesce((
        SELECT (coalesce(e.epoch, 0)::bigint << {EPOCH_SHIFT}) | c.last_id FROM owner_cursors c
        LEFT JOIN owner_events e ON e.owner_id = c.owner_id AND e.id = c.last_id
        WHERE c.owner_id = %s
    ), 0) AS c
"""


async def list_sessions(
    conn: Connection,
    owner_id: str,
    statuses: list[str] | None,
    limit: int,
    after: PageKey | None,
    search: str | None = None,
    excerpt_chars: int = 200,
) -> tuple[list[dict[str, Any]], int, PageKey | None]:
    """One page, newest first, plus the owner-event cursor read in the same snapshot; with
    `search`, only the sessions whose title contains it (case-insensitive, taken literally).
    Its rows hold `excerpt_chars` + 1 characters of `prompt` and `instructions` at most
    (`LIST_COLUMNS`): `domain.session_summary` views them.

    Runs in a REPEATABLE READ transaction: the rows and the cursor come from one snapshot, so
    streaming from the cursor afterwards misses nothing and repeats nothing.
    """
    await read_one_snapshot(conn)
    cur = await conn.execute(_OWNER_POSITION, (owner_id,))
    cursor_row = await cur.fetchone()
    assert cursor_row is not None
    cur = await conn.execute(
        _LIST_SESSIONS,
        {
            "owner": owner_id,
            "statuses": statuses,
            "after_ts": after.created_at if after else None,
            "after_id": after.id if after else None,
            "limit": limit + 1,
            "pattern": None if search is None else f"%{like_literal(search)}%",
            "excerpt": excerpt_chars,
        },
    )
    rows = await cur.fetchall()
    next_key = None
    if len(rows) > limit:
        rows = rows[:limit]
        next_key = PageKey(rows[-1]["created_at"], rows[-1]["id"])
    return rows, int(cursor_row["c"]), next_key


async def read_one_snapshot(conn: Connection) -> None:
    """Make the caller's transaction, before its first read, read one snapshot and write nothing."""
    await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")


def like_literal(text: str) -> str:
    """`text` matched literally by LIKE (whose escape character is a backslash)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


async def rename(conn: Connection, owner_id: str, session_id: UUID, title: str) -> dict[str, Any]:
    await get_session(conn, owner_id, session_id, for_update=True)
    cur = await conn.execute(_RENAME, (title, session_id))
    row = await cur.fetchone()
    assert row is not None
    await append_owner_event(
        conn, owner_id, session_id, OwnerEventType.SESSION_TITLE, {"title": title}
    )
    return row


async def set_status(
    conn: Connection,
    row: dict[str, Any],
    status: Status,
    *,
    error: dict[str, Any] | None = None,
    query: str = SET_STATUS,
) -> dict[str, Any]:
    """Change a locked session's status and announce it on the owner feed, in one statement
    (`query`: SET_STATUS, or a form of it that clears more)."""
    cur = await conn.execute(
        query, (status, Jsonb(error) if error is not None else None, row["id"])
    )
    updated = await cur.fetchone()
    assert updated is not None
    return updated


async def request_cancel(conn: Connection, owner_id: str, session_id: UUID) -> dict[str, Any]:
    """Cancel: settle an idle, queued or waiting session at once; record the request on a
    running one. Its delegates' children are cancelled too (docs/delegation.md), and a child
    settled here answers its parent's call.

    Idempotent: a second request on a running session changes nothing.
    """
    await lock_parent(conn, session_id)
    row = await get_session(conn, owner_id, session_id, for_update=True)
    cancelled = await _cancel_one(conn, owner_id, row)
    for child in await live_children(conn, session_id):
        if Status(child["status"]) not in TERMINAL:
            await request_cancel(conn, owner_id, child["id"])
    return cancelled


async def _cancel_one(conn: Connection, owner_id: str, row: dict[str, Any]) -> dict[str, Any]:
    session_id = row["id"]
    status = Status(row["status"])
    if status in TERMINAL:
        raise SessionAlreadyTerminal(status)
    if status == Status.RUNNING:
        if row["cancel_requested_at"] is not None:
            return row
        cur = await conn.execute(_REQUEST_CANCEL, (session_id,))
        updated = await cur.fetchone()
        assert updated is not None
        await append_owner_event(
            conn,
            owner_id,
            session_id,
            OwnerEventType.SESSION_CANCEL_REQUESTED,
            {"requestedAt": rfc3339(updated["cancel_requested_at"])},
        )
        await notify(conn, cancel_key(session_id))
        return updated
    # Idle, queued or waiting: no worker holds it, so the API settles it here, under the row lock
    # that a claim would also need; a cancel that arrives before any claim always wins.
    await append_session_event(
        conn,
        session_id,
        SessionEventType.SESSION_END,
        {"status": "cancelled", "note": f"cancelled while {status}"},
    )
    settled = await set_status(
        conn,
        row,
        Status.CANCELLED,
        query=SET_STATUS_CANCELLED,
    )
    await answer_parent(conn, settled, Status.CANCELLED, None)
    return settled


async def post_message(
    conn: Connection,
    owner_id: str,
    session_id: UUID,
    text: str,
    *,
    locked: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    max_queued: int | None = None,
) -> tuple[dict[str, Any], str]:
    """Log a follow-up message; steer a running session, queue an idle, waiting or terminal
    one. The first message of a session created idle becomes its prompt. `locked`: the
    session's row as this transaction locked it, if the caller did (one read less). `extra`:
    more fields of the event's data (an Agent Protocol run's metadata). `max_queued`: the
    owner's limit of queued sessions (OwnerQueueFull if this would queue one past it)."""
    row = locked or await get_session(conn, owner_id, session_id, for_update=True)
    status = Status(row["status"])
    if (
        max_queued is not None
        and status in REQUEUEABLE
        and await limit_store.queued_at_least(conn, owner_id, max_queued)
    ):
        raise OwnerQueueFull(max_queued)
    if not row["prompt"]:  # a prompt has at least one character: none yet
        await conn.execute(_SET_PROMPT, (text, session_id))
    delivery = "steer" if status == Status.RUNNING else "queued"
    event = await append_session_event(
        conn,
        session_id,
        SessionEventType.USER_MESSAGE,
        {"text": text, "delivery": delivery, **(extra or {})},
    )
    if status in REQUEUEABLE:
        await set_status(conn, row, Status.QUEUED, query=SET_STATUS_CANCEL_CLEARED)
        await notify(conn, WORK_KEY)
    else:
        await notify(conn, inbox_key(session_id))
    return event, delivery


# A compaction is asked of a session in these: a running or queued one takes it at its next
# step, a waiting or succeeded one is queued for it (and settles as it was).
COMPACTABLE = frozenset({Status.RUNNING, Status.QUEUED, Status.WAITING, Status.SUCCEEDED})


async def request_compaction(
    conn: Connection, owner_id: str, session_id: UUID
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Log `compaction_requested` (the worker honours it: docs/compaction.md) and queue a
    session no run holds; (the event, the session row). SessionNotCompactable for an idle
    (nothing to compact), failed or cancelled one (a run would take up its conversation)."""
    row = await get_session(conn, owner_id, session_id, for_update=True)
    status = Status(row["status"])
    if status not in COMPACTABLE:
        raise SessionNotCompactable(f"the session is {status}: nothing to compact for it")
    event = await append_session_event(conn, session_id, SessionEventType.COMPACTION_REQUESTED, {})
    if status in REQUEUEABLE:
        row = await set_status(conn, row, Status.QUEUED)
        await notify(conn, WORK_KEY)
    else:
        await notify(conn, inbox_key(session_id))
    return event, row


async def decide_approval(
    conn: Connection,
    owner_id: str,
    session_id: UUID,
    call_id: str,
    approved: bool,
    reason: str | None,
    extra: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Log a decision on a tool call waiting for approval, and re-queue a waiting session so
    a worker acts on it; (the decision event, the session row). A running session takes it
    before it would wait (the run's `finish` sees it); a terminal one has nothing pending.
    `extra`: more fields of the event's data (an Agent Protocol run's metadata)."""
    row = await get_session(conn, owner_id, session_id, for_update=True)
    status = Status(row["status"])
    if status in TERMINAL:
        raise ApprovalNotPending(f"the session is {status}: no tool call waits for approval")
    cur = await conn.execute(
        """
        SELECT type FROM session_events
        WHERE session_id = %s AND data->>'toolCallId' = %s
          AND type IN ('tool_approval_requested', 'tool_approval_decided', 'tool_result')
        """,
        (session_id, call_id),
    )
    seen = {r["type"] for r in await cur.fetchall()}
    if seen != {SessionEventType.TOOL_APPROVAL_REQUESTED}:
        detail = (
            "this tool call was already decided or answered"
            if seen
            else "no tool call of this session with this id waits for approval"
        )
        raise ApprovalNotPending(detail)
    decision: dict[str, Any] = {"toolCallId": call_id, "approved": approved, **(extra or {})}
    if reason is not None:
        decision["reason"] = reason
    event = await append_session_event(
        conn, session_id, SessionEventType.TOOL_APPROVAL_DECIDED, decision
    )
    if status == Status.WAITING:
        row = await set_status(conn, row, Status.QUEUED)
        await notify(conn, WORK_KEY)
    else:
        await notify(conn, inbox_key(session_id))
    return event, row


_CLIENT_CALL_EVENTS = statement(
    "client_call_events",
    f"""
    SELECT seq, type, data FROM session_events
    WHERE session_id = %s AND data->>'toolCallId' = %s
      AND type IN ('{SessionEventType.CLIENT_TOOL_CALL}', '{SessionEventType.CLIENT_TOOL_RESULT}',
                   '{SessionEventType.TOOL_RESULT}')
    ORDER BY seq
    """,
)


async def post_client_result(
    conn: Connection,
    owner_id: str,
    session_id: UUID,
    call_id: str,
    content: str,
    is_error: bool,
    extra: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """Log the result a client posts for a call of one of its tools (`client_tool_call`),
    and re-queue a waiting session so a worker answers the call with it; (the result event,
    the session row, whether it was written). The same result posted again is matched: its
    first event, nothing written. ClientToolNotPending for a call that does not wait for its
    client (unknown, answered otherwise, or a finished session). `extra`: more fields of the
    event's data (an AG-UI run's metadata)."""
    row = await get_session(conn, owner_id, session_id, for_update=True)
    cur = await conn.execute(_CLIENT_CALL_EVENTS, (session_id, call_id))
    seen = {r["type"]: r for r in reversed(await cur.fetchall())}  # the first of each type
    posted = seen.get(SessionEventType.CLIENT_TOOL_RESULT)
    if posted is not None and (posted["data"].get("content"), posted["data"].get("isError")) == (
        content,
        is_error,
    ):
        return posted, row, False
    status = Status(row["status"])
    if SessionEventType.CLIENT_TOOL_CALL not in seen:
        raise ClientToolNotPending("no call of a client tool of this session has this id")
    if posted is not None or SessionEventType.TOOL_RESULT in seen:
        raise ClientToolNotPending("this call was already answered with another result")
    if status in TERMINAL:
        raise ClientToolNotPending(f"the session is {status}: no call waits for a result")
    result = {"toolCallId": call_id, "content": content, "isError": is_error, **(extra or {})}
    event = await append_session_event(
        conn, session_id, SessionEventType.CLIENT_TOOL_RESULT, result
    )
    if status == Status.WAITING:
        row = await set_status(conn, row, Status.QUEUED)
        await notify(conn, WORK_KEY)
    else:
        await notify(conn, inbox_key(session_id))
    return event, row, True


async def soft_delete(conn: Connection, owner_id: str, session_id: UUID) -> None:
    """Hide the session from lists and streams, cancelling it first if it is not terminal;
    its delegates' children with it (docs/delegation.md)."""
    await lock_parent(conn, session_id)
    row = await get_session(conn, owner_id, session_id, for_update=True)
    if Status(row["status"]) not in TERMINAL:
        await request_cancel(conn, owner_id, session_id)
    await conn.execute(
        "UPDATE sessions SET deleted_at = clock_timestamp(), updated_at = clock_timestamp()"
        " WHERE id = %s",
        (session_id,),
    )
    # The schedules bound to it (a thread's crons) go with it; the purge would delete them.
    await conn.execute("DELETE FROM schedules WHERE session_id = %s", (session_id,))
    await append_owner_event(conn, owner_id, session_id, OwnerEventType.SESSION_DELETED, {})
    await notify(conn, session_key(session_id))  # open session streams close
    for child in await live_children(conn, session_id):
        await soft_delete(conn, owner_id, child["id"])


# --- delegation (docs/delegation.md) --------------------------------------------------------

# A child's parent is locked before the child (ancestors first), by whoever locks both: the
# child's end, a cancel or delete of either. The parent's own writes lock only its row.
_LOCK_PARENT = statement(
    "lock_parent",
    """
    SELECT FROM sessions
    WHERE id = (SELECT parent_session_id FROM sessions WHERE id = %s) FOR UPDATE
    """,
)
_LIVE_CHILDREN = statement(
    "live_children",
    """
    SELECT id, status FROM sessions WHERE parent_session_id = %s AND deleted_at IS NULL
    ORDER BY created_at, id
    """,
)
# The parent a child's end answers (not deleted), and the child's last assistant message.
_PARENT_FOR_ANSWER = statement(
    "parent_for_answer",
    f"""
    SELECT p.id, p.status, (
        SELECT e.data->>'text' FROM session_events e
        WHERE e.session_id = %(child)s AND e.type = '{SessionEventType.ASSISTANT_MESSAGE}'
        ORDER BY e.seq DESC LIMIT 1) AS answer
    FROM sessions p WHERE p.id = %(parent)s AND p.deleted_at IS NULL
    """,
)


async def lock_parent(conn: Connection, session_id: UUID) -> None:
    """Lock the session's parent row, if it has one (before the session's own)."""
    await conn.execute(_LOCK_PARENT, (session_id,))


async def live_children(conn: Connection, session_id: UUID) -> list[dict[str, Any]]:
    cur = await conn.execute(_LIVE_CHILDREN, (session_id,))
    return await cur.fetchall()


async def answer_parent(
    conn: Connection, child: dict[str, Any], status: Status, error: dict[str, Any] | None
) -> None:
    """A child settled `status` (terminal): log its end on its parent as the result of the
    call that made it, `delegate_result`, and re-queue a waiting parent so a worker answers
    the call; a running one hears it through its inbox. A parent already finished or deleted
    is left alone. In the caller's transaction, which holds the parent's lock (`lock_parent`)."""
    if child.get("parent_session_id") is None:
        return
    cur = await conn.execute(
        _PARENT_FOR_ANSWER, {"child": child["id"], "parent": child["parent_session_id"]}
    )
    parent = await cur.fetchone()
    if parent is None or Status(parent["status"]) in TERMINAL:
        return
    result: dict[str, Any] = {
        "toolCallId": child["parent_tool_call_id"],
        "childSessionId": str(child["id"]),
        "status": str(status),
    }
    if status == Status.SUCCEEDED:
        result["answer"] = parent["answer"] or ""
    if error is not None:
        result["error"] = error
    await append_session_event(conn, parent["id"], SessionEventType.DELEGATE_RESULT, result)
    if Status(parent["status"]) == Status.WAITING:
        await set_status(conn, parent, Status.QUEUED)
        await notify(conn, WORK_KEY)
    else:
        await notify(conn, inbox_key(parent["id"]))
