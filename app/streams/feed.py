"""Shared tails of the logs: however many streams of one process watch a feed, one task reads
each new event from the database once and hands it to all of them.

A feed keeps the newest events in memory. A stream whose cursor is older than that buffer reads
the database itself; a stream at the tail waits on the feed. Every read is by cursor, so a lost
or late notification only delays delivery (bounded by the poll interval).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from app.backoff import Backoff
from app.bus import Bus
from app.db.pool import UNAVAILABLE_ERRORS
from app.streams.frames import Event, ephemeral_frame

log = logging.getLogger(__name__)

BATCH = 500


@dataclass(frozen=True)
class FeedSource:
    """How to read one feed: its bus key, its head, and its events after a cursor."""

    key: str
    head: Callable[[], Awaitable[tuple[int, bool]]]  # (last id, closed)
    read: Callable[[int, int], Awaitable[list[Event]]]  # (after, limit) -> events
    # Whether the subject can go away (a session can be deleted; an owner's feed cannot):
    # only then is the head re-read after each batch to notice it.
    closable: bool = True


class Feed:
    def __init__(self, source: FeedSource, *, buffer_size: int, poll_interval: float) -> None:
        self.source = source
        self.poll_interval = poll_interval
        self.buffer: deque[Event] = deque(maxlen=buffer_size)
        self.head = 0  # newest id this feed has read
        self.closed = False  # the feed's subject is gone (a deleted session)
        self.ready = asyncio.Event()
        # One future per generation, shared by every stream of the feed: an announce completes
        # it (waking them all with one callback each) and starts the next generation.
        self._changed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._wake = asyncio.Event()
        self.subscribers = 0
        # Ephemeral frames (token deltas): never logged, kept briefly for live subscribers.
        self.ephemeral: deque[tuple[int, bytes]] = deque(maxlen=256)
        self.ephemeral_count = 0
        self.task: asyncio.Task[None] | None = None
        self.subscription = contextlib.ExitStack()
        # Keep-alive: the feed wakes all its streams every `tick_interval` s, and a stream that
        # wakes with nothing to send pings. One timer per feed, instead of one per stream wait.
        self.tick_interval: float | None = None
        self._ticker: asyncio.TimerHandle | None = None

    def wake(self, ephemeral: str | None = None) -> None:
        if ephemeral is None:
            self._wake.set()
            return
        self.ephemeral_count += 1
        self.ephemeral.append((self.ephemeral_count, ephemeral_frame(ephemeral)))
        self._announce()

    def ephemeral_since(self, seen: int) -> tuple[list[bytes], int]:
        """Ephemeral frames after number `seen` still in memory, and the newest number."""
        return [frame for n, frame in self.ephemeral if n > seen], self.ephemeral_count

    @property
    def changed(self) -> asyncio.Future[None]:
        """A future completed at the next change; take it before checking, then wait on it
        with `wait_changed` (never await it directly: cancelling the waiter would cancel it)."""
        return self._changed

    def _announce(self) -> None:
        changed, self._changed = self._changed, asyncio.get_running_loop().create_future()
        if not changed.done():
            changed.set_result(None)

    def tick_every(self, interval: float) -> None:
        """Wake the streams at least every `interval` s (the shortest any subscriber asked)."""
        if self.tick_interval is not None and self.tick_interval <= interval:
            return
        self.tick_interval = interval
        self.stop_ticking()
        self._ticker = asyncio.get_running_loop().call_later(interval, self._tick)

    def _tick(self) -> None:
        assert self.tick_interval is not None
        self._ticker = asyncio.get_running_loop().call_later(self.tick_interval, self._tick)
        self._announce()

    def stop_ticking(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    def since(self, cursor: int) -> list[Event] | None:
        """Buffered events after `cursor`, or None when the buffer no longer reaches back."""
        if cursor >= self.head:
            return []
        if not self.buffer or self.buffer[0].id > cursor + 1:
            return None
        start = cursor + 1 - self.buffer[0].id
        return [self.buffer[i] for i in range(start, len(self.buffer))]

    async def read(self, cursor: int) -> list[Event]:
        """The next events after `cursor`, from memory when possible."""
        events = self.since(cursor)
        if events is None:
            events = await self.source.read(cursor, BATCH)
        return events

    async def run(self) -> None:
        backoff = Backoff()
        while True:
            try:
                if not self.ready.is_set():
                    self.head, self.closed = await self.source.head()
                    self.ready.set()
                await self._catch_up()
                backoff.reset()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_interval)
                self._wake.clear()
            except UNAVAILABLE_ERRORS as exc:
                log.warning("feed %s cannot read the database: %s", self.source.key, exc)
                await backoff.wait()

    async def _catch_up(self) -> None:
        while True:
            events = await self.source.read(self.head, BATCH)
            if events:
                self.buffer.extend(events)
                self.head = events[-1].id
                self._announce()
            if len(events) < BATCH:
                break
        if self.source.closable and not self.closed:
            _, closed = await self.source.head()
            if closed:
                self.closed = True
                self._announce()


def _wake_waiter(waiter: asyncio.Future[bool], changed: bool) -> None:
    if not waiter.done():
        waiter.set_result(changed)


async def wait_changed(changed: asyncio.Future[None], timeout: float | None = None) -> bool:
    """Wait until `changed` (a feed's `changed`) completes: True, or `timeout` passes: False.

    Costs one future and one callback on the shared future (and a timer with a timeout): no
    task per wait, so waking hundreds of streams of one feed stays cheap.
    """
    if changed.done():
        return True
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[bool] = loop.create_future()

    def on_change(_: asyncio.Future[None]) -> None:
        _wake_waiter(waiter, True)

    changed.add_done_callback(on_change)
    timer = None if timeout is None else loop.call_later(timeout, _wake_waiter, waiter, False)
    try:
        return await waiter
    finally:
        if timer is not None:
            timer.cancel()
        if not changed.done():
            changed.remove_done_callback(on_change)


class FeedHub:
    """The process's feeds, created on first subscriber and dropped after the last leaves."""

    def __init__(self, bus: Bus, *, buffer_size: int = 2048, poll_interval: float = 5.0) -> None:
        self.bus = bus
        self.buffer_size = buffer_size
        self.poll_interval = poll_interval
        self.feeds: dict[str, Feed] = {}
        self._shutdown_watch: asyncio.Task[None] | None = None

    def watch_shutdown(self, shutdown: asyncio.Event) -> None:
        """Wake every feed's streams once `shutdown` is set, so that a stream waits on its feed
        alone (one task for the whole process instead of one per wait)."""
        if self._shutdown_watch is None or self._shutdown_watch.done():
            self._shutdown_watch = asyncio.create_task(
                self._announce_on(shutdown), name="feeds shutdown"
            )

    async def _announce_on(self, shutdown: asyncio.Event) -> None:
        await shutdown.wait()
        for feed in list(self.feeds.values()):
            feed._announce()

    @contextlib.asynccontextmanager
    async def attach(
        self, source: FeedSource, *, tick_interval: float | None = None
    ) -> AsyncIterator[Feed]:
        """Join (or start) the feed of `source`; its bus subscription is in place on return,
        before the caller reads any backlog. With `tick_interval`, the feed also wakes its
        streams at least that often (their keep-alive)."""
        feed = self.feeds.get(source.key)
        if feed is None:
            feed = Feed(source, buffer_size=self.buffer_size, poll_interval=self.poll_interval)
            self.feeds[source.key] = feed
            feed.subscription.enter_context(self.bus.subscribe(source.key, feed.wake))
            feed.task = asyncio.create_task(feed.run(), name=f"feed {source.key}")
        if tick_interval is not None:
            feed.tick_every(tick_interval)
        feed.subscribers += 1
        try:
            yield feed
        finally:
            feed.subscribers -= 1
            if feed.subscribers == 0:
                self.feeds.pop(source.key, None)
                feed.subscription.close()
                feed.stop_ticking()
                if feed.task is not None:
                    feed.task.cancel()
