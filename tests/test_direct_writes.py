"""Streams parked on their feed (`Feed.park`): the feed writes what comes next straight to each
connection, by the one rule of live delivery the stream's own loop follows (`Feed.take`), so
with the bytes that loop would send, and wakes the stream for everything a direct write cannot
do. Pure (a list stands for the connection), then a real server under uvicorn, whose streams
take the direct path with FERRYMAN_STREAM_SHORTCUTS on and never with it off."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from app.bus import Bus
from app.domain import OwnerEventType
from app.store.events import append_owner_event
from app.store.notify import STREAMS_CHANNEL, ephemeral_body, owner_key
from app.streams.feed import Feed, FeedHub, FeedSource, Follower, Page
from app.streams.frames import PING, Event
from app.streams.sse import DirectWrites, StreamOptions, event_stream
from tests.support import ServerProcess, client, running, sse

STAGE = OwnerEventType.SESSION_ACTIVE_STAGE
DIRECT_METRIC = "ferryman_sse_direct_writes_total"


async def _no_head() -> tuple[int, bool]:
    return 0, False


async def _no_read(after: int, max_bytes: int) -> Page:
    return Page([], False)


class Connection:
    """What a direct write wrote, and whether it takes more."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.full = False

    def write(self, chunk: bytes) -> bool:
        if self.full:
            return False
        self.chunks.append(chunk)
        return True


def _event(id_: int, type_: str = "tool_result") -> Event:
    return Event.of(id_, type_, {"id": str(id_), "type": type_, "data": {}})


def _publish(feed: Feed, *events: Event) -> None:
    """As the feed's task does after a read: buffer, move the head, announce."""
    for event in events:
        feed.buffer.append(event.id, event, event.size)
    feed.head = events[-1].id
    feed._announce()


def _delta(feed: Feed, after: int, text: str) -> None:
    envelope = json.dumps({"type": "message_delta", "afterSeq": after, "data": {"text": text}})
    feed.wake(ephemeral_body(after, "message_delta", envelope))


async def _parked(feed: Feed, connection: Connection) -> tuple[Follower, asyncio.Task[None]]:
    follower = Follower(connection.write, feed.head, 0, feed.ephemeral_count)
    task = asyncio.create_task(feed.park(follower, feed.generation))
    await asyncio.sleep(0)
    return follower, task


def _feed() -> Feed:
    return Feed(FeedSource("test", _no_head, _no_read), buffer_bytes=65_536, write_bytes=1024)


async def test_a_parked_stream_is_written_to_without_waking() -> None:
    feed, connection = _feed(), Connection()
    follower, task = await _parked(feed, connection)
    _publish(feed, _event(1))
    _publish(feed, _event(2), _event(3))
    await asyncio.sleep(0)
    assert not task.done() and follower.cursor == 3
    assert connection.chunks == [_event(1).live, _event(2).live + _event(3).live]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not feed.followers  # a stream that leaves unparks


