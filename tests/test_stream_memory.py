"""What a stream may hold in memory, whatever its client does: writes of at most
FERRYMAN_STREAM_WRITE_BYTES (or one event), UTF-8 frames, feed buffers sized in bytes, byte-bounded
reads of the log, and a client that never reads and then leaves costs the server nothing that
stays. Pure pieces first, then a real server under uvicorn."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
import uuid
from collections.abc import AsyncGenerator, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.rows import dict_row
from starlette.types import Message

from app.api.streams import EventStreamResponse
from app.bus import Bus
from app.db.pool import Database
from app.store.events import append_owner_event, append_session_event, read_owner_pages
from app.store.notify import STREAMS_CHANNEL, ephemeral_body, json_string, owner_key
from app.store.sessions import NewSession, create_session
from app.streams.feed import Feed, FeedHub, FeedSource, Follower, Page, Tail
from app.streams.frames import Event, ephemeral_frame, owner_event, writes
from tests.support import ServerProcess, create_owner_key, running

WRITE_BYTES = 1024  # the smallest the settings allow, so that small events fill writes
EMOJI = "\U0001f600"

# --- writes ---------------------------------------------------------------------------------


@given(st.lists(st.binary(min_size=1, max_size=300), max_size=40), st.integers(1, 700))
def test_writes_are_bounded_or_one_frame(frames: list[bytes], limit: int) -> None:
    out = list(writes(frames, limit))
    assert b"".join(out) == b"".join(frames)
    # Each write is a run of whole frames: at most `limit` bytes, or a single frame.
    rest = list(frames)
    for write in out:
        taken: list[bytes] = []
        while b"".join(taken) != write:
            taken.append(rest.pop(0))
        assert len(write) <= limit or len(taken) == 1
        # No write is cut short: the next frame would not have fitted.
        if rest:
            assert len(write) + len(rest[0]) > limit


def test_writes_take_frames_one_at_a_time() -> None:
    taken: list[int] = []

    def frames() -> Iterator[bytes]:
        for n in range(100):
            taken.append(n)
            yield b"x" * 100

    first = next(writes(frames(), 250))
    assert first == b"x" * 200
    assert len(taken) == 3  # the two in the write, and the one that did not fit


# --- frames ---------------------------------------------------------------------------------


def _owner_event(id_: int, data: dict[str, Any]) -> Event:
    row = {
        "owner_id": "o",
        "id": id_,
        "session_id": uuid.UUID(int=1),
        "type": "session_title",
        "data": data,
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
    }
    return owner_event(row)


def test_frames_carry_utf8_not_escapes() -> None:
    text = EMOJI * 10_000
    frame = _owner_event(1, {"title": text}).frame("live")
    assert b"\\u" not in frame
    assert text.encode() in frame
    assert len(frame) < 4 * 10_000 + 400  # 4 bytes an emoji (escaped, it was 12)
    body = frame.decode().split("data: ", 1)[1]
    assert json.loads(body)["data"]["title"] == text


def test_an_ephemeral_lone_surrogate_stays_an_escape() -> None:
    """A model's text may hold a lone surrogate, which UTF-8 (and so a NOTIFY payload) cannot
    carry: it goes out as a JSON escape, the rest as UTF-8, and the frame still decodes to the
    same text."""
    text = "a\ud800b" + EMOJI
    envelope = f'{{"type":"message_delta","data":{{"text":{json_string(text)}}}}}'
    envelope.encode()  # fits a NOTIFY payload
    frame = ephemeral_frame(ephemeral_body(0, "message_delta", envelope)).frame
    assert b"\\ud800" in frame and EMOJI.encode() in frame
    body = frame.decode().split("data: ", 1)[1]
    assert json.loads(body)["data"]["text"] == "a\ud800b" + EMOJI


# --- feed buffers ---------------------------------------------------------------------------


def test_tail_evicts_by_bytes_but_keeps_the_newest() -> None:
    tail: Tail[str] = Tail(1000)

    def held() -> list[int]:
        return [n for n, _, _ in tail.items]

    for n in range(1, 5):
        tail.append(n, f"item {n}", 300)
    assert held() == [2, 3, 4] and tail.bytes == 900
    assert tail.reaches(1) and not tail.reaches(0)
    assert tail.after(2, 10_000) == (["item 3", "item 4"], 4)
    assert tail.after(0, 10_000) == (["item 2", "item 3", "item 4"], 4)  # from the oldest held
    assert tail.after(0, 500) == (["item 2"], 2)
    assert tail.after(4, 10_000) == ([], 4)
    tail.append(5, "item 5", 5000)  # bigger than the whole budget: kept alone
    assert held() == [5] and tail.bytes == 5000
    tail.append(6, "item 6", 10)
    assert held() == [6] and tail.bytes == 10


@given(
    st.lists(st.integers(1, 500), min_size=1, max_size=60),
    st.integers(0, 60),
    st.integers(1, 800),
)
def test_tail_after_takes_a_bounded_run(sizes: list[int], cursor: int, limit: int) -> None:
    tail: Tail[int] = Tail(2000)
    for n, size in enumerate(sizes, start=1):
        tail.append(n, n, size)
    got, last = tail.after(cursor, limit)
    held = {n: size for n, _, size in tail.items}
    expected_first = max(cursor + 1, min(held))
    if expected_first > len(sizes):
        assert (got, last) == ([], cursor)
        return
    assert got == list(range(expected_first, expected_first + len(got)))
    assert last == got[-1]
    assert sum(held[n] for n in got) <= limit or len(got) == 1
    if last < len(sizes):  # stopped by the bound, not by the end
        assert sum(held[n] for n in got) + held[last + 1] > limit


async def _no_head() -> tuple[int, bool]:
    raise AssertionError("not read")


async def _no_read(after: int, max_bytes: int) -> Page:
    raise AssertionError("not read")


async def test_feed_park_wakes_every_stream_once_and_skips_a_cancelled_one() -> None:
    """Streams without a direct write (another server, or the stream shortcuts off) park all
    the same, and every change wakes them."""
    feed = Feed(FeedSource("test", _no_head, _no_read), buffer_bytes=65_536, write_bytes=1024)
    seen = feed.generation
    followers = [Follower(None, 0, 0, 0) for _ in range(3)]
    parked = [asyncio.create_task(feed.park(follower, seen)) for follower in followers]
    await asyncio.sleep(0)
    parked[0].cancel()  # a stream that left while parked
    await asyncio.sleep(0)
    feed._announce()
    await asyncio.wait_for(asyncio.gather(*parked[1:]), 1)
    assert parked[0].cancelled() and not feed.followers
    # A change between the check and the park is not missed: it returns at once.
    await asyncio.wait_for(feed.park(followers[1], seen), 1)


def test_tail_after_takes_the_newest_one_alone_or_the_run_from_older() -> None:
    tail: Tail[str] = Tail(100)
    for n, item in enumerate(["a", "b", "c"], start=1):
        tail.append(n, item, 10)
    assert tail.after(2, 5) == (["c"], 3)
    assert tail.after(0, 25) == (["a", "b"], 2)
    assert tail.after(3, 100) == ([], 3)


async def test_feed_hands_out_a_write_at_a_time_and_evicts_by_bytes() -> None:
    source = FeedSource("test", _no_head, _no_read)
    feed = Feed(source, buffer_bytes=65_536, write_bytes=WRITE_BYTES)
    events = [_owner_event(n, {"title": "x" * 300 * n}) for n in range(1, 31)]
    for event in events:
        feed.buffer.append(event.id, event, event.size)
        feed.head = event.id
    assert feed.buffer.bytes <= 65_536
    oldest = feed.buffer.items[0][0]
    assert oldest > 1, "the buffer was sized in bytes, not events"
    assert feed.since(oldest - 2) is None  # no longer reaches back: the stream reads the log
    got = feed.since(oldest - 1)
    assert got and got[0].id == oldest
    assert sum(e.size for e in got) <= WRITE_BYTES or len(got) == 1
    assert feed.since(30) == []
    # Ephemeral frames too: a stream takes a write's worth, the feed keeps about that much.
    for n in range(50):
        envelope = json.dumps({"type": "message_delta", "data": {"text": str(n) * 40}})
        feed.wake(ephemeral_body(0, "message_delta", envelope))
    deltas, seen = feed.ephemeral_since(0)
    assert sum(d.size for d in deltas) <= WRITE_BYTES
    assert feed.ephemeral.bytes <= WRITE_BYTES and seen == 50
    feed.close()
    assert feed.buffer.bytes == 0 and feed.ephemeral.bytes == 0


async def _empty_head() -> tuple[int, bool]:
    return 0, False


async def _empty_read(after: int, max_bytes: int) -> Page:
    return Page([], False)


@pytest.mark.parametrize("shortcuts", [True, False])
async def test_the_heap_is_trimmed_after_feeds_go_only_with_the_shortcuts(shortcuts: bool) -> None:
    hub = FeedHub(Bus("postgresql://unused.invalid/none", [STREAMS_CHANNEL]), shortcuts=shortcuts)
    async with hub.attach(FeedSource(owner_key("trim"), _empty_head, _empty_read)):
        pass
    assert not hub.feeds
    # The trim is due a second after the last feed went (on glibc, which the tests run on).
    assert (hub._trim is not None) == shortcuts
    if hub._trim is not None:
        hub._trim.cancel()


# --- the response ---------------------------------------------------------------------------


async def test_a_response_builds_no_chunk_after_its_client_left() -> None:
    """A stream blocked on a client that never reads, which then leaves, builds no further
    chunk. The fake server does what uvicorn does: a send waits while the client's window is
    shut; a disconnect wakes the disconnect listener, then the waiting send, which returns
    without an error, as does every later send."""
    built = 0
    closed = released = False

    async def body() -> AsyncGenerator[bytes, None]:
        nonlocal built, closed
        try:
            for _ in range(100):
                built += 1
                yield b"data: x\n\n"
        finally:
            closed = True

    disconnected, writable, blocked = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def receive() -> Message:
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body" and not disconnected.is_set():
            blocked.set()
            await writable.wait()

    def release() -> None:
        nonlocal released
        released = True

    response = EventStreamResponse(body(), release)
    scope = {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "GET"}
    async with asyncio.timeout(5), asyncio.TaskGroup() as group:
        group.create_task(response(scope, receive, send))
        await blocked.wait()
        disconnected.set()  # the client leaves: uvicorn wakes the listener first, then the send
        writable.set()
    assert built == 1
    assert closed and released


# --- byte-bounded reads of the owner log ----------------------------------------------------


async def test_owner_pages_stop_at_the_byte_bound(db: Database, owner_key: tuple[str, str]) -> None:
    owner, _ = owner_key
    sizes = [10, 3000, 10, 10, 5000, 10, 10]
    async with db.connection() as conn:

        async def read(after: int, limit: int, max_bytes: int) -> list[dict[str, Any]]:
            want = (owner, after, max_bytes)
            return (await read_owner_pages(conn, [want], limit))[want][0]

        for size in sizes:
            await append_owner_event(conn, owner, uuid.uuid4(), "session_title", {"t": "x" * size})
        pages: list[list[int]] = []
        after = 0
        while rows := await read(after, 500, 2000):
            pages.append([r["id"] for r in rows])
            assert all(r["size"] == len(json.dumps(r["data"])) for r in rows)
            after = rows[-1]["id"]
        # The event that crosses the bound ends its page; a big one is a page of its own.
        assert pages == [[1, 2], [3, 4, 5], [6, 7]]
        # Several cursors of one owner in one read: each page as if read alone.
        wants = [(owner, after, 2000) for after in (0, 2, 5, 7)]
        together = await read_owner_pages(conn, wants, 500)
        assert [[r["id"] for r in together[want][0]] for want in wants] == [*pages, []]
        assert [r["id"] for r in await read(0, 1, 10**9)] == [1]
        # Retention prunes from the oldest: a page after the pruned ones starts past the gap,
        # where a reader at the old cursor sees it (and is told to resync).
        await conn.execute("DELETE FROM owner_events WHERE owner_id = %s AND id < 4", (owner,))
        first, *_ = await read(0, 500, 10**9)
        assert first["id"] == 4


# --- a real server --------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[True, False], ids=["shortcuts", "no-shortcuts"])
def small_writes(request: pytest.FixtureRequest, isolated_db: str) -> Iterator[ServerProcess]:
    """A server with small writes, with FERRYMAN_STREAM_SHORTCUTS on (as shipped) and off."""
    env = {
        "FERRYMAN_STREAM_WRITE_BYTES": str(WRITE_BYTES),
        "FERRYMAN_FEED_BUFFER_BYTES": "65536",
        "FERRYMAN_STREAM_SHORTCUTS": str(request.param).lower(),
    }
    with running(ServerProcess(isolated_db, env=env)) as proc:
        yield proc


class RawStream:
    """An SSE response on a raw socket, read one HTTP chunk (one server write) at a time."""

    def __init__(self, port: int, path: str, key: str, *, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket()
        if rcvbuf is not None:  # before connecting, so the window is small from the start
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(15)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        self.buffer = b""

    def head(self) -> bytes:
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"transfer-encoding: chunked" in head.lower(), head
        return head

    def write(self) -> bytes | None:
        """The next write's bytes; None at the end of the response."""
        while b"\r\n" not in self.buffer:
            self._fill()
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        size = int(line, 16)
        while len(self.buffer) < size + 2:
            self._fill()
        payload, self.buffer = self.buffer[:size], self.buffer[size + 2 :]
        return payload if size else None

    def _fill(self) -> None:
        data = self.sock.recv(1 << 16)
        assert data, "the server closed the connection"
        self.buffer += data

    def close(self) -> None:
        self.sock.close()


