"""Streams parked on their feed (`Feed.park`): the feed writes what comes next straight to each
connection, in the order and with the bytes the stream's own loop would send, and wakes the
stream for everything a direct write cannot do. Pure (a list stands for the connection), then
a real server under uvicorn, whose streams take the direct path."""

from __future__ import annotations

import asyncio
import json
import uuid

import psycopg
from psycopg.rows import dict_row

from app.domain import OwnerEventType
from app.store.events import append_owner_event
from app.store.notify import ephemeral_body
from app.streams.feed import Feed, FeedSource, Follower, Page
from app.streams.frames import Event
from tests.support import ServerProcess, client, sse

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
    # A connection that takes no more: nothing written, the stream wakes to wait for it.
    follower, task = await _parked(feed, connection)
    connection.full = True
    _publish(feed, _event(1))
    await asyncio.wait_for(task, 1)
    assert connection.chunks == [] and follower.cursor == 0
    # More than a write's worth: the stream's loop splits it.
    connection.full = False
    follower, task = await _parked(feed, connection)
    _publish(feed, *[Event.of(n, "tool_result", {"pad": "x" * 600}) for n in (2, 3)])
    await asyncio.wait_for(task, 1)
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


# --- a real server ---------------------------------------------------------------------------


async def test_streams_on_uvicorn_take_the_direct_path(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    """Events committed while an owner stream follows arrive once, in order, whole; and the
    server wrote them directly (its metric says so: a direct path that silently never ran
    would pass the rest)."""
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
    assert written and float(written[0].split()[-1]) >= 1, metrics[-3000:]
