"""The parts of the Agent Protocol Ferryman does not serve: each answers 501 NOT_SERVED saying
so (docs/langgraph.md lists them), rather than a bare 404 the SDKs would report as a missing
thread."""

from __future__ import annotations

from fastapi import APIRouter

from app.errors import NotServed

router = APIRouter(tags=["agent-protocol"])

_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def _not_served(what: str, why: str) -> None:
    raise NotServed(f"{what} is not served by Ferryman: {why}")


@router.api_route("/store/{rest:path}", methods=_METHODS, include_in_schema=False)
async def store() -> None:
    _not_served("the store", "the agent keeps notes per session (put_note, get_note)")


@router.post("/runs/batch", include_in_schema=False)
@router.post("/runs/cancel", include_in_schema=False)
async def bulk_runs() -> None:
    _not_served("bulk runs", "create or cancel runs one at a time")


@router.post("/threads/prune", include_in_schema=False)
async def prune() -> None:
    _not_served("threads.prune", "delete threads one at a time; retention removes old ones")


@router.get("/threads/{thread_id}/stream", include_in_schema=False)
async def thread_stream() -> None:
    _not_served("threads.join_stream", "join a run's stream (runs.join_stream)")