async def test_a_delta_wakes_the_stream_and_goes_with_the_next_event_it_precedes() -> None:
    """A token delta is not written directly (the stream's own loop sends the ones that piled
    up in one write); a delta already taken when an event comes goes out before it."""
    feed, connection = _feed(), Connection()
    follower, task = await _parked(feed, connection)
    _delta(feed, 0, "Hel")
    await asyncio.wait_for(task, 1)
    assert connection.chunks == [] and follower.ephemeral_seen == 0
    _publish(feed, _event(1))  # nobody parked: only buffered
    follower = Follower(connection.write, 0, 0, 0)  # as a stream that took nothing yet
    task = asyncio.create_task(feed.park(follower, feed.generation))
    await asyncio.sleep(0)
    _publish(feed, _event(2))
    await asyncio.sleep(0)
    assert not task.done() and follower.cursor == 2
    assert connection.chunks[0].index(b'"Hel"') < connection.chunks[0].index(b"id: 1")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_what_a_direct_write_cannot_do_wakes_the_stream() -> None:
    feed, connection = _feed(), Connection()
    # A delta whose event has not been read yet: the stream must hold it.
    follower, task = await _parked(feed, connection)
    _delta(feed, 1, "early")
    await asyncio.wait_for(task, 1)
    assert connection.chunks == [] and follower.cursor == 0 and follower.ephemeral_seen == 0
    # A connection that takes no more: nothing written, the stream wakes to send what the
    # feed took for it through its own loop.
    follower, task = await _parked(feed, connection)
    connection.full = True
    _publish(feed, _event(1))
    await asyncio.wait_for(task, 1)
    assert connection.chunks == [] and follower.unsent == [_event(1).live]
    # More than a write's worth of events: one write's worth goes, the stream wakes for the
    # rest.
    connection.full = False
    follower, task = await _parked(feed, connection)
    big = [Event.of(n, "tool_result", {"id": str(n), "pad": "x" * 600}) for n in (2, 3)]
    _publish(feed, *big)
    await asyncio.wait_for(task, 1)
    assert connection.chunks == [big[0].live] and follower.cursor == 2
    # A delta and its event that together pass a write's worth: the stream's loop splits them.
    connection.chunks.clear()
    _delta(feed, 3, "y" * 600)
    follower = Follower(connection.write, 3, 0, feed.ephemeral_count - 1)  # the delta not taken
    task = asyncio.create_task(feed.park(follower, feed.generation))
    await asyncio.sleep(0)
    _publish(feed, Event.of(4, "tool_result", {"id": "4", "pad": "x" * 600}))
    await asyncio.wait_for(task, 1)
    assert connection.chunks == [] and len(follower.unsent) == 2 and follower.cursor == 4
    # The keep-alive tick, the feed's close: woken too.
    for wake in (lambda: feed._announce(push=False), lambda: setattr(feed, "closed", True)):
        follower, task = await _parked(feed, connection)
        wake()
        feed._announce()
        await asyncio.wait_for(task, 1)


async def test_a_late_delta_of_a_settled_turn_is_dropped_as_the_loop_drops_it() -> None:
    feed, connection = _feed(), Connection()
    _delta(feed, 0, "already in the message")  # its notification was late
    follower = Follower(connection.write, 0, 1, 0)  # the stream sent the turn's end (1)
    _publish(feed, _event(1, "assistant_message"))
    follower.cursor = 1
    task = asyncio.create_task(feed.park(follower, feed.generation))
    await asyncio.sleep(0)
    _publish(feed, _event(2, "session_end"))
    await asyncio.sleep(0)
    assert not task.done() and connection.chunks == [_event(2, "session_end").live]
    assert follower.ephemeral_seen == feed.ephemeral_count
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# Steps of a feed's life: events committed together (each a type and a padding), a token delta
# (following the newest event, an older one, or one not read yet), the connection filling up or
# draining.
TYPES = st.sampled_from(["tool_result", "assistant_message", "model_retry"])
EVENTS = st.tuples(st.just("events"), st.lists(st.tuples(TYPES, st.integers(0, 700)), min_size=1))
DELTA = st.tuples(st.just("delta"), st.integers(-2, 1))
FULL = st.tuples(st.just("full"), st.booleans())
STEPS = st.lists(st.one_of(EVENTS, DELTA, FULL), max_size=25)


