"""Schedules: an owner's cron timetables, and their firings. Every function runs inside the
caller's transaction and takes the owner where a request asks: another owner's schedule is
ScheduleNotFound, like an unknown one.

A firing is one transaction of whoever fires it (`lock_due`, then the session, the firing's
record and the schedule's `advance`): the due row is locked with SKIP LOCKED, and a process
that reads it after the firing committed sees `next_run_at` moved on, so it is not due again.
`sessions_schedule_tick` (one session per schedule and tick) holds even against a clock that
went back."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from psycopg.types.json import Jsonb

from app.db.pool import Connection
from app.domain import (
    MAX_SCHEDULE_FIRINGS,
    MAX_SCHEDULES_PER_OWNER,
    TERMINAL,
    Status,
    default_title,
)
from app.errors import ScheduleLimitReached, ScheduleNotFound
from app.store.sessions import NewSession, PageKey
from app.store.statements import statement

# A session in one of these has no run in progress (`idle`: a session created without a
# prompt, which a schedule bound to it may post to).
ENDED = TERMINAL | {Status.IDLE}


@dataclass(frozen=True)
class ScheduleState:
    """What a schedule row holds besides its identity: written whole by create and update."""

    cron: str
    timezone: str
    enabled: bool
    overlap: str
    title: str | None
    prompt: str
    # The session fields as the request gave them (camelCase).
    request: dict[str, Any]
    # What each firing's session copies (`definition_of`).
    definition: dict[str, Any]
    next_run_at: datetime | None
    pending_tick: datetime | None = None
    # The session each tick posts its prompt to (a thread's cron); None: each creates one.
    session_id: UUID | None = None
    # No tick after it fires.
    end_time: datetime | None = None
    # What an Agent Protocol cron's create gave (assistant_id, payload, metadata, ...).
    agent_protocol: dict[str, Any] | None = None


# The NewSession fields a schedule keeps as its definition; prompt and title are its own.
_DEFINITION_FIELDS = (
    "model",
    "script",
    "tools",
    "metadata",
    "instructions",
    "model_settings",
    "approval_required",
    "assistant_id",
    "assistant_version",
    "client_tools",
    "compaction",
    "delegates",
)


def definition_of(new: NewSession) -> dict[str, Any]:
    """The definition a schedule stores for the session `new` describes, as JSON."""
    fields = asdict(new)
    definition = {name: fields[name] for name in _DEFINITION_FIELDS}
    if definition["assistant_id"] is not None:
        definition["assistant_id"] = str(definition["assistant_id"])
    return definition


def session_of(row: dict[str, Any], tick: datetime) -> NewSession:
    """The session a firing of the schedule `row` for `tick` creates."""
    definition = dict(row["definition"])
    if definition["assistant_id"] is not None:
        definition["assistant_id"] = UUID(definition["assistant_id"])
    return NewSession(
        prompt=row["prompt"],
        title=row["title"] or default_title(row["prompt"]),
        schedule_id=row["id"],
        schedule_fired_at=tick,
        **definition,
    )


SCHEDULE_COLUMNS = """
    id, owner_id, cron, timezone, enabled, overlap, title, prompt, request, definition,
    next_run_at, pending_tick, last_session_id, session_id, end_time, agent_protocol,
    created_at, updated_at
