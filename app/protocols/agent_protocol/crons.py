"""The Agent Protocol's crons over Ferryman's schedules (docs/langgraph.md, docs/schedules.md):
a cron is a schedule of its caller. A cron of `POST /runs/crons` creates a thread at each tick,
as a schedule creates a session; one of `POST /threads/{id}/runs/crons` is a schedule bound to
that thread, whose ticks post the run's input to it as a follow-up message.

The cron's own fields come from the schedule's row; what a create gave that a schedule keeps
nowhere else (the assistant id, the run payload, the metadata, `on_run_completed`) is kept in
its `agent_protocol` column and answered back."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Literal
from uuid import UUID

from fastapi import APIRouter, Response, status
from pydantic import Field

from app.api.deps import Caller, ProtocolCaller, ProtocolOwner, ServicesDep
from app.api.schedules import parse_cron, parse_schedule_id, past_end, write_update
from app.domain import MAX_SCHEDULES_PER_OWNER, Overlap, rfc3339
from app.errors import InputNotSupported, NotServed
from app.protocols.agent_protocol import service
from app.protocols.agent_protocol.schemas import Body, RunCreate
from app.services import Services
from app.store import schedules as schedule_store
from app.store import sessions as session_store
from app.store.schedules import ScheduleState, definition_of

router = APIRouter(tags=["agent-protocol"])

OnRunCompleted = Literal["delete", "keep"]
# The run fields of a cron's create that make its payload (what each firing runs).
_PAYLOAD_FIELDS = (
    "input",
    "config",
    "context",
    "metadata",
    "multitask_strategy",
    "stream_mode",
    "stream_subgraphs",
    "stream_resumable",
    "durability",
)


class CronCreate(RunCreate):
    schedule: str = Field(min_length=1, max_length=200)
    end_time: datetime | None = None
    enabled: bool | None = None
    timezone: str | None = Field(default=None, max_length=64)
    on_run_completed: OnRunCompleted | None = None
    checkpoint_during: bool | None = None


class CronUpdate(Body):
    schedule: str | None = Field(default=None, min_length=1, max_length=200)
    end_time: datetime | None = None
    input: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    webhook: str | None = None
    interrupt_before: Any = None
    interrupt_after: Any = None
    on_run_completed: OnRunCompleted | None = None
    enabled: bool | None = None
    timezone: str | None = Field(default=None, max_length=64)
    stream_mode: str | list[str] | None = None
    stream_subgraphs: bool | None = None
    stream_resumable: bool | None = None
    durability: Literal["sync", "async", "exit"] | None = None


class CronSearch(Body):
    assistant_id: str | None = None
    thread_id: str | None = None
    enabled: bool | None = None
    metadata: dict[str, Any] | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=1_000_000)
    sort_by: (
        Literal[
            "cron_id",
            "assistant_id",
            "thread_id",
            "created_at",
            "updated_at",
            "next_run_date",
            "end_time",
        ]
        | None
    ) = None
    sort_order: Literal["asc", "desc"] | None = None
    select: list[str] | None = None


class CronCount(Body):
    assistant_id: str | None = None
    thread_id: str | None = None
    metadata: dict[str, Any] | None = None


def _check_served(body: CronCreate, thread_id: UUID | None) -> None:
    service.check_served(body, stateless=thread_id is None)
    if body.webhook is not None:
        raise NotServed(
            "webhook on a cron: give it to a run create (each run's webhook is delivered once"
            " when that run ends), or subscribe natively to session_end (POST /api/webhooks)"
        )
    if body.command is not None:
        raise NotServed("command on a cron: a cron's runs start from input.messages")
    strategy = body.multitask_strategy or "reject"
    if thread_id is not None and strategy not in ("reject", "enqueue"):
        raise NotServed(
            f"multitask_strategy {strategy} on a thread's cron: a tick does not cancel a run in"
            " progress; use reject (the tick is skipped) or enqueue (it joins the run)"
        )


def _prompt(body: RunCreate) -> str:
    texts = service.input_texts(body)
    if not texts:
        raise InputNotSupported("a cron needs input.messages: each tick sends them", "input")
    return "\n\n".join(texts)


def _overlap(thread_id: UUID | None, strategy: str | None) -> Overlap:
    """A thread's cron: `reject` skips a tick while a run is in progress, `enqueue` posts it
    to the run (as a run create does); a cron that creates threads runs each tick."""
    if thread_id is None:
        return Overlap.ALLOW
    return Overlap.ALLOW if strategy == "enqueue" else Overlap.SKIP


async def _state(
    services: Services, caller: Caller, body: CronCreate, thread_id: UUID | None, now: datetime
) -> ScheduleState:
    """What to store for the cron `body`: checked as a run create (422 for a bad input,
    definition or cron, 501 for what is not served), nothing written."""
    _check_served(body, thread_id)
    prompt = _prompt(body)
    timezone = body.timezone or "UTC"
    parsed = parse_cron(body.schedule, timezone, now)
    new, named = await service.definition_of(services, caller, body)
    if thread_id is not None and named:
        raise NotServed(
            f"{', '.join(sorted(named))} in a thread's cron: its ticks run with the thread's"
            " definition; change that with a run on the thread"
        )
    on_completed = body.on_run_completed or "delete"
    if thread_id is None:
        metadata = {
            **(body.metadata or {}),
            "graph_id": service.GRAPH_ID,
            **service.stateless_metadata(on_completed),
        }
        new = replace(new, metadata=metadata)
    enabled = True if body.enabled is None else body.enabled
    end_time = body.end_time.astimezone(UTC) if body.end_time else None
    payload = body.model_dump(mode="json", include=set(_PAYLOAD_FIELDS), exclude_none=True)
    return ScheduleState(
        cron=parsed.expression,
        timezone=timezone,
        enabled=enabled,
        overlap=str(_overlap(thread_id, body.multitask_strategy)),
        title=None,
        prompt=prompt,
        request={},
        definition=definition_of(new),
        next_run_at=past_end(parsed.next_after(now), end_time) if enabled else None,
        session_id=thread_id,
        end_time=end_time,
        agent_protocol={
            "assistant_id": body.assistant_id,
            "payload": payload,
            "metadata": body.metadata or {},
            "on_run_completed": on_completed if thread_id is None else None,
            "run_metadata": body.metadata or None,
            "multitask_strategy": body.multitask_strategy,
        },
    )


def cron_view(row: dict[str, Any]) -> dict[str, Any]:
    """The SDKs' Cron of a schedule; one made natively shows its prompt as the payload."""
    protocol = row["agent_protocol"]
    if protocol is None:
        assistant = row["definition"].get("assistant_id") or service.GRAPH_ID
        protocol = {
            "assistant_id": assistant,
            "payload": {"input": {"messages": [{"role": "user", "content": row["prompt"]}]}},
            "metadata": {},
            "on_run_completed": None if row["session_id"] else "keep",
        }
    return {
        "cron_id": str(row["id"]),
        "assistant_id": protocol["assistant_id"],
        "thread_id": None if row["session_id"] is None else str(row["session_id"]),
        "on_run_completed": protocol["on_run_completed"],
        "end_time": rfc3339(row["end_time"]),
        "schedule": row["cron"],
        "timezone": row["timezone"],
        "created_at": rfc3339(row["created_at"]),
        "updated_at": rfc3339(row["updated_at"]),
        "payload": {"assistant_id": protocol["assistant_id"], **protocol["payload"]},
        "user_id": row["owner_id"],
        "next_run_date": rfc3339(row["next_run_at"]),
        "metadata": protocol["metadata"],
        "enabled": row["enabled"],
    }


