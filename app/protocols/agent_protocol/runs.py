"""Runs of the Agent Protocol: a run is the span of a session's log that a message (or a
`command.resume`) opened, until the session settled. Its id is derived from that log position
(`fold.run_id`), so runs need no table and every run shows, however it was started."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import urlencode
from uuid import UUID, uuid4

from fastapi import APIRouter, Header, Query, Response, status
from fastapi.responses import StreamingResponse

from app.api.deps import Caller, ProtocolCaller, ProtocolOwner, ServicesDep
from app.api.limits import COUNTS_PROTOCOL_CREATE, COUNTS_PROTOCOL_RUN
from app.api.streams import EventStreamResponse
from app.db.pool import UNAVAILABLE_ERRORS
from app.errors import NotServed, SessionNotFound
from app.protocols.agent_protocol import fold, service
from app.protocols.agent_protocol.schemas import RunCreate
from app.protocols.agent_protocol.stream import RunStream, run_events
from app.services import Services
from app.store import sessions as session_store
from app.streams.sse import DirectWrites

router = APIRouter(tags=["agent-protocol"])
log = logging.getLogger(__name__)

# Cancels of runs whose client left (`on_disconnect: cancel`), held until done.
_CANCELS: set[asyncio.Task[None]] = set()
# Deletes of stateless runs' threads, each waiting for its run's end, held until done. Past
# this many in one process the retention pass deletes the thread instead (its metadata says
# so: `service.delete_ended_stateless`), as it does when the process stops first.
MAX_PENDING_DELETES = 1000
_DELETES: set[asyncio.Task[None]] = set()


def _run_path(thread_id: str, run_id: str) -> str:
    """The run's path below the protocol's root, as LangGraph's own servers send it: the JS
    SDK appends a Location to its apiUrl as it is (`${apiUrl}${path}`: an absolute URL or a
    path with the prefix points nowhere), and the Python SDK resolves it against its base URL,
    prefix and all."""
    return f"/threads/{thread_id}/runs/{run_id}"


async def _thread_for_run(
    services: Services, caller: Caller, thread_id: str, body: RunCreate
) -> UUID:
    """The run's thread; with `if_not_exists: create`, made when missing."""
    sid = service.parse_thread_id(thread_id)
    if body.if_not_exists != "create":
        return sid
    async with services.db.connection() as conn:
        await service.create_idle_thread(conn, caller, services, sid, {})  # None: it exists
    return sid


async def _start(
    services: Services, caller: Caller, thread_id: str, body: RunCreate
) -> tuple[dict[str, Any], fold.Run]:
    owner = caller.owner
    service.check_served(body, stateless=False)
    service.check_webhook(services, body)
    sid = await _thread_for_run(services, caller, thread_id, body)
    await service.check_checkpoint(services, owner, sid, body)
    row, run = await service.start_run(services, caller, sid, body)
    await service.subscribe_webhook(services, owner, sid, run, body)
    return row, run


async def _start_stateless(
    services: Services, caller: Caller, body: RunCreate
) -> tuple[dict[str, Any], fold.Run]:
    """A run on a thread of its own, whose metadata says whether it outlives the run."""
    owner = caller.owner
    service.check_served(body, stateless=True)
    service.check_webhook(services, body)
    sid = uuid4()
    metadata = service.stateless_metadata(body.on_completion)
    async with services.db.connection() as conn:
        await service.create_idle_thread(conn, caller, services, sid, metadata)
    try:
        row, run = await service.start_run(services, caller, sid, body)
    except Exception:
        await service.delete_thread(services, owner, sid)  # no run: the client never saw it
        raise
    await service.subscribe_webhook(services, owner, sid, run, body)
    return row, run


def _deletes(body: RunCreate) -> bool:
    """Whether a stateless run's thread goes when the run ends (LangGraph's default)."""
    return body.on_completion != "keep"


def _delete_after(services: Services, owner: str, sid: UUID) -> None:
    """Delete the thread once its run has ended, whether or not its client stays."""
    if len(_DELETES) >= MAX_PENDING_DELETES:
        return  # the retention pass deletes it
    task = asyncio.create_task(_delete_when_settled(services, owner, sid))
    _DELETES.add(task)
    task.add_done_callback(_DELETES.discard)


