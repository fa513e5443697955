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
    """Every tool a session may name in `tools` and `approvalRequired`: built-ins, plug-ins and
    MCP servers' tools, as the workers offer them (the catalog the last worker to start
    published). Before any worker has published, the tools this API process itself loads."""
    async with services.db.connection() as conn:
        tools = await tool_store.read_catalog(conn)
    if not tools:
        tools = [tool.catalog_entry() for tool in services.local_tools().tools()]
    return {"tools": tools}