def frame_ids(write: bytes) -> list[int]:
    return [int(f.split(b"\n", 1)[0][4:]) for f in write.split(b"\n\n") if f.startswith(b"id: ")]


def read_writes_until(stream: RawStream, done: bytes) -> list[bytes]:
    """Writes up to and including the one that holds `done`; each within the bound."""
    got: list[bytes] = []
    while not got or done not in got[-1]:
        write = stream.write()
        assert write is not None, "the stream ended first"
        frames = write.count(b"\n\n")
        assert len(write) <= WRITE_BYTES or frames == 1, (len(write), frames)
        got.append(write)
    return got


async def _connect(url: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row)


async def new_session_with(url: str, owner: str, texts: list[str]) -> uuid.UUID:
    """A session whose log is its opening message, then a message of each of `texts`."""
    async with await _connect(url) as conn:
        new = NewSession(
            prompt="hi", title="t", model="scripted", script=None, tools=None, metadata={}
        )
        row, _ = await create_session(conn, owner, new, None)
        await append_messages(conn, row["id"], texts)
    session_id: uuid.UUID = row["id"]
    return session_id


async def append_messages(
    conn: psycopg.AsyncConnection[Any], session_id: uuid.UUID, texts: list[str]
) -> None:
    async with conn.transaction():  # one commit: they reach a live stream together
        for text in texts:
            data = {"text": text, "delivery": "queued"}
            await append_session_event(conn, session_id, "user_message", data)


