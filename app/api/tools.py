"""The tools a session may use: GET /api/tools."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.api import schemas
from app.api.deps import Owner, ServicesDep
from app.api.openapi import problems
from app.api.sessions import ANY_ERRORS
from app.store import tools as tool_store

router = APIRouter(prefix="/api", tags=["tools"])


@router.get(
    "/tools",
    operation_id="listTools",
    response_model=schemas.ToolList,
    responses=problems(*ANY_ERRORS),
)
async def list_tools(_: Owner, services: ServicesDep) -> dict[str, Any]:
    """The tools of the workers alive now (built-ins, plug-ins and MCP servers' tools), each
    with how many of them offer it, and how many workers are alive. A worker's tools leave the
    list when it stops or dies. The built-ins and plug-ins this API process loads are listed
    too, with `workers: 0` when no live worker offers them (no worker runs, say)."""
    async with services.db.connection() as conn:
        tools, workers = await tool_store.read_catalog(conn, services.settings.lease_ttl)
    offered = {tool["name"] for tool in tools}
    local = [
        {**tool.catalog_entry(), "workers": 0}
        for tool in services.local_tools().tools()
        if tool.name not in offered
    ]
    return {"tools": sorted([*tools, *local], key=lambda tool: tool["name"]), "workers": workers}
