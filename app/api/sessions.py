"""The sessions API of SPEC section 3."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Header, Path, Query, Response, status
from fastapi.responses import JSONResponse

from app.api import schemas
from app.api.definitions import (
    assistant_request_fingerprint,
    check_caller_definition,
    resolve_session,
)
from app.api.deps import Caller, CallerDep, DatabaseDep, Owner, ServicesDep
from app.api.limits import COUNTS_CREATE, COUNTS_MESSAGE, check_queue
from app.api.openapi import problems
from app.db.pool import Connection
from app.domain import (
    MAX_IDEMPOTENCY_KEY_CHARS,
    TERMINAL,
    Status,
    json_size,
    session_summary,
    session_view,
    within_bytes,
)
from app.errors import ApprovalSeparate, InvalidPageToken, SessionNotFound
from app.scopes import parse_scopes
from app.services import Services
from app.store import approvals as approval_store
from app.store import events as event_store
from app.store import limits as limit_store
from app.store import sessions as session_store
from app.store.notify import session_key
from app.streams.frames import session_envelope

router = APIRouter(prefix="/api/agent", tags=["sessions"])

# Every operation: no or a bad key (401), local mode's refusals (403), the database (503).
ANY_ERRORS = (401, 403, 503)
# A session's operations: 404 for an id that names none of the caller's sessions.
SESSION_ERRORS = (*ANY_ERRORS, 404)
# With a JSON body: MALFORMED_JSON (400), PAYLOAD_TOO_LARGE (413), UNSUPPORTED_MEDIA_TYPE (415),
# VALIDATION_ERROR (422).
BODY_ERRORS = (400, 413, 415, 422)


SessionId = Annotated[
    str, Path(description="The session's id.", json_schema_extra={"format": "uuid"})
]


def parse_id(raw: str, not_found: Callable[[], Exception]) -> UUID:
    """A path id; anything that is not a UUID names nothing (404, like a foreign one)."""
    try:
        return UUID(raw)
    except ValueError:
        raise not_found() from None


def parse_session_id(raw: str) -> UUID:
    return parse_id(raw, SessionNotFound)


def check_separate(services: Services, caller: Caller, session: dict[str, Any]) -> None:
    """FERRYMAN_APPROVAL_SEPARATE: 403 APPROVAL_SEPARATE when the caller's key created
    `session` (a session no key created, or a caller without a key: no refusal)."""
    if (
        services.settings.approval_separate
        and caller.key_id is not None
        and session["created_by_key_id"] == caller.key_id
    ):
        raise ApprovalSeparate()


def encode_page_token(key: session_store.PageKey) -> str:
    raw = json.dumps({"t": key.created_at.isoformat(), "i": str(key.id)})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_page_token(token: str) -> session_store.PageKey:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        return session_store.PageKey(datetime.fromisoformat(data["t"]), UUID(data["i"]))
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error, UnicodeDecodeError):
        raise InvalidPageToken("pageToken is not one this server issued") from None


@router.post(
    "",
    operation_id="createSession",
    status_code=status.HTTP_201_CREATED,
    response_model=schemas.Session,
    dependencies=[COUNTS_CREATE],
    responses={
        200: {"model": schemas.Session, "description": "Idempotent replay"},
        **problems(*ANY_ERRORS, *BODY_ERRORS, 404, 409, 429),
    },
)
async def create_session(
    body: schemas.CreateSession,
    caller: CallerDep,
    services: ServicesDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=MAX_IDEMPOTENCY_KEY_CHARS,
            description="Same key and body: the same session (200). Same key, other body: 409.",
        ),
    ] = None,
) -> dict[str, Any]:
    owner = caller.owner
    row, created = None, False
    fingerprint = assistant_request_fingerprint(body)
    if idempotency_key is not None and fingerprint is not None:
        # A retry finds its session before the assistant is read: it may be gone since.
        async with services.db.connection() as conn:
            row = await session_store.replay_idempotent(conn, owner, idempotency_key, fingerprint)
    if row is None:
        if body.prompt is not None:
            await check_queue(services, owner)
        new = await resolve_session(services, caller, body)
        row = await services.creates.create(owner, new, idempotency_key)
        created = row is not None
        if row is None:  # the key was taken: the same request again (200), or another (409)
            assert idempotency_key is not None
            async with services.db.connection() as conn:
                row = await session_store.replay_idempotent(
                    conn, owner, idempotency_key, new.fingerprint()
                )
            assert row is not None
    if not created:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/api/agent/{row['id']}"
    return session_view(row)


async def mark_waiting(
    services: Services, conn: Connection, owner: str, views: list[dict[str, Any]]
) -> None:
    """Give each queued view `waitingFor` when its owner is at FERRYMAN_OWNER_MAX_RUNNING: one
    count, only while that limit is set and a view is queued."""
    limit = services.settings.owner_max_running
    if limit is None or not any(view["status"] == Status.QUEUED for view in views):
        return
    running = await limit_store.owner_running(conn, owner)
    if running >= limit:
        waiting = {"reason": "ownerRunningLimit", "running": running, "limit": limit}
        for view in views:
            if view["status"] == Status.QUEUED:
                view["waitingFor"] = waiting


@router.get(
    "",
    operation_id="listSessions",
    response_model=schemas.SessionList,
    responses=problems(*ANY_ERRORS, 400, 422),  # INVALID_PAGE_TOKEN, a bad limit
)
async def list_sessions(
    owner: Owner,
    services: ServicesDep,
    status_filter: Annotated[
        list[Status] | None, Query(alias="status", description="Repeatable.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    page_token: Annotated[str | None, Query(alias="pageToken", max_length=512)] = None,
    search: Annotated[
        schemas.Text | None,
        Query(
            alias="q",
            min_length=1,
            max_length=200,
            description="Only sessions whose title contains this text (case-insensitive).",
        ),
    ] = None,
) -> dict[str, Any]:
    after = decode_page_token(page_token) if page_token else None
    statuses = [str(s) for s in status_filter] if status_filter else None
    settings = services.settings
    async with services.db.transaction() as conn:
        rows, cursor, next_key = await session_store.list_sessions(
            conn, owner, statuses, limit, after, search, settings.list_excerpt_chars
        )
        # Summaries (no big text whole), and no more of them than FERRYMAN_LIST_MAX_BYTES holds.
        views = [session_summary(row, settings.list_excerpt_chars) for row in rows]
        kept = within_bytes([json_size(v) for v in views], settings.list_max_bytes)
        if kept < len(views):
            views, rows = views[:kept], rows[:kept]
            next_key = session_store.PageKey(rows[-1]["created_at"], rows[-1]["id"])
        await mark_waiting(services, conn, owner, views)
    return {
        "sessions": views,
        "cursor": str(cursor),
        "nextPageToken": encode_page_token(next_key) if next_key else None,
    }


@router.get(
    "/{session_id}",
    operation_id="getSession",
    response_model=schemas.Session,
    responses=problems(*SESSION_ERRORS),
)
async def get_session(session_id: SessionId, owner: Owner, services: ServicesDep) -> dict[str, Any]:
    async with services.db.connection() as conn:
        row = await session_store.get_session(conn, owner, parse_session_id(session_id))
        view = session_view(row)
        await mark_waiting(services, conn, owner, [view])
    return view


@router.patch(
    "/{session_id}",
    operation_id="renameSession",
    response_model=schemas.Session,
    responses=problems(*SESSION_ERRORS, *BODY_ERRORS),
)
async def rename_session(
    session_id: SessionId, body: schemas.RenameSession, owner: Owner, db: DatabaseDep
) -> dict[str, Any]:
    async with db.transaction() as conn:
        row = await session_store.rename(conn, owner, parse_session_id(session_id), body.title)
    return session_view(row)


@router.delete(
    "/{session_id}",
    operation_id="deleteSession",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problems(*SESSION_ERRORS),
)
async def delete_session(session_id: SessionId, owner: Owner, services: ServicesDep) -> Response:
    """Cancels first: a running session's holder is asked to stop, and the delete waits for
    it to settle (FERRYMAN_CANCEL_WAIT_SECONDS at most), so its last events (`session_end`,
    `session_status` cancelled) come before `session_deleted`, never after."""
    sid = parse_session_id(session_id)
    async with services.db.transaction() as conn:
        row = await session_store.get_session(conn, owner, sid, for_update=True)
        if Status(row["status"]) not in TERMINAL:
            row = await session_store.request_cancel(conn, owner, sid)
    if Status(row["status"]) not in TERMINAL:
        await _wait_terminal(services, owner, sid, services.settings.cancel_wait_seconds)
    async with services.db.transaction() as conn:
        await session_store.soft_delete(conn, owner, sid)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/{session_id}/cancel",
    operation_id="cancelSession",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=schemas.CancelAccepted,
    responses={
        200: {"model": schemas.Session, "description": "With wait=true: the terminal session"},
        **problems(*SESSION_ERRORS, 409, 422),
    },
)
async def cancel_session(
    session_id: SessionId,
    owner: Owner,
    services: ServicesDep,
    wait: Annotated[
        bool, Query(description="Hold the answer until the session is terminal (at most 30 s).")
    ] = False,
) -> Any:
    sid = parse_session_id(session_id)
    async with services.db.transaction() as conn:
        row = await session_store.request_cancel(conn, owner, sid)
    if wait and Status(row["status"]) not in TERMINAL:
        row = await _wait_terminal(services, owner, sid, services.settings.cancel_wait_seconds)
    if wait and Status(row["status"]) in TERMINAL:
        return JSONResponse(session_view(row), status_code=status.HTTP_200_OK)
    return {"id": str(sid), "cancelRequested": True, "status": row["status"]}


async def _wait_terminal(
    services: ServicesDep, owner: str, session_id: UUID, timeout: float
) -> dict[str, Any]:
    """The session once terminal, or as it is when `timeout` runs out."""
    changed = asyncio.Event()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    with services.bus.subscribe(session_key(session_id), lambda _: changed.set()):
        while True:
            changed.clear()
            async with services.db.connection() as conn:
                row = await session_store.get_session(conn, owner, session_id)
            remaining = deadline - loop.time()
            if Status(row["status"]) in TERMINAL or remaining <= 0:
                return row
            # The poll bounds the wait when a notification is lost.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(remaining, 1.0))


@router.post(
    "/{session_id}/messages",
    operation_id="postMessage",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=schemas.MessageAccepted,
    dependencies=[COUNTS_MESSAGE],
    responses=problems(*SESSION_ERRORS, *BODY_ERRORS, 429),
)
async def post_message(
    session_id: SessionId, body: schemas.PostMessage, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    """429 OWNER_QUEUE_FULL when it would queue the session (it is idle, waiting or
    finished) and its owner has FERRYMAN_OWNER_MAX_QUEUED queued; RATE_LIMITED past the key's
    messages a minute; 403 TOOL_NOT_ALLOWED / MODEL_NOT_ALLOWED when the session (made by
    another key of the owner) runs what the caller's key may not use."""
    owner = caller.owner
    sid = parse_session_id(session_id)
    if "tools" in caller.policy or "models" in caller.policy:  # one read, for scoped keys alone
        async with services.db.connection() as conn:
            row = await session_store.get_session(conn, owner, sid)
        check_caller_definition(services, caller, row["tools"], row["model"])
    max_queued = services.settings.owner_max_queued
    async with services.db.transaction() as conn:
        event, delivery = await session_store.post_message(
            conn, owner, sid, body.text, max_queued=max_queued
        )
    return {
        "id": str(sid),
        "message": {"seq": event["seq"], "text": body.text, "delivery": delivery},
    }