async def _delete_when_settled(services: Services, owner: str, sid: UUID) -> None:
    try:
        await service.wait_settled(services, owner, sid)
        await service.delete_thread(services, owner, sid)
    except SessionNotFound:
        pass  # deleted already, by its client
    except UNAVAILABLE_ERRORS as exc:
        log.warning("stateless thread %s left to the retention pass: %s", sid, exc)


def _located(response: Response, row: dict[str, Any], run: fold.Run) -> None:
    response.headers["Content-Location"] = _run_path(str(row["id"]), run.id)


def _stream(
    services: Services,
    owner: str,
    row: dict[str, Any],
    run: fold.Run,
    modes: list[str] | None,
    last_event_id: str | None,
    cancel_on_disconnect: bool = False,
    released: Callable[[], None] | None = None,
) -> StreamingResponse:
    events = fold.wanted_events(modes) if modes else fold.ALL_EVENTS
    stream = RunStream(row, run, fold.parse_event_id(last_event_id), events)
    direct = DirectWrites() if services.hub.shortcuts else None
    body = run_events(services, row, stream, direct)

    def release() -> None:
        services.slots.give_back(owner)
        if cancel_on_disconnect and not stream.ended and not services.shutdown.is_set():
            # The client left before the run ended and asked for it to stop then.
            task = asyncio.create_task(service.cancel_run(services, owner, row["id"], run, False))
            _CANCELS.add(task)
            task.add_done_callback(_CANCELS.discard)
        if released is not None:
            released()

    services.slots.take(owner)  # last: nothing after this can fail and strand the slot
    response = EventStreamResponse(body, release, direct)
    path = _run_path(str(row["id"]), run.id)
    query = urlencode([("stream_mode", m) for m in modes or []])
    response.headers["Location"] = f"{path}/stream" + (f"?{query}" if query else "")
    response.headers["Content-Location"] = path
    return response


async def _final_values(services: Services, owner: str, sid: UUID, run: fold.Run) -> Any:
    await service.wait_run_end(services, owner, sid, run.id)
    _, state = await service.thread_and_fold(services, owner, str(sid))
    return state.values()


# --- on a thread -----------------------------------------------------------------------------


@router.post("/threads/{thread_id}/runs", dependencies=[COUNTS_PROTOCOL_RUN])
async def create_run(
    thread_id: str,
    body: RunCreate,
    owner: ProtocolOwner,
    caller: ProtocolCaller,
    services: ServicesDep,
    response: Response,
) -> dict[str, Any]:
    row, run = await _start(services, caller, thread_id, body)
    _located(response, row, run)
    return service.run_view(row, run, body.assistant_id)


@router.post(
    "/threads/{thread_id}/runs/stream",
    response_class=StreamingResponse,
    dependencies=[COUNTS_PROTOCOL_RUN],
)
async def create_run_stream(
    thread_id: str,
    body: RunCreate,
    owner: ProtocolOwner,
    caller: ProtocolCaller,
    services: ServicesDep,
) -> StreamingResponse:
    row, run = await _start(services, caller, thread_id, body)
    cancel = body.on_disconnect == "cancel"
    return _stream(services, owner, row, run, body.modes(), None, cancel)


@router.post("/threads/{thread_id}/runs/wait", dependencies=[COUNTS_PROTOCOL_RUN])
async def create_run_wait(
    thread_id: str,
    body: RunCreate,
    owner: ProtocolOwner,
    caller: ProtocolCaller,
    services: ServicesDep,
    response: Response,
) -> Any:
    row, run = await _start(services, caller, thread_id, body)
    _located(response, row, run)
    return await _final_values(services, owner, row["id"], run)


@router.get("/threads/{thread_id}/runs")
async def list_runs(
    thread_id: str,
    owner: ProtocolOwner,
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    offset: Annotated[int, Query(ge=0)] = 0,
    status_filter: Annotated[str | None, Query(alias="status", max_length=20)] = None,
) -> list[dict[str, Any]]:
    """Newest first."""
    sid = service.parse_thread_id(thread_id)
    async with services.db.transaction() as conn:
        await session_store.read_one_snapshot(conn)
        row = await session_store.get_session(conn, owner, sid)
        runs = await service.runs_of_thread(conn, row)
    chosen = [r for r in reversed(runs) if status_filter in (None, r.status)]
    return [service.run_view(row, r) for r in chosen[offset : offset + limit]]


@router.get("/threads/{thread_id}/runs/{run_id}")
async def get_run(
    thread_id: str, run_id: str, owner: ProtocolOwner, services: ServicesDep
) -> dict[str, Any]:
    row, run = await service.find_run(services, owner, thread_id, run_id)
    return service.run_view(row, run)


