"""The two SSE endpoints of SPEC section 4."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from app.api.deps import ServicesDep, StreamOwner
from app.api.middleware import SERVER_CONNECTION, SERVER_SEND
from app.api.openapi import problems
from app.api.sessions import ANY_ERRORS, SessionId, parse_session_id
from app.domain import position, split_position
from app.services import Services
from app.store import events as event_store
from app.store import sessions as session_store
from app.store.notify import owner_key, session_key
from app.streams.chunks import session_chunks
from app.streams.feed import FeedSource, Page
from app.streams.frames import (
    ResyncReason,
    owner_event,
    parse_cursor,
    resync_reason,
    rewound,
    session_event,
    split_chunk,
)
from app.streams.shortcuts import uvicorn_direct_write
from app.streams.sse import DirectWrites, StreamOptions, event_stream, resync_stream

router = APIRouter(prefix="/api/agent", tags=["streams"])

# 400: a bad cursor; 429: the owner's stream slots are all taken. (The frames: app.api.openapi.)
_SSE_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {"description": "Server-Sent Events; each `data:` is one JSON value."},
    **problems(*ANY_ERRORS, 400, 429),
}
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

# Documented once, as the query parameter: generated clients get one `last_event_id`.
LastEventIdHeader = Annotated[str | None, Header(alias="Last-Event-ID", include_in_schema=False)]
LastEventIdQuery = Annotated[
    str | None,
    Query(
        alias="lastEventId",
        description="Resume after this event id. The `Last-Event-ID` header, which EventSource "
        "sends on every reconnect, does the same and wins.",
    ),
]


class EventStreamResponse(StreamingResponse):
    """An SSE response that asks its stream for a chunk only while the client is there, closes
    the stream, and calls `release`, however it ends (the client left, the stream closed, the
    process shut down)."""

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        release: Callable[[], None],
        direct: DirectWrites | None = None,
    ) -> None:
        super().__init__(body, media_type="text/event-stream", headers=SSE_HEADERS)
        self.stream = body
        self.release = release
        self.direct = direct
        self.client_gone = False
        self.body_send: Send | None = None
        self.connection: object = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.body_send = scope.get(SERVER_SEND)
        self.connection = scope.get(SERVER_CONNECTION)
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.stream.aclose()  # its feed and what it holds go now, not at collection
            self.release()

    async def listen_for_disconnect(self, receive: Receive) -> None:
        await super().listen_for_disconnect(receive)
        self.client_gone = True

    async def stream_response(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        if self.direct is not None:
            self.direct.write = uvicorn_direct_write(self.connection)
        send = self.body_send or send
        async for chunk in self.stream:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            # A cancelled response stays in a reference cycle (through its traceback) until
            # the cycle collector runs: it must not keep its last write alive meanwhile.
            del chunk
            # A send blocked on a client that never reads returns when the client leaves, at
            # once and without an error (uvicorn), and the listener that cancels this task has
            # run by then, but the cancel lands only at this task's next real wait: without
            # this check, the stream would first build every chunk it missed.
            if self.client_gone:
                return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _sse(
    services: Services,
    owner: str,
    body: AsyncGenerator[bytes, None],
    direct: DirectWrites | None = None,
) -> StreamingResponse:
    """Take one of the owner's stream slots (429 when none is left) for the response's life.
    Called last, after every await of the endpoint, so no error can strand a slot."""
    services.slots.take(owner)
    return EventStreamResponse(body, lambda: services.slots.give_back(owner), direct)


def _direct_writes(services: Services) -> DirectWrites | None:
    """The response's direct write for its stream, if the stream shortcuts are on."""
    return DirectWrites() if services.hub.shortcuts else None


def _options(services: Services, follow: bool = True) -> StreamOptions:
    settings = services.settings
    return StreamOptions(settings.ping_interval, settings.sse_retry_ms, follow)