async def _until(condition: Callable[[], bool]) -> None:
    """Let the other tasks run until `condition` holds: all in memory, so within a few turns."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the stream never settled")


async def _live_bytes(steps: list[tuple[str, Any]], *, direct: bool) -> bytes:
    """What one stream of a feed sends, from its caught_up on, through the steps; with `direct`,
    written to its connection by the feed while it is parked wherever the feed can."""
    log: list[Event] = []

    async def head() -> tuple[int, bool]:
        return len(log), False

    async def read(after: int, max_bytes: int) -> Page:
        got: list[Event] = []
        for event in log[after:]:
            if got and sum(e.size for e in got) + event.size > max_bytes:
                break
            got.append(event)
        return Page(got, more=after + len(got) < len(log))

    sent: list[bytes] = []
    full = False

    def write(chunk: bytes) -> bool:
        if not full:
            sent.append(chunk)
        return not full

    hub = FeedHub(Bus("postgresql://unused.invalid/none", [STREAMS_CHANNEL]), write_bytes=1024)
    source = FeedSource(owner_key("t"), head, read)
    options = StreamOptions(ping_interval=30, retry_ms=2000)
    shutdown = asyncio.Event()
    body = event_stream(
        "owner", hub, source, 0, options, shutdown, DirectWrites(write if direct else None)
    )

    async def consume() -> None:
        async for chunk in body:
            sent.append(chunk)

    def settled() -> bool:
        """Whether the stream waits with all there is (parked, its feed at the log's head)."""
        return bool(feed.followers) and feed.head == len(log)

    reader = asyncio.create_task(consume())
    await _until(lambda: source.key in hub.feeds)
    feed = hub.feeds[source.key]
    await _until(settled)
    start = len(sent)
    for step, arg in steps:
        if step == "events":
            for type_, pad in arg:
                n = len(log) + 1
                log.append(Event.of(n, type_, {"id": str(n), "type": type_, "pad": "x" * pad}))
            feed.wake()
        elif step == "delta":
            after = max(0, len(log) + arg)
            envelope = json.dumps({"type": "message_delta", "afterSeq": after, "data": {}})
            feed.wake(ephemeral_body(after, "message_delta", envelope))
        else:
            full = arg
        await _until(settled)
    shutdown.set()
    feed._announce(push=False)
    await asyncio.wait_for(reader, 5)
    return b"".join(sent[start:])


@settings(max_examples=60, deadline=None)
@given(STEPS)
def test_a_parked_stream_gets_the_bytes_its_own_loop_sends(steps: list[tuple[str, Any]]) -> None:
    """The feed's direct writes and the stream's loop deliver by one rule: whatever comes, in
    whatever order, the client gets the same bytes either way."""
    through_the_loop = asyncio.run(_live_bytes(steps, direct=False))
    direct = asyncio.run(_live_bytes(steps, direct=True))
    # Keep-alive pings aside: a stream pings when woken with nothing to send, and a parked
    # stream is woken less.
    assert direct.replace(PING, b"") == through_the_loop.replace(PING, b"")
    ids = [int(line[4:]) for line in through_the_loop.split(b"\n") if line.startswith(b"id: ")]
    assert ids == list(range(1, len(ids) + 1))


# --- a real server ---------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[True, False], ids=["shortcuts", "no-shortcuts"])
def server(request: pytest.FixtureRequest, database_url: str) -> Iterator[ServerProcess]:
    """A server with FERRYMAN_STREAM_SHORTCUTS on, as shipped, and one with it off."""
    env = {"FERRYMAN_STREAM_SHORTCUTS": str(request.param).lower()}
    with running(ServerProcess(database_url, env=env)) as proc:
        yield proc


async def test_streams_on_uvicorn_take_the_direct_path_unless_told_not_to(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    """Events committed while an owner stream follows arrive once, in order, whole; and the
    server wrote them directly with the shortcuts on, never with them off (its metric says
    so: a direct path that silently never ran, or ran when told not to, would pass the
    rest)."""
    owner, key = owner_key
    stages = [f"stage {n}" for n in range(30)]
    async with (
        client(server.url, key) as http,
        sse(http, "/api/agent/owner-events") as events,
        await psycopg.AsyncConnection.connect(
            database_url, autocommit=True, row_factory=dict_row
        ) as conn,
    ):
        caught_up = await anext(events)
        assert caught_up.event == "caught_up"
        for stage in stages:
            await append_owner_event(conn, owner, uuid.uuid4(), STAGE, {"stage": stage})
            await asyncio.sleep(0.005)
        got = [await asyncio.wait_for(anext(events), 10) for _ in stages]
        metrics = (await http.get("/metrics")).text
    assert [json.loads(e.data)["data"]["stage"] for e in got] == stages
    first = int(got[0].id)
    assert [int(e.id) for e in got] == list(range(first, first + len(stages)))
    written = [line for line in metrics.splitlines() if line.startswith(DIRECT_METRIC)]
    assert written, metrics[-3000:]
    direct = float(written[0].split()[-1])
    if server.env["FERRYMAN_STREAM_SHORTCUTS"] == "true":
        assert direct >= 1, metrics[-3000:]
    else:
        assert direct == 0, metrics[-3000:]