@router.delete("/threads/{thread_id}/runs/{run_id}")
async def delete_run(
    thread_id: str, run_id: str, owner: ProtocolOwner, services: ServicesDep
) -> None:
    await service.find_run(services, owner, thread_id, run_id)
    raise NotServed("runs.delete: a run is a span of the session's append-only log")


@router.post("/threads/{thread_id}/runs/{run_id}/cancel", status_code=status.HTTP_202_ACCEPTED)
async def cancel_run(
    thread_id: str,
    run_id: str,
    owner: ProtocolOwner,
    services: ServicesDep,
    wait: Annotated[bool, Query()] = False,
    action: Annotated[str, Query(pattern="^(interrupt|rollback)$")] = "interrupt",
) -> Response:
    """`interrupt` is Ferryman's cancel; `rollback` is not served (the log is append-only)."""
    row, run = await service.find_run(services, owner, thread_id, run_id)
    if action == "rollback":
        raise NotServed(
            "runs.cancel with action rollback: Ferryman's log is append-only, a run's events"
            " cannot be dropped; cancel with action interrupt"
        )
    await service.cancel_run(services, owner, row["id"], run, wait)
    # Bodiless, so 204 (not 200): the JS SDK parses the body of anything but a 202 or a 204.
    return Response(status_code=status.HTTP_204_NO_CONTENT if wait else status.HTTP_202_ACCEPTED)


@router.get("/threads/{thread_id}/runs/{run_id}/join")
async def join_run(thread_id: str, run_id: str, owner: ProtocolOwner, services: ServicesDep) -> Any:
    row, run = await service.find_run(services, owner, thread_id, run_id)
    return await _final_values(services, owner, row["id"], run)


@router.get("/threads/{thread_id}/runs/{run_id}/stream", response_class=StreamingResponse)
async def join_run_stream(
    thread_id: str,
    run_id: str,
    owner: ProtocolOwner,
    services: ServicesDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=100)] = None,
    stream_mode: Annotated[list[str] | None, Query(max_length=20)] = None,
    cancel_on_disconnect: Annotated[bool, Query()] = False,
) -> StreamingResponse:
    """The run's events after `Last-Event-ID` (from its start without one), then `end`."""
    row, run = await service.find_run(services, owner, thread_id, run_id)
    modes = [m for m in stream_mode or [] if m]
    return _stream(services, owner, row, run, modes or None, last_event_id, cancel_on_disconnect)


# --- without a thread ------------------------------------------------------------------------


@router.post("/runs", dependencies=[COUNTS_PROTOCOL_CREATE])
async def create_stateless_run(
    body: RunCreate,
    owner: ProtocolOwner,
    caller: ProtocolCaller,
    services: ServicesDep,
    response: Response,
) -> dict[str, Any]:
    row, run = await _start_stateless(services, caller, body)
    if _deletes(body):
        _delete_after(services, owner, row["id"])
    _located(response, row, run)
    return service.run_view(row, run, body.assistant_id)


@router.post(
    "/runs/stream", response_class=StreamingResponse, dependencies=[COUNTS_PROTOCOL_CREATE]
)
async def create_stateless_run_stream(
    body: RunCreate, owner: ProtocolOwner, caller: ProtocolCaller, services: ServicesDep
) -> StreamingResponse:
    row, run = await _start_stateless(services, caller, body)
    cancel = body.on_disconnect == "cancel"
    # Once the stream is done (its reader could still be reading the thread before).
    released = (lambda: _delete_after(services, owner, row["id"])) if _deletes(body) else None
    return _stream(services, owner, row, run, body.modes(), None, cancel, released)


@router.post("/runs/wait", dependencies=[COUNTS_PROTOCOL_CREATE])
async def create_stateless_run_wait(
    body: RunCreate,
    owner: ProtocolOwner,
    caller: ProtocolCaller,
    services: ServicesDep,
    response: Response,
) -> Any:
    row, run = await _start_stateless(services, caller, body)
    _located(response, row, run)
    if not _deletes(body):
        return await _final_values(services, owner, row["id"], run)
    try:
        values = await _final_values(services, owner, row["id"], run)
    except BaseException:
        _delete_after(services, owner, row["id"])  # the client left: delete all the same
        raise
    # Deleted before the answer: the client sees the thread gone once it has its values.
    await service.delete_thread(services, owner, row["id"])
    return values
