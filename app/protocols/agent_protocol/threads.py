"""Threads of the Agent Protocol: Ferryman's sessions, created idle, with their state and
history folded from the log (app/protocols/agent_protocol/fold.py)."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID, uuid4

from fastapi import APIRouter, Query, Response, status

from app.api import sessions as native_sessions
from app.api.deps import ProtocolCaller, ProtocolOwner, ServicesDep
from app.api.limits import COUNTS_PROTOCOL_THREAD
from app.domain import json_size, within_bytes
from app.errors import InputNotSupported, NotServed, ThreadExists
from app.protocols.agent_protocol import fold, service
from app.protocols.agent_protocol.schemas import (
    History,
    StateAt,
    ThreadCount,
    ThreadCreate,
    ThreadSearch,
    ThreadUpdate,
)
from app.store import sessions as session_store
from app.store import threads as thread_store

router = APIRouter(tags=["agent-protocol"])


@router.post("/threads", dependencies=[COUNTS_PROTOCOL_THREAD])
async def create_thread(
    body: ThreadCreate, caller: ProtocolCaller, services: ServicesDep, response: Response
) -> dict[str, Any]:
    """An idle session: no event until its first run's message."""
    owner = caller.owner
    if body.supersteps:
        raise NotServed("threads.create with supersteps: Ferryman's state has no nodes to update")
    wanted = _new_thread_id(body.thread_id)
    async with services.db.connection() as conn:
        row = await service.create_idle_thread(conn, caller, services, wanted, body.metadata or {})
        if row is None:
            existing = await session_store.session_row(conn, wanted)
            if existing is not None and _reusable(existing, owner, body):
                return service.thread_view(existing, None)
            raise ThreadExists(f"thread {wanted} exists", threadId=str(wanted))
    return service.thread_view(row, None)


def _reusable(existing: dict[str, Any], owner: str, body: ThreadCreate) -> bool:
    """`if_exists: do_nothing` answers with the caller's own live thread of that id."""
    mine = existing["owner_id"] == owner and existing["deleted_at"] is None
    return mine and body.if_exists == "do_nothing"


def _new_thread_id(raw: str | None) -> UUID:
    if raw is None:
        return uuid4()
    try:
        return UUID(raw)
    except ValueError:
        raise InputNotSupported("thread_id must be a UUID", "thread_id") from None


@router.post("/threads/search")
async def search_threads(
    body: ThreadSearch, owner: ProtocolOwner, services: ServicesDep
) -> list[dict[str, Any]]:
    """Threads, newest first unless sorted otherwise; `values` is left out (get a thread, or
    its state, for them), and fewer than `limit` when FERRYMAN_LIST_MAX_BYTES is reached."""
    if body.values:
        raise NotServed("threads.search by values: search by metadata or status")
    query = thread_store.ThreadQuery(
        statuses=fold.SESSION_STATUSES[body.status] if body.status else None,
        metadata=body.metadata,
        ids=[service.parse_thread_id(i) for i in body.ids] if body.ids else None,
        limit=body.limit,
        offset=body.offset,
        sort_column=thread_store.SORT_COLUMNS[body.sort_by or "created_at"],
        descending=(body.sort_order or "desc") == "desc",
    )
    async with services.db.connection() as conn:
        rows = await thread_store.search(conn, owner, query)
    # No more than FERRYMAN_LIST_MAX_BYTES of answer (at least one): a client pages on by offset.
    views = [service.thread_view(row, None) for row in rows]
    return views[: within_bytes([json_size(v) for v in views], services.settings.list_max_bytes)]


@router.post("/threads/count")
async def count_threads(body: ThreadCount, owner: ProtocolOwner, services: ServicesDep) -> int:
    statuses = fold.SESSION_STATUSES[body.status] if body.status else None
    async with services.db.connection() as conn:
        return await thread_store.count(conn, owner, statuses, body.metadata)


@router.get("/threads/{thread_id}")
async def get_thread(thread_id: str, owner: ProtocolOwner, services: ServicesDep) -> dict[str, Any]:
    row, state = await service.thread_and_fold(services, owner, thread_id)
    return service.thread_view(row, state)


@router.patch("/threads/{thread_id}")
async def update_thread(
    thread_id: str, body: ThreadUpdate, owner: ProtocolOwner, services: ServicesDep
) -> dict[str, Any]:
    """Merges `metadata` into the thread's."""
    sid = service.parse_thread_id(thread_id)
    async with services.db.transaction() as conn:
        row = await session_store.get_session(conn, owner, sid, for_update=True)
        if body.metadata:
            row = await thread_store.merge_metadata(conn, sid, body.metadata)
    return service.thread_view(row, None)


@router.delete("/threads/{thread_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_thread(thread_id: str, owner: ProtocolOwner, services: ServicesDep) -> Response:
    """The native delete: a running session is cancelled first."""
    service.parse_thread_id(thread_id)
    return await native_sessions.delete_session(thread_id, owner, services)


@router.get("/threads/{thread_id}/state")
async def get_state(
    thread_id: str,
    owner: ProtocolOwner,
    services: ServicesDep,
    subgraphs: Annotated[bool, Query()] = False,
) -> dict[str, Any]:
    row, state = await service.thread_and_fold(services, owner, thread_id)
    return service.state_view(row, state, state.head())


@router.get("/threads/{thread_id}/state/{checkpoint_id}")
async def get_state_at(
    thread_id: str, checkpoint_id: str, owner: ProtocolOwner, services: ServicesDep
) -> dict[str, Any]:
    row, state = await service.thread_and_fold(services, owner, thread_id)
    return service.state_view(row, state, service.checkpoint_at(state, checkpoint_id))


@router.post("/threads/{thread_id}/state/checkpoint")
async def post_state_at(
    thread_id: str, body: StateAt, owner: ProtocolOwner, services: ServicesDep
) -> dict[str, Any]:
    row, state = await service.thread_and_fold(services, owner, thread_id)
    point = service.checkpoint_at(state, body.checkpoint.checkpoint_id)
    return service.state_view(row, state, point)


@router.post("/threads/{thread_id}/state")
async def update_state(thread_id: str, owner: ProtocolOwner, services: ServicesDep) -> None:
    await service.owned_thread(services, owner, thread_id)  # 404 first for a foreign one
    raise NotServed(
        "threads.update_state: Ferryman's state is its append-only log; send a message (a run)"
        " instead"
    )


@router.post("/threads/{thread_id}/history")
async def get_history(
    thread_id: str, body: History, owner: ProtocolOwner, services: ServicesDep
) -> list[dict[str, Any]]:
    """The states after each step, newest first."""
    row, state = await service.thread_and_fold(services, owner, thread_id)
    before = body.before
    if isinstance(before, dict):
        before = before.get("checkpoint_id") or (before.get("configurable") or {}).get(
            "checkpoint_id"
        )
    return service.history(row, state, body.limit, before if isinstance(before, str) else None)


@router.get("/threads/{thread_id}/history")
async def get_history_query(
    thread_id: str,
    owner: ProtocolOwner,
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    before: Annotated[str | None, Query(max_length=100)] = None,
) -> list[dict[str, Any]]:
    row, state = await service.thread_and_fold(services, owner, thread_id)
    return service.history(row, state, limit, before)


@router.post("/threads/{thread_id}/copy")
async def copy_thread(thread_id: str, owner: ProtocolOwner, services: ServicesDep) -> None:
    await service.owned_thread(services, owner, thread_id)
    raise NotServed(
        "threads.copy: a copy will be a fork of the session (POST /api/agent/{id}/fork, not"
        " served yet)"
    )
