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


class Feed:
    def __init__(self, source: FeedSource, *, buffer_size: int, poll_interval: float) -> None:
        self.source = source
        self.poll_interval = poll_interval
        self.buffer: deque[Event] = deque(maxlen=buffer_size)
        self.head = 0  # newest id this feed has read
        self.closed = False  # the feed's subject is gone (a deleted session)
        self.ready = asyncio.Event()
        self._changed = asyncio.Event()
        self._wake = asyncio.Event()
        self.subscribers = 0
        # Ephemeral frames (token deltas): never logged, kept briefly for live subscribers.
        self.ephemeral: deque[tuple[int, bytes]] = deque(maxlen=256)
        self.ephemeral_count = 0
        self.task: asyncio.Task[None] | None = None
        self.subscription = contextlib.ExitStack()

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
    def changed(self) -> asyncio.Event:
        """An event set at the next change; take it before checking, then wait on it."""
        return self._changed

    def _announce(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

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
        backoff = 0.1
        while True:
            try:
                if not self.ready.is_set():
                    self.head, self.closed = await self.source.head()
                    self.ready.set()
                await self._catch_up()
                backoff = 0.1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_interval)
                self._wake.clear()
            except UNAVAILABLE_ERRORS as exc:
                log.warning("feed %s cannot read the database: %s", self.source.key, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _catch_up(self) -> None:
        while True:
            events = await self.source.read(self.head, BATCH)
            if events:
                self.buffer.extend(events)
                self.head = events[-1].id
                self._announce()
            if len(events) < BATCH:
                break
        if not self.closed:
            _, closed = await self.source.head()
            if closed:
                self.closed = True
                self._announce()


class FeedHub:
    """The process's feeds, created on first subscriber and dropped after the last leaves."""

    def __init__(self, bus: Bus, *, buffer_size: int = 2048, poll_interval: float = 5.0) -> None:
        self.bus = bus
        self.buffer_size = buffer_size
        self.poll_interval = poll_interval
        self.feeds: dict[str, Feed] = {}

    @contextlib.asynccontextmanager
    async def attach(self, source: FeedSource) -> AsyncIterator[Feed]:
        """Join (or start) the feed of `source`; its bus subscription is in place on return,
        before the caller reads any backlog."""
        feed = self.feeds.get(source.key)
        if feed is None:
            feed = Feed(source, buffer_size=self.buffer_size, poll_interval=self.poll_interval)
            self.feeds[source.key] = feed
            feed.subscription.enter_context(self.bus.subscribe(source.key, feed.wake))
            feed.task = asyncio.create_task(feed.run(), name=f"feed {source.key}")
        feed.subscribers += 1
        try:
            yield feed
        finally:
            feed.subscribers -= 1
            if feed.subscribers == 0:
                self.feeds.pop(source.key, None)
                feed.subscription.close()
                if feed.task is not None:
                    feed.task.cancel()