def mixed_text(rng: random.Random) -> str:
    """Half small enough to share a write, half each a write of its own."""
    return EMOJI * (rng.randint(1, 40) if rng.random() < 0.5 else rng.randint(300, 700))


async def test_every_write_is_bounded_in_backlog_and_live(
    small_writes: ServerProcess, isolated_db: str
) -> None:
    rng = random.Random(9)
    owner, key = create_owner_key(isolated_db)
    texts = [mixed_text(rng) for _ in range(60)]
    sid = await new_session_with(isolated_db, owner, texts)
    stream = RawStream(small_writes.port, f"/api/agent/{sid}/events", key)
    try:
        stream.head()
        backlog = read_writes_until(stream, b"event: caught_up")
        assert [i for w in backlog for i in frame_ids(w)] == list(range(1, 62))
        assert any(w.count(b"\n\n") > 1 for w in backlog), "small events share writes"
        assert b"\\u" not in b"".join(backlog)
        async with await _connect(isolated_db) as conn:
            await append_messages(conn, sid, [mixed_text(rng) for _ in range(40)])
        live = read_writes_until(stream, b"id: 101\n")
        assert [i for w in live for i in frame_ids(w)] == list(range(62, 102))
        assert any(w.count(b"\n\n") > 1 for w in live), "events that arrive together share writes"
    finally:
        stream.close()