async def _create(
    services: Services, caller: Caller, body: CronCreate, thread_id: UUID | None
) -> dict[str, Any]:
    owner = caller.owner
    async with services.db.connection() as conn:
        now = await schedule_store.now(conn)
        if thread_id is not None:  # the caller's thread, or 404
            await session_store.get_session(conn, owner, thread_id)
    state = await _state(services, caller, body, thread_id, now)
    async with services.db.transaction() as conn:
        row = await schedule_store.create(conn, owner, state)
    return cron_view(row)


@router.post("/runs/crons")
async def create_cron(body: CronCreate, caller: ProtocolCaller, services: ServicesDep) -> Any:
    """Each tick creates a thread and runs the payload on it."""
    return await _create(services, caller, body, None)


@router.post("/threads/{thread_id}/runs/crons")
async def create_thread_cron(
    thread_id: str, body: CronCreate, caller: ProtocolCaller, services: ServicesDep
) -> Any:
    """Each tick runs the payload on the thread: its input is a follow-up message."""
    return await _create(services, caller, body, service.parse_thread_id(thread_id))


async def _owners_crons(services: Services, owner: str) -> list[dict[str, Any]]:
    """All the owner's schedules (at most MAX_SCHEDULES_PER_OWNER), as crons."""
    async with services.db.connection() as conn:
        rows, _ = await schedule_store.page(conn, owner, MAX_SCHEDULES_PER_OWNER, None)
    return [cron_view(row) for row in rows]


