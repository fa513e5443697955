"""The schedules API of SPEC section 12: an owner's cron timetables, each tick of which creates
a session (fired by the workers, runtime/scheduler.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Path, Query, Response, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from app import cron
from app.api import schemas
from app.api.definitions import resolve_session
from app.api.deps import Caller, CallerDep, DatabaseDep, Owner, ServicesDep
from app.api.openapi import problems
from app.api.sessions import (
    ANY_ERRORS,
    BODY_ERRORS,
    decode_page_token,
    encode_page_token,
    parse_id,
    parse_session_id,
)
from app.domain import schedule_view
from app.errors import ScheduleCronInvalid, ScheduleNotFound, ScheduleTimezoneInvalid
from app.services import Services
from app.store import schedules as schedule_store
from app.store import sessions as session_store
from app.store.schedules import ScheduleState, definition_of

router = APIRouter(prefix="/api/schedules", tags=["schedules"])

# A schedule's operations: 404 for an id that names none of the caller's schedules.
SCHEDULE_ERRORS = (*ANY_ERRORS, 404)

ScheduleId = Annotated[
    str, Path(description="The schedule's id.", json_schema_extra={"format": "uuid"})
]


def parse_schedule_id(raw: str) -> UUID:
    return parse_id(raw, ScheduleNotFound)


def parse_cron(expression: str, timezone: str, now: datetime) -> cron.Cron:
    """The body's cron in its zone; 422 with a code naming which is bad."""
    try:
        return cron.parse(expression, timezone, now)
    except cron.TimezoneInvalid as exc:
        raise ScheduleTimezoneInvalid(str(exc)) from None
    except cron.CronInvalid as exc:
        raise ScheduleCronInvalid(str(exc)) from None


def _session_request(body: schemas.CreateSchedule) -> dict[str, Any]:
    """The session fields the body gave, as a PATCH merges into them."""
    given = body.model_dump(mode="json", exclude_unset=True)
    return {
        k: v
        for k, v in given.items()
        if k not in schemas.SCHEDULE_FIELDS and k != "sessionId" and v is not None
    }


async def _state(
    services: Services,
    caller: Caller,
    body: schemas.CreateSchedule,
    now: datetime,
    definition: dict[str, Any] | None = None,
    stored: dict[str, Any] | None = None,
) -> ScheduleState:
    """What to store for `body`, its next tick the first after `now`; `definition`: the one
    stored already, when no session field changed; `stored`: the schedule's row, whose
    bound session, end time and cron fields stay."""
    parsed = parse_cron(body.cron, body.timezone, now)
    if definition is None:
        definition = definition_of(await resolve_session(services, caller, body))
    session_id: UUID | None = None
    if stored is not None:
        session_id = stored["session_id"]
    elif body.sessionId is not None:
        session_id = UUID(body.sessionId)
    end_time = stored["end_time"] if stored else None
    next_run_at = parsed.next_after(now) if body.enabled else None
    return ScheduleState(
        session_id=session_id,
        end_time=end_time,
        agent_protocol=stored["agent_protocol"] if stored else None,
        cron=parsed.expression,
        timezone=body.timezone,
        enabled=body.enabled,
        overlap=str(body.overlap),
        title=body.title,
        prompt=body.prompt,
        request=_session_request(body),
        definition=definition,
        next_run_at=past_end(next_run_at, end_time),
    )


def past_end(tick: datetime | None, end_time: datetime | None) -> datetime | None:
    """`tick`, or None when it falls after the schedule's end time."""
    return None if tick is None or (end_time is not None and tick > end_time) else tick


@router.post(
    "",
    operation_id="createSchedule",
    status_code=status.HTTP_201_CREATED,
    response_model=schemas.Schedule,
    # ASSISTANT_NOT_FOUND; SCHEDULE_LIMIT_REACHED
    responses=problems(*ANY_ERRORS, *BODY_ERRORS, 404, 409),
)
async def create_schedule(
    body: schemas.CreateSchedule, caller: CallerDep, services: ServicesDep, response: Response
) -> dict[str, Any]:
    """Its first tick is the first after now. The session fields are checked as a create's
    (an `assistantId` is resolved now: each firing runs that version)."""
    owner = caller.owner
    async with services.db.connection() as conn:
        now = await schedule_store.now(conn)
        if body.sessionId is not None:  # the caller's session, or 404
            await session_store.get_session(conn, owner, parse_session_id(body.sessionId))
    state = await _state(services, caller, body, now)
    async with services.db.transaction() as conn:
        row = await schedule_store.create(conn, owner, state)
    response.headers["Location"] = f"/api/schedules/{row['id']}"
    return schedule_view(row, [])


