"""One SSE stream: replay the backlog after the client's cursor, say `caught_up`, then follow the
feed live with keep-alive pings until the client leaves, the subject is deleted or the process
shuts down."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from prometheus_client import Gauge

from app.backoff import Backoff
from app.db.pool import UNAVAILABLE_ERRORS
from app.errors import TooManyStreams
from app.streams.feed import DirectWrite, FeedHub, FeedSource, Follower
from app.streams.frames import (
    PING,
    Ephemeral,
    ResyncReason,
    control,
    event_writes,
    in_order,
    retry,
    settled_by,
    writes,
)

OPEN_STREAMS = Gauge("ferryman_sse_streams_open", "Open SSE streams", ["kind"])


@dataclass
class DirectWrites:
    """A response's way for its stream's feed to write to the connection directly
    (`Feed.park`): set once the response has started, None while the server offers none."""

    write: DirectWrite | None = None


@dataclass(frozen=True)
class StreamOptions:
    ping_interval: float
    retry_ms: int
    follow: bool = True


class StreamSlots:
    """Open streams per owner in this process, at most `limit` each, so that one client cannot
    use up the process's sockets and memory. Counted per process: a stream lives in one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: Counter[str] = Counter()

    def take(self, owner: str) -> None:
        if self.open[owner] >= self.limit:
            raise TooManyStreams(self.limit)
        self.open[owner] += 1

    def give_back(self, owner: str) -> None:
        self.open[owner] -= 1
        if self.open[owner] <= 0:
            del self.open[owner]


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
) -> AsyncGenerator[bytes, None]:
    """Tell the client to take a fresh snapshot, then close."""
    yield retry(options.retry_ms)
    yield resync_frame(reason, cursor, current)


def resync_frame(reason: ResyncReason, cursor: int, current: int) -> bytes:
    return control(
        "resync_required",
        {"reason": reason, "fromEventId": str(cursor), "currentEventId": str(current)},
    )


def _expired(cursor: int, current: int) -> bytes:
    """Retention removed events after `cursor` before this stream sent them: never skip them
    silently (a reader that saw id n must have seen every id <= n); ask for a resync."""
    return resync_frame("expired", cursor, current)


async def event_stream(
    kind: str,
    hub: FeedHub,
    source: FeedSource,
    cursor: int,
    options: StreamOptions,
    shutdown: asyncio.Event,
    direct: DirectWrites | None = None,
) -> AsyncGenerator[bytes, None]:
    OPEN_STREAMS.labels(kind).inc()
    try:
        yield retry(options.retry_ms)
        hub.watch_shutdown(shutdown)
        async with hub.attach(source, tick_interval=options.ping_interval) as feed:
            if not await wait_any(feed.ready, shutdown, timeout=options.ping_interval):
                yield PING
                await wait_any(feed.ready, shutdown, timeout=3600)
            start, replayed, backoff = cursor, 0, Backoff()
            settled = 0  # the last turn end sent (`in_order`)
            while not shutdown.is_set():
                try:
                    events = await feed.read(cursor)
                except UNAVAILABLE_ERRORS:
                    yield PING
                    await backoff.wait()
                    continue
                if not events:
                    break
                if events[0].id != cursor + 1:
                    yield _expired(cursor, feed.head)
                    return
                for chunk in event_writes(events, "backlog", feed.write_bytes):
                    yield chunk
                replayed += len(events)
                cursor = events[-1].id
                settled = settled_by(events, settled)
            yield control(
                "caught_up",
                {"replayed": replayed, "fromEventId": str(start), "cursor": str(cursor)},
            )
            if not options.follow:
                return
            ephemeral_seen = feed.ephemeral_count
            held: list[Ephemeral] = []  # deltas taken, waiting for the event they follow

            async def rest(
                generation: int, cursor: int, settled: int, seen: int
            ) -> tuple[int, int, int]:
                """Wait for the feed with nothing held: parked (`Feed.park`) when the
                response can be written to directly, the feed then moving the stream's
                position (cursor, settled, deltas seen) on as it writes."""
                if direct is None or direct.write is None:
                    await feed.wait(generation)
                    return cursor, settled, seen
                parked = Follower(direct.write, cursor, settled, seen)
                await feed.park(parked, generation)
                return parked.cursor, parked.settled, parked.ephemeral_seen

            sent = True  # whether anything went out since the last wait
            while not shutdown.is_set():
                generation = feed.generation
                # Each turn takes a write's worth of deltas and of events (or one event bigger
                # than that) from the feed, and only once the last went: a stream that cannot
                # send holds no more.
                if not held:
                    held, ephemeral_seen = feed.ephemeral_since(ephemeral_seen)
                try:
                    # From the feed's memory without a coroutine when it can (the common case:
                    # every stream of a feed runs this at every event).
                    live = feed.since(cursor)
                    events = live if live is not None else await feed.read(cursor)
                except UNAVAILABLE_ERRORS:
                    # The database is away: keep the connection, keep pinging, read again.
                    events = []
                    await asyncio.sleep(min(options.ping_interval, 1.0))
                if events and events[0].id != cursor + 1:
                    yield _expired(cursor, feed.head)
                    return
                if held:
                    # A delta's notification may overtake the event it follows (that one is
                    # read from the log): each goes out right after its event.
                    frames, taken, _, cursor, settled = in_order(held, events, cursor, settled)
                    held = held[taken:]
                elif events:
                    frames, cursor = [event.live for event in events], events[-1].id
                    settled = settled_by(events, settled)
                else:
                    frames = []
                if frames:
                    if len(frames) == 1:
                        yield frames[0]  # the common case: one event, shared bytes, one write
                    else:
                        for chunk in writes(frames, feed.write_bytes):
                            yield chunk
                    if (
                        generation == feed.generation
                        and cursor == feed.head
                        and not feed.closed
                        and not held
                        and ephemeral_seen == feed.ephemeral_count
                    ):
                        # Sent all there was, and nothing changed meanwhile: wait now rather
                        # than look again (a turn less per delivery); a wake-up with nothing
                        # to send will ping, as after any turn that sent.
                        sent = False
                        cursor, settled, ephemeral_seen = await rest(
                            generation, cursor, settled, ephemeral_seen
                        )
                    else:
                        sent = True
                    continue
                if feed.closed or shutdown.is_set():
                    return
                if not sent:
                    # Woken by the feed's keep-alive tick (or for nothing new): ping, so no
                    # stream stays silent longer than the ping interval.
                    yield PING
                sent = False
                # Woken by a change, the feed's tick, or shutdown (watch_shutdown above).
                if held:
                    await feed.wait(generation)
                else:
                    cursor, settled, ephemeral_seen = await rest(
                        generation, cursor, settled, ephemeral_seen
                    )
    finally:
        OPEN_STREAMS.labels(kind).dec()