"""
_STATE_COLUMNS = tuple(ScheduleState.__dataclass_fields__)

_INSERT = statement(
    "insert_schedule",
    f"""
    INSERT INTO schedules (id, owner_id, {", ".join(_STATE_COLUMNS)})
    VALUES (%(id)s, %(owner)s, {", ".join(f"%({c})s" for c in _STATE_COLUMNS)})
    RETURNING {SCHEDULE_COLUMNS}
    """,
)
_UPDATE = statement(
    "update_schedule",
    f"""
    UPDATE schedules SET {", ".join(f"{c} = %({c})s" for c in _STATE_COLUMNS)},
        updated_at = clock_timestamp()
    WHERE id = %(id)s AND owner_id = %(owner)s
    RETURNING {SCHEDULE_COLUMNS}
    """,
)
_OWNED = f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = %s AND owner_id = %s{{lock}}"
_GET = statement("get_schedule", _OWNED.format(lock=""))
_GET_FOR_UPDATE = statement("get_schedule_for_update", _OWNED.format(lock=" FOR UPDATE"))
_LIST = statement(
    "list_schedules",
    f"""
    SELECT {SCHEDULE_COLUMNS} FROM schedules
    WHERE owner_id = %(owner)s
      AND (%(after_ts)s::timestamptz IS NULL OR (created_at, id) < (%(after_ts)s, %(after_id)s))
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)
# The statuses in which the session a schedule fired last (or the one it posts to) has ended:
# a queued firing may go.
_TERMINAL = ", ".join(f"'{status}'" for status in sorted(ENDED))
# One schedule to fire: due, or with a queued firing whose wait is over (the session it waits
# for, the one it is bound to or else the one it fired last, has ended, or is gone). Its row
# stays locked until the caller's transaction ends; a row another process holds is passed over.
_LOCK_DUE = statement(
    "lock_due_schedule",
    f"""
    WITH t AS (SELECT clock_timestamp() AS now)
    SELECT {", ".join(f"sc.{c.strip()}" for c in SCHEDULE_COLUMNS.split(","))},
           t.now, s.status AS last_status
    FROM t, schedules sc
        LEFT JOIN sessions s ON s.id = coalesce(sc.session_id, sc.last_session_id)
    WHERE sc.enabled
      AND (sc.next_run_at <= t.now
           OR (sc.pending_tick IS NOT NULL AND (s.status IS NULL OR s.status IN ({_TERMINAL}))))
    ORDER BY sc.next_run_at
    LIMIT 1
    FOR UPDATE OF sc SKIP LOCKED
    """,
)
# The firing of a tick; a queued firing's record becomes the firing once it fires.
_RECORD_FIRING = statement(
    "record_schedule_firing",
    """
    INSERT INTO schedule_firings (schedule_id, tick, outcome, catch_up, session_id, detail)
    VALUES (%(schedule)s, %(tick)s, %(outcome)s, %(catch_up)s, %(session)s, %(detail)s)
    ON CONFLICT (schedule_id, tick) DO UPDATE
        SET outcome = excluded.outcome, session_id = excluded.session_id,
            detail = excluded.detail, at = clock_timestamp()
    """,
)
_PRUNE_FIRINGS = statement(
    "prune_schedule_firings",
    f"""
    DELETE FROM schedule_firings WHERE schedule_id = %(schedule)s AND tick < (
        SELECT tick FROM schedule_firings WHERE schedule_id = %(schedule)s
        ORDER BY tick DESC OFFSET {MAX_SCHEDULE_FIRINGS - 1} LIMIT 1
    )
    """,
)
_FIRINGS = statement(
    "schedule_firings",
    """
    SELECT f.schedule_id, f.tick, f.at, f.outcome, f.catch_up, f.session_id, f.detail,
           s.status AS session_status
    FROM schedule_firings f LEFT JOIN sessions s ON s.id = f.session_id
    WHERE f.schedule_id = ANY(%s)
    ORDER BY f.schedule_id, f.tick DESC
    """,
)


async def create(conn: Connection, owner_id: str, state: ScheduleState) -> dict[str, Any]:
    """A new schedule; ScheduleLimitReached past MAX_SCHEDULES_PER_OWNER."""
    # One owner's creates take turns, so two of them cannot both pass the count.
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('schedules:' || %s))", (owner_id,))
    cur = await conn.execute("SELECT count(*) AS n FROM schedules WHERE owner_id = %s", (owner_id,))
    counted = await cur.fetchone()
    assert counted is not None
    if counted["n"] >= MAX_SCHEDULES_PER_OWNER:
        raise ScheduleLimitReached(
            f"this owner has {MAX_SCHEDULES_PER_OWNER} schedules, the most allowed"
            " (MAX_SCHEDULES_PER_OWNER); delete one first"
        )
    cur = await conn.execute(_INSERT, {"id": uuid4(), "owner": owner_id, **_params(state)})
    row = await cur.fetchone()
    assert row is not None
    return row


async def get(
    conn: Connection, owner_id: str, schedule_id: UUID, *, for_update: bool = False
) -> dict[str, Any]:
    """The owner's schedule, or ScheduleNotFound."""
    cur = await conn.execute(_GET_FOR_UPDATE if for_update else _GET, (schedule_id, owner_id))
    row = await cur.fetchone()
    if row is None:
        raise ScheduleNotFound()
    return row


async def update(
    conn: Connection, owner_id: str, schedule_id: UUID, state: ScheduleState
) -> dict[str, Any]:
    """Write the schedule's new state (the caller holds its row lock, `get(for_update)`)."""
    cur = await conn.execute(_UPDATE, {"id": schedule_id, "owner": owner_id, **_params(state)})
    row = await cur.fetchone()
    if row is None:
        raise ScheduleNotFound()
    return row