def owner_source(services: Services, owner: str) -> FeedSource:
    async def head() -> tuple[int, bool]:
        async with services.db.connection() as conn:
            return await event_store.owner_head(conn, owner), False

    async def read(after: int, max_bytes: int) -> Page:
        rows, _, after_epoch = await services.owner_pages.get((owner, after, max_bytes))
        return Page.of(rows, owner_event, max_bytes, after_epoch)

    return FeedSource(owner_key(owner), head, read, closable=False)


def session_source(services: Services, session_id: UUID, owner: str) -> FeedSource:
    key = session_key(session_id)

    async def head() -> tuple[int, bool]:
        return await services.session_heads.get(key)

    async def read(after: int, max_bytes: int) -> Page:
        rows, gone, after_epoch = await services.session_pages.get((session_id, after, max_bytes))
        if not rows:
            return Page([], False, gone, after_epoch)
        return Page.of(rows, session_event, max_bytes, after_epoch)

    return FeedSource(key, head, read, chunks=session_chunks(services.db, session_id, owner))


@router.get(
    "/owner-events",
    operation_id="streamOwnerEvents",
    response_class=StreamingResponse,
    responses=_SSE_RESPONSE,
)
async def stream_owner_events(
    owner: StreamOwner,
    services: ServicesDep,
    last_event_id: LastEventIdHeader = None,
    last_event_id_query: LastEventIdQuery = None,
) -> StreamingResponse:
    """Lifecycle events of all the caller's sessions. No cursor: live from now."""
    sent = parse_cursor(last_event_id or last_event_id_query)
    epoch, cursor = split_position(sent or 0)
    async with services.db.connection() as conn:
        bounds = await event_store.owner_feed_bounds(conn, owner, cursor)
    options = _options(services)
    current = position(bounds.last_epoch, bounds.last)
    if sent is None:
        cursor, epoch = bounds.last, bounds.last_epoch
    else:
        reason = resync_reason(
            cursor, bounds.last, bounds.first_retained, services.settings.replay_limit
        ) or rewound(epoch, bounds.epoch_at)
        if reason is not None:
            return _sse(services, owner, resync_stream(reason, sent, current, options))
    source = owner_source(services, owner)
    direct = _direct_writes(services)
    stream = event_stream(
        "owner", services.hub, source, cursor, options, services.shutdown, direct, epoch
    )
    return _sse(services, owner, stream, direct)


@router.get(
    "/{session_id}/events",
    operation_id="streamSessionEvents",
    response_class=StreamingResponse,
    responses={**_SSE_RESPONSE, **problems(404, 422)},
)
async def stream_session_events(
    session_id: SessionId,
    owner: StreamOwner,
    services: ServicesDep,
    last_event_id: LastEventIdHeader = None,
    last_event_id_query: LastEventIdQuery = None,
    follow: Annotated[bool, Query(description="false: close after `caught_up`.")] = True,
) -> StreamingResponse:
    """One session's log; ids are its `seq`, and `<seq>.<chunk>` on token deltas. No cursor:
    replay from seq 1."""
    sid = parse_session_id(session_id)
    raw_cursor, chunk = split_chunk(last_event_id or last_event_id_query)
    sent = parse_cursor(raw_cursor)
    epoch, cursor = split_position(sent or 0)
    async with services.db.connection() as conn:
        row = await session_store.get_session(conn, owner, sid)
        last_seq = int(row["last_seq"])
        reason: ResyncReason | None = None
        if cursor > 0:  # a reconnect: is the event at its cursor the one it saw?
            epoch_at, last_epoch = await event_store.session_log_epochs(conn, sid, cursor, last_seq)
            reason = "cursor_ahead" if cursor > last_seq else rewound(epoch, epoch_at)
    options = _options(services, follow)
    if reason is not None:
        current = position(last_epoch, last_seq)
        return _sse(services, owner, resync_stream(reason, sent or 0, current, options))
    source = session_source(services, sid, owner)
    direct = _direct_writes(services)
    stream = event_stream(
        "session",
        services.hub,
        source,
        cursor,
        options,
        services.shutdown,
        direct,
        epoch if cursor > 0 else None,
        chunk,
    )
    return _sse(services, owner, stream, direct)
