"""Shared tails of the logs: however many streams of one process watch a feed, one task reads
each new event from the database once and hands it to all of them.

A feed keeps the newest events in memory, as many as fit in its byte budget. A stream whose
cursor is older than that buffer reads the database itself; a stream at the tail waits on the
feed. Every read is by cursor, so a lost or late notification only delays delivery (bounded by
the poll interval). Every read, from memory or the database, takes about one write's worth of
events, so a stream whose client does not read holds no more than that.

Live delivery has one rule, `Feed.take`: what a stream at a cursor sends next of the feed's
events and token deltas, and where its cursor goes. A stream's own loop (`streams/sse.py`)
sends what it takes; a stream parked at the tail has it taken and written to its connection by
the feed (`Feed._push`), and wakes only for what one direct write cannot do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from prometheus_client import Counter

from app.backoff import Backoff, Outage
from app.bus import Bus
from app.db.pool import UNAVAILABLE_ERRORS
from app.store.notify import marker_key
from app.streams.frames import (
    TURN_ENDS,
    Ephemeral,
    Event,
    Seen,
    ephemeral_frame,
    in_order,
    rewound,
    settled_by,
)
from app.streams.shortcuts import DirectWrite, malloc_trim

log = logging.getLogger(__name__)

T = TypeVar("T")

# Counted once per announce, not per write: a delivery's whole cost is a few microseconds.
DIRECT_WRITES = Counter(
    "ferryman_sse_direct_writes_total",
    "Parked streams a feed announce served without waking them (Feed.park)",
)

# Rows per read at most (reads are bounded in bytes too), so a page of tiny events stays small.
PAGE_ROWS = 500


@dataclass(frozen=True)
class Page:
    """Events read from the log after a cursor; `more` when the read stopped at its byte or
    row bound, so more may follow; `closed`, whether the subject is gone, when the read could
    tell (its rows carry a `deleted` column), else None."""

    events: list[Event]
    more: bool
    closed: bool | None = None
    # The epoch of the event at the cursor read after, when the read could tell.
    after_epoch: int | None = None

    @classmethod
    def of(
        cls,
        rows: list[dict[str, Any]],
        event: Callable[[dict[str, Any]], Event],
        max_bytes: int,
        after_epoch: int | None = None,
    ) -> Page:
        """A page of store rows read with `max_bytes` and PAGE_ROWS (each row has its `size`)."""
        full = len(rows) >= PAGE_ROWS or sum(row["size"] for row in rows) >= max_bytes
        closed = bool(rows[-1]["deleted"]) if rows and "deleted" in rows[-1] else None
        return cls([event(row) for row in rows], full, closed, after_epoch)

    def check_after(self, epoch: int | None) -> None:
        """Raise LogRewound when the event at the cursor is no longer the one of `epoch` that
        the reader took there (None: the reader does not know, at the log's start)."""
        if epoch is not None and rewound(epoch, self.after_epoch):
            raise LogRewound(epoch, self.after_epoch or 0)


class LogRewound(Exception):
    """The log no longer holds the event a reader's cursor names: the database was promoted
    from a standby that lacked its last commits (asynchronous replication), and their numbers
    were given to new events. Its reader must not go on from the number: that would skip the
    new events silently. It asks its client to resync."""

    def __init__(self, expected: int, found: int) -> None:
        super().__init__(f"the event at the cursor is of epoch {found}, not {expected}")


@dataclass(frozen=True)
class StoredChunks:
    """How a feed reads the token chunks kept for reconnects (app/store/deltas.py)."""

    # (cursor, seen seq, seen chunk) -> the turn open at event `cursor`, as (its afterSeq, its
    # chunks after those the reader saw, in backlog frames), or None when none is open.
    open_turn: Callable[[int, int, int], Awaitable[tuple[int, list[Ephemeral]] | None]]
    # (afterSeq, first, before) -> that turn's chunks numbered first..before-1, in live frames.
    between: Callable[[int, int, int], Awaitable[list[Ephemeral]]]


@dataclass(frozen=True)
class FeedSource:
    """How to read one feed: its bus key, its head, and its events after a cursor."""

    key: str
    head: Callable[[], Awaitable[tuple[int, bool]]]  # (last id, closed)
    # (after, max_bytes) -> the events after `after` until their data reaches `max_bytes`
    # (at least one event, when there is one).
    read: Callable[[int, int], Awaitable[Page]]
    # Whether the subject can go away (a session can be deleted; an owner's feed cannot):
    # only then is it checked after each batch, from the page read when that could tell (one
    # read a wake-up, not two), else from the head.
    closable: bool = True
    # Its token chunks, when it keeps them (a session's feed does; an owner's has no deltas).
    chunks: StoredChunks | None = None


class LogReads:
    """Whether this process can read the logs, from how its feeds' reads end. Once they have
    failed for `give_up_after` s with none succeeding in between, it cannot serve its streams:
    `give_up` ends them, so that their clients reconnect from their last event (through a load
    balancer, to a host that can read) instead of waiting on this one. A lost NOTIFY, one failed
    read or a database restart of a second ends nothing: the next read succeeds first."""

    def __init__(self, give_up_after: float, give_up: Callable[[], None]) -> None:
        self.give_up_after = give_up_after
        self.give_up = give_up
        self.failing_since: float | None = None
        self.outage = Outage(log, "the streams' reads of the log (the database)")

    def failed(self, exc: BaseException) -> None:
        self.outage.failed(exc)
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
        elif now - self.failing_since >= self.give_up_after:
            log.warning(
                "the log unreadable for %.1f s: this process closes its streams",
                now - self.failing_since,
            )
            # The streams that open later have as long again.
            self.failing_since = None
            self.give_up()

    def succeeded(self) -> None:
        self.failing_since = None
        self.outage.recovered()


class Tail(Generic[T]):
    """The newest items of a numbered sequence (consecutive numbers), as many as fit in
    `max_bytes`, but always the newest one. Sized in bytes, not items: a count bounds nothing
    when one item may be a few bytes or a few megabytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.items: deque[tuple[int, T, int]] = deque()  # (number, item, bytes)
        self.bytes = 0

    def append(self, number: int, item: T, size: int) -> None:
        self.items.append((number, item, size))
        self.bytes += size
        while self.bytes > self.max_bytes and len(self.items) > 1:
            self.bytes -= self.items.popleft()[2]

    def clear(self) -> None:
        self.items.clear()
        self.bytes = 0

    def reaches(self, number: int) -> bool:
        """Whether it holds every item after `number` that it ever held."""
        return bool(self.items) and self.items[0][0] <= number + 1

    def after(self, number: int, max_bytes: int) -> tuple[list[T], int]:
        """Items after `number` (from the oldest held, if that is newer), the oldest first, as
        many as fit in `max_bytes` but at least one; and the number of the last one given
        (`number` when none)."""
        if not self.items or self.items[-1][0] <= number:
            return [], number
        if self.items[-1][0] == number + 1:  # the common case: just the newest one
            return [self.items[-1][1]], number + 1
        start = max(0, number + 1 - self.items[0][0])
        # Indexing from the start, not a slice: a deque indexes from its nearer end, and the
        # readers are nearly all at the tail.
        got: list[T] = []
        size = 0
        for i in range(start, len(self.items)):
            n, item, item_bytes = self.items[i]
            if got and size + item_bytes > max_bytes:
                break
            got.append(item)
            size += item_bytes
            number = n
        return got, number


@dataclass(eq=False)
class Follower:
    """A live stream's place in its feed. `Feed.take` moves it on, whether the stream's own
    loop sends what it takes or, while the stream is parked (`Feed.park`), the feed writes that
    straight to its connection (`write`, when the server offers one)."""

    write: DirectWrite | None
    cursor: int  # the last event taken
    settled: int  # the last turn end taken (`in_order`)
    ephemeral_seen: int  # the number of the last delta taken
    # The last chunk taken (`in_order`): a chunk up to it is not sent again.
    seen: Seen = (0, 0)
    # Chunks it missed, found when a later one came (`in_order`): the stream's loop sends them
    # from the store (`Feed.fill`) before anything else.
    gap: tuple[int, int, int] | None = None
    epoch: int | None = None  # of the last event taken (`Page.check_after`)
    # Deltas taken whose event is not taken yet: each goes out right after it.
    held: list[Ephemeral] = field(default_factory=list)
    # Frames the feed took while the stream was parked and could not write directly (more than
    # a write's worth, a connection that takes no more): the stream's loop sends them first.
    unsent: list[bytes] = field(default_factory=list)
    waiter: asyncio.Future[None] | None = None


class Feed:
    def __init__(
        self,
        source: FeedSource,
        *,
        buffer_bytes: int,
        write_bytes: int,
        reads: LogReads | None = None,
    ) -> None:
        self.source = source
        self.reads = reads
        # What one stream takes at a time, from memory or the database: one write's worth, so a
        # stream that cannot send holds no more than that (and its write).
        self.write_bytes = write_bytes
        self.buffer: Tail[Event] = Tail(buffer_bytes)
        self.head = 0  # newest id this feed has read
        self.head_epoch: int | None = None  # its epoch, once a read told
        self.closed = False  # the feed's subject is gone (a deleted session)
        self.ready = asyncio.Event()
        # Set when this process gave up reading the log (`LogReads`): the streams end.
        self.unreadable = asyncio.Event()
        # Bumped at every change. A stream notes it before checking, then parks until the next
        # one (`park`). A waiter is one future per stream, woken straight from here: one
        # callback (its task's wake-up) per stream and announce, and no per-wait closure or
        # callback-list entry, which, living until the next event, the GC would promote.
        self.generation = 0
        self.followers: dict[Follower, None] = {}  # parked streams, in the order they parked
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self.subscribers = 0
        # Ephemeral frames (token deltas): never logged, kept briefly for live subscribers. A
        # stream more than a write's worth behind loses the oldest: the durable
        # assistant_message carries the whole text.
        self.ephemeral: Tail[Ephemeral] = Tail(write_bytes)
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
        frame = ephemeral_frame(ephemeral)
        self.ephemeral.append(self.ephemeral_count, frame, frame.size)
        # A delta wakes its streams rather than being written to them: a stream that runs
        # behind then sends the deltas that piled up in one write. Written one at a time, 2,000
        # streaming sessions cost a write per delta per stream, and their subscribers a read
        # each: at 2,000 sessions on this machine, p99 went from 5 s to 19 s.
        self._announce(push=False)

    def ephemeral_since(self, seen: int) -> tuple[list[Ephemeral], int]:
        """Ephemeral frames after number `seen` still in memory, a write's worth at most, and
        the number of the last one given."""
        return self.ephemeral.after(seen, self.write_bytes)

    def take(self, follower: Follower, events: list[Event] | None = None) -> list[bytes] | None:
        """What a live stream sends next, and its place moved past it: the one rule of live
        delivery, whether the stream's own loop sends the frames or the feed writes them
        straight to its connection (`_push`). The events after its cursor come from the feed's
        memory, or are `events` (read from the log when that no longer reaches back); the
        feed's token deltas go in among them, each right after the event it follows, and one
        of a turn already settled is dropped (`in_order`); one whose event is not among them
        is held for a later call. None, moving nothing, when the feed's memory no longer
        reaches back to the cursor, or when `events` do not follow it (retention removed
        events the stream has not sent: it must tell the client to resync)."""
        if events is None:
            if (
                follower.cursor + 1 == self.head
                and follower.ephemeral_seen == self.ephemeral_count
                and not follower.held
                and self.buffer.items
            ):
                # The common case, for every stream of a feed at every event: the newest one
                # alone (as below, without the general path's lists).
                newest = self.buffer.items[-1][1]
                follower.cursor = newest.id
                follower.epoch = newest.epoch
                if newest.type in TURN_ENDS:
                    follower.settled = newest.id
                return [newest.live]
            events = self.since(follower.cursor)
            if events is None:
                return None
        elif events and events[0].id != follower.cursor + 1:
            return None
        # Each call takes a write's worth of deltas and of events (or one event bigger than
        # that), and the next only once these went: a stream that cannot send holds no more.
        if not follower.held and follower.ephemeral_seen != self.ephemeral_count:
            follower.held, follower.ephemeral_seen = self.ephemeral_since(follower.ephemeral_seen)
        if follower.held:
            got = in_order(follower.held, events, follower.cursor, follower.settled, follower.seen)
            del follower.held[: got.deltas]
            follower.cursor, follower.settled = got.cursor, got.settled
            follower.seen, follower.gap = got.seen, got.gap
            if got.events:
                follower.epoch = events[got.events - 1].epoch
            return got.frames
        if not events:
            return []
        follower.cursor = events[-1].id
        follower.epoch = events[-1].epoch
        follower.settled = settled_by(events, follower.settled)
        return [event.live for event in events]

    def caught_up(self, follower: Follower) -> bool:
        """Whether a live stream has taken all there is, so it may park until the next change."""
        return (
            follower.cursor == self.head
            and not self.closed
            and not follower.held
            and not follower.unsent
            and follower.ephemeral_seen == self.ephemeral_count
            and follower.gap is None
        )

    async def fill(self, follower: Follower) -> list[bytes]:
        """The frames of the stored chunks a live stream missed (`follower.gap`, found by
        `take`), its place moved past them: the chunk that showed the gap goes next. Best
        effort: what the store does not have (a failed flush, a turn past its stored chunks)
        stays missed."""
        assert follower.gap is not None
        after, first, came = follower.gap
        follower.gap = None
        follower.seen = (after, came - 1)
        if self.source.chunks is None:
            return []
        try:
            missed = await self._reported(self.source.chunks.between(after, first, came))
        except UNAVAILABLE_ERRORS:
            return []
        return [chunk.sent_at(follower.cursor) for chunk in missed]

    async def park(self, follower: Follower, generation: int) -> None:
        """Wait for the first change after `generation` (read before checking for work; at
        once if there was one since). Meanwhile, when the stream's connection can be written
        to directly (`follower.write`), the feed takes what comes for it and writes it there:
        one write per stream and event, no task woken. The stream wakes for a token delta (see
        `wake`), for what a direct write cannot do (`_push`), for the feed's keep-alive tick,
        its close, shutdown."""
        if generation != self.generation:
            return
        follower.waiter = self._loop.create_future()
        self.followers[follower] = None
        try:
            await follower.waiter  # cancelled: the stream left, and the next announce skips it
        finally:
            self.followers.pop(follower, None)

    def _announce(self, *, push: bool = True) -> None:
        """Tell the parked streams something changed: each is written to (`_push`), or, when
        that cannot serve it or `push` is false, woken."""
        self.generation += 1
        if not self.followers:
            return
        if push:
            woken = [follower for follower in self.followers if not self._push(follower)]
            DIRECT_WRITES.inc(len(self.followers) - len(woken))
        else:
            woken = list(self.followers)
        for follower in woken:
            del self.followers[follower]
            if follower.waiter is not None and not follower.waiter.done():
                follower.waiter.set_result(None)

    def _push(self, follower: Follower) -> bool:
        """Take what is new for a parked stream (`take`) and write it straight to its
        connection; whether it stays parked (written, and it has all there is). When one
        direct write cannot send what was taken, its loop does (`unsent`); it also wakes to
        read the log, to resync, or at the feed's close."""
        if follower.write is None or self.closed:
            return False
        frames = self.take(follower)
        if frames is None:
            return False
        if frames:
            chunk = frames[0] if len(frames) == 1 else b"".join(frames)
            if (len(frames) > 1 and len(chunk) > self.write_bytes) or not follower.write(chunk):
                follower.unsent = frames
                return False
        return self.caught_up(follower)

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
        self._announce(push=False)

    def stop_ticking(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    def give_up(self) -> None:
        """This process cannot read the log: wake the streams to end, and stop."""
        self.unreadable.set()
        self._announce(push=False)
        self.close()

    def close(self) -> None:
        """Stop, and let go of the buffered frames now: the cancelled task's traceback keeps
        this feed alive in a reference cycle until the cycle collector runs, maybe much later."""
        self.subscription.close()
        self.stop_ticking()
        if self.task is not None:
            self.task.cancel()
        self.buffer.clear()
        self.ephemeral.clear()

    def since(self, cursor: int) -> list[Event] | None:
        """Buffered events after `cursor`, a write's worth at most, or None when the buffer no
        longer reaches back."""
        if cursor >= self.head:
            return []
        if not self.buffer.reaches(cursor):
            return None
        return self.buffer.after(cursor, self.write_bytes)[0]

    async def read(self, cursor: int, epoch: int | None = None) -> list[Event]:
        """The next events after `cursor`, a write's worth at most, from memory when possible.
        LogRewound when the log read no longer holds the event of `epoch` at `cursor`."""
        events = self.since(cursor)
        if events is None:
            page = await self._read(cursor)
            page.check_after(epoch)
            events = page.events
        return events

    async def _read(self, cursor: int) -> Page:
        return await self._reported(self.source.read(cursor, self.write_bytes))

    def rewound(self) -> None:
        """The log was rewound under this feed (LogRewound): end its streams, whose clients
        reconnect and have their cursors checked against the log as it is now, and stop. The
        hub starts a new feed for the streams that open later (`FeedHub.attach`)."""
        log.warning(
            "the log of %s was rewound (a failover lost commits): its streams end", self.source.key
        )
        self.give_up()

    async def _reported(self, read: Awaitable[T]) -> T:
        """`read` of the database, its outcome told to `reads`."""
        try:
            got = await read
        except UNAVAILABLE_ERRORS as exc:
            if self.reads is not None:
                self.reads.failed(exc)
            raise
        if self.reads is not None:
            self.reads.succeeded()
        return got

    async def run(self) -> None:
        backoff = Backoff()
        while True:
            try:
                if not self.ready.is_set():
                    self.head, self.closed = await self._reported(self.source.head())
                    self.ready.set()
                await self._catch_up()
                backoff.reset()
                # Woken by a notification, or by the hub's fallback poll.
                await self._wake.wait()
                self._wake.clear()
            except UNAVAILABLE_ERRORS:
                await backoff.wait()
            except LogRewound:
                self.rewound()
                return

    async def _catch_up(self) -> None:
        while True:
            page = await self._read(self.head)
            page.check_after(self.head_epoch)
            if self.head_epoch is None and page.after_epoch is not None:
                self.head_epoch = page.after_epoch
            for event in page.events:
                self.buffer.append(event.id, event, event.size)
            if page.events:
                self.head = page.events[-1].id
                self.head_epoch = page.events[-1].epoch
                self._announce()
            if not page.more:
                break
        if self.source.closable and not self.closed:
            closed = page.closed
            if closed is None:
                _, closed = await self._reported(self.source.head())
            if closed:
                self.closed = True
                self._announce()


def _moved(feed: Feed, head: tuple[int, bool] | None) -> bool:
    """Whether a feed has something to read: a newer event, or its subject gone."""
    if head is None:
        return False
    last, gone = head
    return last > feed.head or (gone and feed.source.closable and not feed.closed)


# How long, in poll intervals, a poll waits for the bus to hear its marker (`_heard_up_to`).
MARKER_WAIT_POLLS = 4


class Heads(Protocol):
    """The heads of feeds, by key: (newest id, subject gone), for the fallback poll. With
    `marker`, the read also sends the notification of that key, after those of the writes it
    saw."""

    def __call__(
        self, keys: list[str], marker: str | None = None
    ) -> Awaitable[dict[str, tuple[int, bool]]]: ...


class FeedHub:
    """The process's feeds, created on first subscriber and dropped after the last leaves.

    The fallback for a lost notification is one poll for all of them: every `poll_interval`,
    `heads` reads the head of every feed in one query and wakes those that moved (or whose
    subject went). A poll per feed cost two reads per feed and interval: at 1,000 session
    streams, 400 reads a second that held up the reads that had something to read. Without
    `heads`, the poll wakes every feed, and each reads for itself.

    The poll wakes a feed only once the bus has handed out every notification committed before
    its read (`_heard_up_to`): woken earlier, a feed read a turn's `assistant_message` while that
    turn's last delta still waited in a LISTEN connection running behind, and the stream, having
    sent the message, dropped the delta as late (`in_order`): at 2,000 streaming sessions, tokens
    lost at the ends of turns.

    `shortcuts` (FERRYMAN_STREAM_SHORTCUTS): whether its streams may be written to directly and
    the process's heap trimmed after feeds go (app/streams/shortcuts.py). `outage_close`
    (FERRYMAN_STREAM_OUTAGE_CLOSE): how long its reads may fail before it closes its streams
    (`LogReads`)."""

    def __init__(
        self,
        bus: Bus,
        *,
        buffer_bytes: int = 16 * 1_048_576,
        write_bytes: int = 65_536,
        poll_interval: float = 5.0,
        heads: Heads | None = None,
        shortcuts: bool = True,
        outage_close: float = 10.0,
    ) -> None:
        self.bus = bus
        self.reads = LogReads(outage_close, self._give_up)
        self.shortcuts = shortcuts
        self._malloc_trim = malloc_trim() if shortcuts else None
        self.buffer_bytes = buffer_bytes
        self.write_bytes = write_bytes
        self.poll_interval = poll_interval
        self.heads = heads
        self.feeds: dict[str, Feed] = {}
        self.marker = marker_key(uuid.uuid4())  # this process's own (`_heard_up_to`)
        self._shutdown_watch: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._trim: asyncio.TimerHandle | None = None

    def _poll_soon(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="feeds poll")

    async def _poll(self) -> None:
        while self.feeds:
            await asyncio.sleep(self.poll_interval)
            feeds = list(self.feeds.values())
            if self.heads is None:
                moved = feeds
            else:
                heads = await self._read_heads(self.heads, feeds)
                if heads is None:
                    continue
                moved = [feed for feed in feeds if _moved(feed, heads.get(feed.source.key))]
            for feed in moved:
                feed.wake()

    async def _read_heads(
        self, heads: Heads, feeds: list[Feed]
    ) -> dict[str, tuple[int, bool]] | None:
        """The heads of `feeds`, once the bus has heard what was sent before they were read;
        None when the database could not be read."""
        heard = asyncio.Event()
        with self.bus.subscribe(self.marker, lambda _body: heard.set()):
            try:
                got = await heads([feed.source.key for feed in feeds], self.marker)
            except UNAVAILABLE_ERRORS as exc:
                self.reads.failed(exc)
                return None
            self.reads.succeeded()
            await self._heard_up_to(heard)
        return got

    async def _heard_up_to(self, marker: asyncio.Event) -> None:
        """Wait until the bus hears the poll's marker, so every notification sent before it has
        reached its feed. A connected bus hears it, however far behind it runs (and a bus that
        reconnects wakes every waiter), so the bound is only a backstop. With the bus down
        nothing is being heard: no wait."""
        if self.bus.connected.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(marker.wait(), MARKER_WAIT_POLLS * self.poll_interval)

    def _give_up(self) -> None:
        """Close every stream: this process cannot read the log. A stream that opens later
        starts a feed of its own."""
        feeds, self.feeds = self.feeds, {}
        for feed in feeds.values():
            feed.give_up()

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
            feed._announce(push=False)

    @contextlib.asynccontextmanager
    async def attach(
        self, source: FeedSource, *, tick_interval: float | None = None
    ) -> AsyncIterator[Feed]:
        """Join (or start) the feed of `source`; its bus subscription is in place on return,
        before the caller reads any backlog. With `tick_interval`, the feed also wakes its
        streams at least that often (their keep-alive)."""
        feed = self.feeds.get(source.key)
        if feed is None or feed.unreadable.is_set():  # none, or one that ended (`rewound`)
            feed = Feed(
                source,
                buffer_bytes=self.buffer_bytes,
                write_bytes=self.write_bytes,
                reads=self.reads,
            )
            self.feeds[source.key] = feed
            self._poll_soon()
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
                if self.feeds.get(source.key) is feed:  # not given up (`_give_up`)
                    del self.feeds[source.key]
                feed.close()
                self._give_back_memory_soon()

    def _give_back_memory_soon(self) -> None:
        """Return the heap's free pages to the OS shortly (once for a burst of feeds that go).
        A feed's events are big allocations that malloc serves from the heap, and freeing them
        leaves holes it keeps: a process that once held many would stay that big."""
        if self._malloc_trim is not None and self._trim is None:
            self._trim = asyncio.get_running_loop().call_later(1.0, self._give_back_memory)

    def _give_back_memory(self) -> None:
        self._trim = None
        assert self._malloc_trim is not None
        self._malloc_trim()