async def delete(conn: Connection, owner_id: str, schedule_id: UUID) -> None:
    """Delete the schedule and its firings' records; the sessions it fired stay. A firing
    in flight holds the row lock, so the delete waits for it, and none comes after."""
    cur = await conn.execute(
        "DELETE FROM schedules WHERE id = %s AND owner_id = %s", (schedule_id, owner_id)
    )
    if cur.rowcount == 0:
        raise ScheduleNotFound()


async def page(
    conn: Connection, owner_id: str, limit: int, after: PageKey | None
) -> tuple[list[dict[str, Any]], PageKey | None]:
    """One page of the owner's schedules, newest first, and the key of the next."""
    cur = await conn.execute(
        _LIST,
        {
            "owner": owner_id,
            "after_ts": after.created_at if after else None,
            "after_id": after.id if after else None,
            "limit": limit + 1,
        },
    )
    rows = await cur.fetchall()
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, PageKey(rows[-1]["created_at"], rows[-1]["id"])


async def firings(conn: Connection, schedule_ids: list[UUID]) -> dict[UUID, list[dict[str, Any]]]:
    """The latest firings of each schedule, newest first, with their sessions' statuses."""
    cur = await conn.execute(_FIRINGS, (schedule_ids,))
    found: dict[UUID, list[dict[str, Any]]] = {sid: [] for sid in schedule_ids}
    for row in await cur.fetchall():
        found[row["schedule_id"]].append(row)
    return found


async def now(conn: Connection) -> datetime:
    """The database's clock: every process reads the same time."""
    cur = await conn.execute("SELECT clock_timestamp() AS now")
    row = await cur.fetchone()
    assert row is not None
    moment: datetime = row["now"]
    return moment


# --- firing ---------------------------------------------------------------------------------


async def lock_due(conn: Connection) -> dict[str, Any] | None:
    """One schedule to fire, locked (see _LOCK_DUE), with the database's `now` and the status
    of the session it fired last (`last_status`, None when there is none); None: nothing due."""
    cur = await conn.execute(_LOCK_DUE)
    return await cur.fetchone()


async def record_firing(
    conn: Connection,
    schedule_id: UUID,
    tick: datetime,
    outcome: str,
    *,
    catch_up: bool = False,
    session_id: UUID | None = None,
    detail: str | None = None,
) -> None:
    """Record what the schedule did at `tick`; only the latest MAX_SCHEDULE_FIRINGS are kept."""
    params = {
        "schedule": schedule_id,
        "tick": tick,
        "outcome": outcome,
        "catch_up": catch_up,
        "session": session_id,
        "detail": detail,
    }
    await conn.execute(_RECORD_FIRING, params)
    await conn.execute(_PRUNE_FIRINGS, {"schedule": schedule_id})


async def advance(
    conn: Connection,
    schedule_id: UUID,
    next_run_at: datetime | None,
    pending_tick: datetime | None,
    last_session_id: UUID | None,
) -> None:
    """Move the locked schedule on to its next tick."""
    await conn.execute(
        "UPDATE schedules SET next_run_at = %s, pending_tick = %s, last_session_id = %s"
        " WHERE id = %s",
        (next_run_at, pending_tick, last_session_id, schedule_id),
    )


async def skip_failed(
    conn: Connection,
    schedule_id: UUID,
    tick: datetime,
    next_run_at: datetime | None,
    detail: str,
) -> None:
    """After a firing of the locked schedule that failed (rolled back to a savepoint): move it
    to `next_run_at` (None: pause it), clear a queued firing, and record the failure (unless
    `tick` has a record of another outcome already: it fired once, whatever failed after)."""
    await conn.execute(
        "UPDATE schedules SET next_run_at = %(next)s, pending_tick = NULL,"
        " enabled = enabled AND %(next)s::timestamptz IS NOT NULL WHERE id = %(id)s",
        {"next": next_run_at, "id": schedule_id},
    )
    await conn.execute(
        "INSERT INTO schedule_firings (schedule_id, tick, outcome, detail)"
        " VALUES (%s, %s, 'failed', %s) ON CONFLICT DO NOTHING",
        (schedule_id, tick, detail),
    )
    await conn.execute(_PRUNE_FIRINGS, {"schedule": schedule_id})


def _params(state: ScheduleState) -> dict[str, Any]:
    params = asdict(state)
    params["request"] = Jsonb(state.request)
    params["definition"] = Jsonb(state.definition)
    params["agent_protocol"] = None if state.agent_protocol is None else Jsonb(state.agent_protocol)
    return params
