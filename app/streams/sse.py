"""One SSE stream: replay the backlog after the client's cursor (and the stored token chunks of
a turn still open there), say `caught_up`, then follow the feed live with keep-alive pings until
the client leaves, the subject is deleted, the process shuts down, or it has been unable to read
the log for FERRYMAN_STREAM_OUTAGE_CLOSE (`feed.LogReads`: the response ends, and the client
reconnects from its last event)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from prometheus_client import Gauge

from app.backoff import Backoff
from app.db.pool import UNAVAILABLE_ERRORS
from app.domain import position
from app.errors import TooManyStreams
from app.streams.feed import Feed, FeedHub, FeedSource, Follower, LogRewound
from app.streams.frames import (
    PING,
    ResyncReason,
    Seen,
    control,
    event_writes,
    retry,
    settled_by,
    writes,
)
from app.streams.shortcuts import DirectWrite

OPEN_STREAMS = Gauge("ferryman_sse_streams_open", "Open SSE streams", ["kind"])


@dataclass
class DirectWrites:
    """A response's way for its stream's feed to write to the connection directly
    (`Feed.park`): set once the response has started, None while the server offers none.
    Given to a stream only with FERRYMAN_STREAM_SHORTCUTS on."""

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
    """`cursor` and `current` are positions (`domain.position`), as the client holds them."""
    return control(
        "resync_required",
        {"reason": reason, "fromEventId": str(cursor), "currentEventId": str(current)},
    )


def _expired(cursor: int, epoch: int | None, feed: Feed) -> bytes:
    """Retention removed events after `cursor` before this stream sent them: never skip them
    silently (a reader that saw id n must have seen every id <= n); ask for a resync."""
    return resync_frame("expired", position(epoch or 0, cursor), _head(feed))


def _rewound(cursor: int, epoch: int | None, feed: Feed) -> bytes:
    """The log lost the events up to this stream's cursor (`LogRewound`): the client's view
    is ahead of the log, as a reconnect would find (`cursor_ahead`)."""
    return resync_frame("cursor_ahead", position(epoch or 0, cursor), _head(feed))


def _head(feed: Feed) -> int:
    return position(feed.head_epoch or 0, feed.head)


async def event_stream(
    kind: str,
    hub: FeedHub,
    source: FeedSource,
    cursor: int,
    options: StreamOptions,
    shutdown: asyncio.Event,
    direct: DirectWrites | None = None,
    epoch: int | None = None,
    seen_chunk: int = 0,
) -> AsyncGenerator[bytes, None]:
    """`cursor`: the last event the client has, of `epoch` (None at a log's start);
    `seen_chunk`: the chunks of the turn open at it that it has too (a cursor
    `<cursor>.<seen_chunk>`, from a token delta's id)."""
    OPEN_STREAMS.labels(kind).inc()
    try:
        yield retry(options.retry_ms)
        hub.watch_shutdown(shutdown)
        async with hub.attach(source, tick_interval=options.ping_interval) as feed:
            if not await wait_any(
                feed.ready, feed.unreadable, shutdown, timeout=options.ping_interval
            ):
                yield PING
                await wait_any(feed.ready, feed.unreadable, shutdown, timeout=3600)
            start, replayed, backoff = cursor, 0, Backoff()
            start_position = position(epoch or 0, cursor)
            settled = 0  # the last turn end sent (`in_order`)
            while not shutdown.is_set():
                if feed.unreadable.is_set():
                    return
                try:
                    events = await feed.read(cursor, epoch)
                except UNAVAILABLE_ERRORS:
                    yield PING
                    await backoff.wait()
                    continue
                except LogRewound:
                    yield _rewound(cursor, epoch, feed)
                    return
                if not events:
                    break
                if events[0].id != cursor + 1:
                    yield _expired(cursor, epoch, feed)
                    return
                for chunk in event_writes(events, "backlog", feed.write_bytes):
                    yield chunk
                replayed += len(events)
                cursor, epoch = events[-1].id, events[-1].epoch
                settled = settled_by(events, settled)
            # Before the stored chunks are read: the live ones from here on may repeat them,
            # and `Feed.take` drops those (`in_order`), so none is missed in between.
            ephemeral_seen = feed.ephemeral_count
            seen: Seen = (0, 0)
            if source.chunks is not None:
                seen = (cursor, 0)
                try:
                    turn = await source.chunks.open_turn(cursor, start, seen_chunk)
                except UNAVAILABLE_ERRORS:
                    turn = None  # best effort: the turn's message carries its text
                if turn is not None:
                    after, stored = turn
                    for piece in writes([c.sent_at(cursor) for c in stored], feed.write_bytes):
                        yield piece
                    if stored:
                        seen = (after, stored[-1].chunk)
                    else:
                        seen = (after, seen_chunk if after <= start else 0)
            yield control(
                "caught_up",
                {
                    "replayed": replayed,
                    "fromEventId": str(start_position),
                    "cursor": str(position(epoch or 0, cursor)),
                },
            )
            if not options.follow:
                return
            # Live: what the feed's one rule (`Feed.take`) gives it. Parked when it has all
            # there is, the feed writes to its connection directly if it can (`Feed.park`).
            follower = Follower(
                direct.write if direct is not None else None,
                cursor,
                settled,
                ephemeral_seen,
                seen,
                epoch=epoch,
            )
            sent = True  # whether anything went out since the last wait
            while not shutdown.is_set():
                if feed.unreadable.is_set():
                    return
                generation = feed.generation
                if follower.unsent:  # taken while parked, and no direct write could send it
                    frames, follower.unsent = follower.unsent, []
                elif follower.gap is not None:  # chunks missed: from the store, then on
                    frames = await feed.fill(follower)
                    if not frames:
                        continue
                else:
                    # From the feed's memory without a coroutine when it can (the common case:
                    # every stream of a feed runs this at every event), else from the log.
                    taken = feed.take(follower)
                    if taken is None:
                        try:
                            events = await feed.read(follower.cursor, follower.epoch)
                        except UNAVAILABLE_ERRORS:
                            # The database is away: keep the connection, keep pinging, read
                            # again (until the feed gives up: `feed.unreadable`).
                            events = []
                            await asyncio.sleep(min(options.ping_interval, 1.0))
                        except LogRewound:
                            yield _rewound(follower.cursor, follower.epoch, feed)
                            return
                        taken = feed.take(follower, events)
                        if taken is None:
                            yield _expired(follower.cursor, follower.epoch, feed)
                            return
                    frames = taken
                    if not frames and follower.gap is not None:
                        continue  # stopped at a chunk after missed ones: fill first
                if frames:
                    if len(frames) == 1:
                        yield frames[0]  # the common case: one event, shared bytes, one write
                    else:
                        for chunk in writes(frames, feed.write_bytes):
                            yield chunk
                    if generation == feed.generation and feed.caught_up(follower):
                        # Sent all there was, and nothing changed meanwhile: wait now rather
                        # than look again (a turn less per delivery); a wake-up with nothing
                        # to send will ping, as after any turn that sent.
                        sent = False
                        await feed.park(follower, generation)
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
                await feed.park(follower, generation)
    finally:
        OPEN_STREAMS.labels(kind).dec()