@router.post(
    "/{session_id}/compact",
    operation_id="compactSession",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=schemas.CompactionAccepted,
    responses=problems(*SESSION_ERRORS, 409),
)
async def compact_session(session_id: SessionId, owner: Owner, db: DatabaseDep) -> dict[str, Any]:
    """Ask for a compaction (docs/compaction.md): a running session compacts before its next
    model call; a waiting or succeeded one is queued, compacts, and settles as it was. 409
    SESSION_NOT_COMPACTABLE for an idle, failed or cancelled session."""
    sid = parse_session_id(session_id)
    async with db.transaction() as conn:
        event, row = await session_store.request_compaction(conn, owner, sid)
    return {"id": str(sid), "seq": event["seq"], "status": row["status"]}


@router.post(
    "/{session_id}/tool-calls/{tool_call_id}/approval",
    operation_id="decideToolApproval",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=schemas.ApprovalAccepted,
    responses=problems(*SESSION_ERRORS, *BODY_ERRORS, 409),
)
async def decide_tool_approval(
    session_id: SessionId,
    tool_call_id: Annotated[str, Path(min_length=1, max_length=256)],
    body: schemas.Approve,
    caller: CallerDep,
    services: ServicesDep,
) -> dict[str, Any]:
    """Approve or deny a tool call that waits for approval (`tool_approval_requested`). The
    session is re-queued: an approved call runs, a denied one is answered with an error
    result giving the reason, and the model goes on. An approver key decides for the owners
    its policy's `approverFor` names (docs/approvals.md); with FERRYMAN_APPROVAL_SEPARATE, the
    key that created the session may not (403 APPROVAL_SEPARATE)."""
    sid = parse_session_id(session_id)
    approver_for = parse_scopes(caller.policy).approver_for
    async with services.db.transaction() as conn:
        session = await approval_store.decidable_session(conn, caller.owner, approver_for, sid)
        check_separate(services, caller, session)
        event, row = await session_store.decide_approval(
            conn, session["owner_id"], sid, tool_call_id, body.approved, body.reason
        )
    return {
        "id": str(sid),
        "toolCallId": tool_call_id,
        "approved": body.approved,
        "seq": event["seq"],
        "status": row["status"],
    }