def vm(pid: int, field: str) -> int:
    """A kB field of /proc/<pid>/status, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


def reset_peak(pid: int) -> None:
    """VmHWM starts again from the current RSS (Linux 4.0+)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def streams_open(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith("ferryman_sse_streams_open{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout}s"
        time.sleep(0.05)


async def test_a_client_that_never_reads_then_leaves_costs_nothing_that_stays(
    small_writes: ServerProcess, isolated_db: str
) -> None:
    """40 messages of 100,000 emoji (16 MB of log) replayed to a socket that never reads: the
    server holds a write or two of it, not the log, and gives it back once the client leaves."""
    owner, key = create_owner_key(isolated_db)
    sid = await new_session_with(isolated_db, owner, [EMOJI * 100_000] * 40)
    pid, port = small_writes.pid, small_writes.port
    small = await new_session_with(isolated_db, owner, ["warm-up"])  # first-use allocations
    warm = RawStream(port, f"/api/agent/{small}/events?follow=false", key)
    warm.head()
    while warm.write() is not None:
        pass
    warm.close()
    wait_until(lambda: streams_open(port) == 0, 10, "the warm-up stream's end")
    start = vm(pid, "VmRSS")
    reset_peak(pid)
    hostile = RawStream(port, f"/api/agent/{sid}/events", key, rcvbuf=2048)

    def sent_a_big_event() -> bool:
        return b"id: 2\n" in hostile.sock.recv(4096, socket.MSG_PEEK)

    wait_until(sent_a_big_event, 15, "the first big event")
    hostile.close()
    wait_until(lambda: streams_open(port) == 0, 10, "the server noticing the disconnect")
    peak = vm(pid, "VmHWM") - start
    assert peak < 48 * 2**20, f"the stream cost {peak / 2**20:.0f} MB"
    wait_until(lambda: vm(pid, "VmRSS") - start < 24 * 2**20, 10, "the memory going back")
