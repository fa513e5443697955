"""One SSE stream: replay the backlog after the client's cursor, say `caught_up`, then follow the
feed live with keep-alive pings until the client leaves, the subject is deleted or the process
shuts down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from prometheus_client import Gauge

from app.db.pool import UNAVAILABLE_ERRORS
from app.streams.feed import FeedHub, FeedSource
from app.streams.frames import PING, ResyncReason, control, retry

OPEN_STREAMS = Gauge("ferryman_sse_streams_open", "Open SSE streams", ["kind"])


@dataclass(frozen=True)
class StreamOptions:
    ping_interval: float
    retry_ms: int
    follow: bool = True


async def wait_any(*events: asyncio.Event, timeout: float) -> bool:
    """Wait until any of `events` is set; False on timeout."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return bool(done)


async def resync_stream(
    reason: ResyncReason, cursor: int, current: int, options: StreamOptions
) -> AsyncIterator[bytes]:
    """Tell the client to take a fresh snapshot, then close."""
    yield retry(options.retry_ms)
    yield control(
        "resync_required",
        {"reason": reason, "fromEventId": str(cursor), "currentEventId": str(current)},
    )


async def event_stream(
    kind: str,
    hub: FeedHub,
    source: FeedSource,
    cursor: int,
    options: StreamOptions,
    shutdown: asyncio.Event,
) -> AsyncIterator[bytes]:
    OPEN_STREAMS.labels(kind).inc()
    try:
        yield retry(options.retry_ms)
        async with hub.attach(source) as feed:
            if not await wait_any(feed.ready, shutdown, timeout=options.ping_interval):
                yield PING
                await wait_any(feed.ready, shutdown, timeout=3600)
            start, replayed, backoff = cursor, 0, 0.1
            while not shutdown.is_set():
                try:
                    events = await feed.read(cursor)
                except UNAVAILABLE_ERRORS:
                    yield PING
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                if not events:
                    break
                for event in events:
                    yield event.frame("backlog")
                replayed += len(events)
                cursor = events[-1].id
            yield control(
                "caught_up",
                {"replayed": replayed, "fromEventId": str(start), "cursor": str(cursor)},
            )
            if not options.follow:
                return
            _, ephemeral_seen = feed.ephemeral_since(0)
            while not shutdown.is_set():
                changed = feed.changed
                ephemeral, ephemeral_seen = feed.ephemeral_since(ephemeral_seen)
                for frame in ephemeral:
                    yield frame
                try:
                    events = await feed.read(cursor)
                except UNAVAILABLE_ERRORS:
                    # The database is away: keep the connection, keep pinging, read again.
                    events = []
                    await asyncio.sleep(min(options.ping_interval, 1.0))
                if events:
                    for event in events:
                        yield event.frame("live")
                    cursor = events[-1].id
                    continue
                if feed.closed:
                    return
                if not await wait_any(changed, shutdown, timeout=options.ping_interval):
                    yield PING
    finally:
        OPEN_STREAMS.labels(kind).dec()