@router.post(
    "/{session_id}/tool-calls/{tool_call_id}/result",
    operation_id="postToolResult",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=schemas.ToolResultAccepted,
    responses=problems(*SESSION_ERRORS, *BODY_ERRORS, 409),
)
async def post_tool_result(
    session_id: SessionId,
    tool_call_id: Annotated[str, Path(min_length=1, max_length=256)],
    body: schemas.PostToolResult,
    owner: Owner,
    db: DatabaseDep,
) -> dict[str, Any]:
    """The result of a call of one of the session's client tools (`client_tool_call`), which
    the client ran: the session is re-queued and the model goes on with it. The same result
    posted again answers as the first did (`duplicate: true`); another one for the call is 409
    CLIENT_TOOL_NOT_PENDING."""
    sid = parse_session_id(session_id)
    async with db.transaction() as conn:
        event, row, written = await session_store.post_client_result(
            conn, owner, sid, tool_call_id, body.content, body.isError
        )
    return {
        "id": str(sid),
        "toolCallId": tool_call_id,
        "seq": event["seq"],
        "duplicate": not written,
        "status": row["status"],
    }


@router.get(
    "/{session_id}/transcript",
    operation_id="getTranscript",
    response_model=schemas.Transcript,
    responses=problems(*SESSION_ERRORS, 422),
)
async def get_transcript(
    session_id: SessionId,
    owner: Owner,
    services: ServicesDep,
    after: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> dict[str, Any]:
    """Events after seq `after`: at most `limit`, and at most FERRYMAN_TRANSCRIPT_PAGE_BYTES of
    event data (at least one event). `nextAfter` is where the next page starts, null at the
    end."""
    sid = parse_session_id(session_id)
    async with services.db.transaction() as conn:
        await session_store.read_one_snapshot(conn)
        row = await session_store.get_session(conn, owner, sid)
        rows = await event_store.read_session_events(
            conn, sid, after, limit, services.settings.transcript_page_bytes
        )
    last = int(rows[-1]["seq"]) if rows else after
    return {
        "events": [session_envelope(r, "backlog") for r in rows],
        "lastSeq": row["last_seq"],
        "nextAfter": last if last < row["last_seq"] else None,
    }
