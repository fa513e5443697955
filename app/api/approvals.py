"""Pending approvals across an owner's sessions (docs/approvals.md): for the owner's own keys,
and for approver keys, whose policy's `approverFor` names the owners they decide for."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from app.api import schemas
from app.api.deps import CallerDep, DatabaseDep
from app.api.openapi import problems
from app.domain import OWNER_ID_PATTERN, rfc3339
from app.errors import NotFound
from app.scopes import parse_scopes
from app.store import approvals as approval_store

router = APIRouter(prefix="/api/approvals", tags=["sessions"])

MAX_PENDING_PAGE = 100


@router.get(
    "",
    operation_id="listPendingApprovals",
    response_model=schemas.PendingApprovalList,
    responses=problems(401, 403, 404, 422, 503),
)
async def list_pending_approvals(
    caller: CallerDep,
    db: DatabaseDep,
    owner: Annotated[
        str | None,
        Query(
            pattern=OWNER_ID_PATTERN.pattern,
            description="Whose: the caller's own (unset), or an owner the caller's key is an"
            " approver for (any other: 404).",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PENDING_PAGE)] = 50,
) -> dict[str, Any]:
    """The tool calls that wait for a decision in the owner's sessions, oldest first; decide
    each with `POST /api/agent/{id}/tool-calls/{toolCallId}/approval`."""
    whose = owner or caller.owner
    if whose != caller.owner and whose not in parse_scopes(caller.policy).approver_for:
        raise NotFound("no such owner among those this key approves for")
    async with db.connection() as conn:
        rows = await approval_store.pending(conn, whose, limit)
    return {
        "approvals": [
            {
                "sessionId": str(r["session_id"]),
                "ownerId": whose,
                "title": r["title"],
                "toolCallId": r["data"]["toolCallId"],
                "name": r["data"]["name"],
                "arguments": r["data"].get("arguments") or {},
                "seq": r["seq"],
                "requestedAt": rfc3339(r["created_at"]),
            }
            for r in rows
        ]
    }