@router.get(
    "",
    operation_id="listSchedules",
    response_model=schemas.ScheduleList,
    responses=problems(*ANY_ERRORS, 400, 422),  # INVALID_PAGE_TOKEN, a bad limit
)
async def list_schedules(
    owner: Owner,
    db: DatabaseDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    page_token: Annotated[str | None, Query(alias="pageToken", max_length=512)] = None,
) -> dict[str, Any]:
    """The owner's schedules, newest first."""
    after = decode_page_token(page_token) if page_token else None
    async with db.connection() as conn:
        rows, next_key = await schedule_store.page(conn, owner, limit, after)
        firings = await schedule_store.firings(conn, [row["id"] for row in rows])
    return {
        "schedules": [schedule_view(row, firings[row["id"]]) for row in rows],
        "nextPageToken": encode_page_token(next_key) if next_key else None,
    }


@router.get(
    "/{schedule_id}",
    operation_id="getSchedule",
    response_model=schemas.Schedule,
    responses=problems(*SCHEDULE_ERRORS),
)
async def get_schedule(schedule_id: ScheduleId, owner: Owner, db: DatabaseDep) -> dict[str, Any]:
    sid = parse_schedule_id(schedule_id)
    async with db.connection() as conn:
        row = await schedule_store.get(conn, owner, sid)
        firings = await schedule_store.firings(conn, [sid])
    return schedule_view(row, firings[sid])


@router.patch(
    "/{schedule_id}",
    operation_id="updateSchedule",
    response_model=schemas.Schedule,
    responses=problems(*SCHEDULE_ERRORS, *BODY_ERRORS),
)
async def update_schedule(
    schedule_id: ScheduleId, body: schemas.UpdateSchedule, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    """Change the fields given; the result is checked as a create would check it. A changed
    session field resolves the definition again (an `assistantId` without a version: that
    assistant's latest). A new `cron` or `timezone`, or `enabled: true` on a paused schedule,
    starts from the first tick after now; `enabled: false` pauses it (ticks while paused never
    fire) and drops a queued firing."""
    sid, owner = parse_schedule_id(schedule_id), caller.owner
    async with services.db.connection() as conn:
        row = await schedule_store.get(conn, owner, sid)
        now = await schedule_store.now(conn)
    given = body.model_dump(mode="json", exclude_unset=True)
    session_changes = {k: v for k, v in given.items() if k not in schemas.SCHEDULE_FIELDS}
    merged = _merged(row, given, session_changes)
    stored = None if session_changes else row["definition"]
    state = await _state(services, caller, merged, now, stored, row)
    restart = any(k in given for k in ("cron", "timezone")) or (
        state.enabled and not row["enabled"]
    )
    row, firings = await write_update(services, owner, sid, state, restart)
    return schedule_view(row, firings)


async def write_update(
    services: Services, owner: str, sid: UUID, state: ScheduleState, restart: bool
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Write the schedule's new `state` under its row lock (a firing since it was read moved
    it on); `restart`: its timetable starts from the first tick after now. The row and its
    latest firings."""
    async with services.db.transaction() as conn:
        locked = await schedule_store.get(conn, owner, sid, for_update=True)
        state = _timing(state, locked, restart)
        if locked["pending_tick"] is not None and state.pending_tick is None:
            await schedule_store.record_firing(
                conn, sid, locked["pending_tick"], "skipped", detail="dropped: paused"
            )
        row = await schedule_store.update(conn, owner, sid, state)
        firings = await schedule_store.firings(conn, [sid])
    return row, firings[sid]


def _merged(
    row: dict[str, Any], given: dict[str, Any], session_changes: dict[str, Any]
) -> schemas.CreateSchedule:
    """The schedule `row` with the PATCH's fields over it, checked as a create body."""
    request = {k: v for k, v in {**row["request"], **session_changes}.items() if v is not None}
    own = {k: row[k] for k in schemas.SCHEDULE_FIELDS}
    own.update({k: v for k, v in given.items() if k in schemas.SCHEDULE_FIELDS})
    body = {**request, **{k: v for k, v in own.items() if v is not None}}
    try:
        return schemas.CreateSchedule.model_validate(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        raise RequestValidationError(errors) from None


def _timing(state: ScheduleState, locked: dict[str, Any], restart: bool) -> ScheduleState:
    """`state` with the locked row's queued firing, and its next tick unless the timetable
    starts again (`restart`); paused, neither."""
    if not state.enabled:
        return state
    next_run_at = state.next_run_at if restart else locked["next_run_at"] or state.next_run_at
    next_run_at = past_end(next_run_at, state.end_time)
    return replace(state, next_run_at=next_run_at, pending_tick=locked["pending_tick"])


@router.delete(
    "/{schedule_id}",
    operation_id="deleteSchedule",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problems(*SCHEDULE_ERRORS),
)
async def delete_schedule(schedule_id: ScheduleId, owner: Owner, db: DatabaseDep) -> Response:
    """It fires no more; the sessions it fired stay, and keep naming it."""
    async with db.transaction() as conn:
        await schedule_store.delete(conn, owner, parse_schedule_id(schedule_id))
    return Response(status_code=status.HTTP_204_NO_CONTENT)
