"""Fork and edit (SPEC section 11, docs/fork.md): a new session from a prefix of one's log."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response, status

from app.api import schemas
from app.api.definitions import check_caller_definition
from app.api.deps import CallerDep, ServicesDep
from app.api.openapi import problems
from app.api.sessions import BODY_ERRORS, SESSION_ERRORS, SessionId, parse_session_id
from app.domain import session_view
from app.store import forks as fork_store
from app.store import sessions as session_store

router = APIRouter(prefix="/api/agent", tags=["sessions"])


@router.post(
    "/{session_id}/fork",
    operation_id="forkSession",
    status_code=status.HTTP_201_CREATED,
    response_model=schemas.Session,
    responses=problems(*SESSION_ERRORS, *BODY_ERRORS),
)
async def fork_session(
    session_id: SessionId,
    body: schemas.ForkSession,
    caller: CallerDep,
    services: ServicesDep,
    response: Response,
) -> dict[str, Any]:
    """A new session of the caller whose history is this session's log through `atSeq`
    (committed events only: a running session forks as far as it has written). With
    `message`, the user message at `atSeq` is replaced by it, and the fork answers it (edit
    and regenerate). The fork is `queued` when something is left to answer, else `idle`
    until a message; the session forked from is left as it is."""
    fork = fork_store.Fork(body.atSeq, body.message, body.title, caller.key_id)
    sid, owner = parse_session_id(session_id), caller.owner
    async with services.db.transaction() as conn:
        # The fork runs the session's definition: the caller's key must be one that may use it.
        source = await session_store.get_session(conn, owner, sid)
        check_caller_definition(services, caller, source["tools"], source["model"])
        row = await fork_store.fork_session(conn, owner, sid, fork)
    response.headers["Location"] = f"/api/agent/{row['id']}"
    return session_view(row)