def _matches(
    cron: dict[str, Any],
    assistant_id: str | None,
    thread_id: str | None,
    metadata: dict[str, Any] | None,
    enabled: bool | None = None,
) -> bool:
    return (
        assistant_id in (None, cron["assistant_id"])
        and thread_id in (None, cron["thread_id"])
        and enabled in (None, cron["enabled"])
        and all(cron["metadata"].get(k) == v for k, v in (metadata or {}).items())
    )


@router.post("/runs/crons/search")
async def search_crons(
    body: CronSearch, owner: ProtocolOwner, services: ServicesDep
) -> list[dict[str, Any]]:
    """Newest first unless `sort_by` says otherwise."""
    crons = [
        c
        for c in await _owners_crons(services, owner)
        if _matches(c, body.assistant_id, body.thread_id, body.metadata, body.enabled)
    ]
    if body.sort_by is not None:
        key = "next_run_date" if body.sort_by == "next_run_date" else body.sort_by
        # None sorts first ascending (as an empty string would).
        crons.sort(key=lambda c: c[key] or "", reverse=body.sort_order != "asc")
    page = crons[body.offset : body.offset + body.limit]
    if body.select:
        page = [{k: c[k] for k in body.select if k in c} for c in page]
    return page


@router.post("/runs/crons/count")
async def count_crons(body: CronCount, owner: ProtocolOwner, services: ServicesDep) -> int:
    crons = await _owners_crons(services, owner)
    return sum(_matches(c, body.assistant_id, body.thread_id, body.metadata) for c in crons)


@router.delete("/runs/crons/{cron_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_cron(cron_id: str, owner: ProtocolOwner, services: ServicesDep) -> Response:
    async with services.db.transaction() as conn:
        await schedule_store.delete(conn, owner, parse_schedule_id(cron_id))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.patch("/runs/crons/{cron_id}")
async def update_cron(
    cron_id: str, body: CronUpdate, caller: ProtocolCaller, services: ServicesDep
) -> dict[str, Any]:
    """The fields given change; the result is checked as a create. A new schedule or
    timezone, or `enabled: true` on a paused cron, starts from the first tick after now."""
    owner = caller.owner
    sid = parse_schedule_id(cron_id)
    async with services.db.connection() as conn:
        row = await schedule_store.get(conn, owner, sid)
        now = await schedule_store.now(conn)
    given = body.model_dump(mode="json", exclude_unset=True)
    old = cron_view(row)
    merged: dict[str, Any] = {
        **old["payload"],
        "schedule": old["schedule"],
        "timezone": old["timezone"],
        "enabled": old["enabled"],
        "end_time": old["end_time"],
        "on_run_completed": old["on_run_completed"],
        **{k: v for k, v in given.items() if v is not None or k == "end_time"},
    }
    create = CronCreate.model_validate(merged)
    state = await _state(services, caller, create, row["session_id"], now)
    if row["agent_protocol"] is None:  # a native schedule keeps its title and definition
        state = replace(
            state, title=row["title"], definition=row["definition"], overlap=row["overlap"]
        )
    restart = any(k in given for k in ("schedule", "timezone")) or (
        state.enabled and not row["enabled"]
    )
    updated, _ = await write_update(services, owner, sid, state, restart)
    return cron_view(updated)
