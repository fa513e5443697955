"""The SSE streams of SPEC section 4, end to end against real servers and a real PostgreSQL:
gap-free cursors under concurrent writers, snapshot-then-stream, resume, resync, the wire
format, delivery across processes, deletion and graceful shutdown; each with the stream
shortcuts (app/streams/shortcuts.py) on and off.

Streams are read with a small raw parser (not tests.support.sse) so that a test can tell a
frame that carries `id:` (durable) from one that does not (control), which a spec-following
EventSource decoder hides: it reports the last seen id on every later frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import re
import signal
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import DictRow, dict_row

from app.bus import Bus
from app.db.pool import Database
from app.store import retention
from app.store.events import append_owner_event
from app.store.notify import (
    STREAMS_CHANNEL,
    ephemeral_body,
    ephemeral_payloads,
    notify,
    session_key,
)
from app.store.notify import owner_key as owner_feed_key
from app.streams.feed import FeedHub, FeedSource, Page
from app.streams.frames import Event, owner_event
from app.streams.sse import StreamOptions, event_stream
from tests.support import (
    PROBLEM,
    ServerProcess,
    client,
    create_owner_key,
    create_session,
    running,
)

OWNER_EVENTS = "/api/agent/owner-events"
ENVELOPE = {"id", "type", "sessionId", "ownerId", "ts", "phase", "data"}
SESSION_ENVELOPE = ENVELOPE | {"seq", "attempt"}
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?(Z|\+00:00)$")
STAGE = "session_active_stage"  # the owner-event type the direct writers append

# --- a raw SSE reader -----------------------------------------------------------------------


@dataclass
class Frame:
    raw: str
    id: str | None = None
    event: str | None = None
    data: str | None = None
    retry: int | None = None
    comments: list[str] = field(default_factory=list)

    @property
    def json(self) -> Any:
        assert self.data is not None, self.raw
        return json.loads(self.data)

    @property
    def durable(self) -> bool:
        return self.id is not None


def parse_block(block: str) -> Frame:
    frame = Frame(raw=block)
    for line in block.split("\n"):
        if line.startswith(":"):
            frame.comments.append(line[1:].strip())
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            assert frame.id is None, f"two id lines: {block!r}"
            frame.id = value
        elif name == "event":
            frame.event = value
        elif name == "data":
            assert frame.data is None, f"more than one data line: {block!r}"
            frame.data = value
        elif name == "retry":
            frame.retry = int(value)
        else:
            raise AssertionError(f"unexpected SSE line {line!r} in {block!r}")
    return frame


class Stream:
    """Frames of one open response, pumped into a queue so reads can time out safely."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.frames: list[Frame] = []  # everything received, pings included
        self.ended = False
        self._queue: asyncio.Queue[Frame | BaseException | None] = asyncio.Queue()
        self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        buffer = ""
        try:
            async for chunk in self.response.aiter_text():
                buffer += chunk
                while "\n\n" in buffer:
                    block, buffer = buffer.split("\n\n", 1)
                    frame = parse_block(block)
                    self.frames.append(frame)
                    self._queue.put_nowait(frame)
            if buffer:
                raise AssertionError(f"stream ended inside a frame: {buffer!r}")
            self._queue.put_nowait(None)
        except Exception as exc:
            self._queue.put_nowait(exc)

    async def next(self, timeout: float = 10.0, *, raw: bool = False) -> Frame | None:
        """The next frame with data (or any block with raw=True); None at a clean end."""
        deadline = time.monotonic() + timeout
        while True:
            if self.ended:
                return None
            try:
                item = await asyncio.wait_for(self._queue.get(), deadline - time.monotonic())
            except TimeoutError:
                raise AssertionError(f"no frame within {timeout}s") from None
            if item is None:
                self.ended = True
                return None
            if isinstance(item, BaseException):
                self.ended = True
                raise item
            if raw or item.data is not None:
                return item

    async def until(self, done: Callable[[Frame], bool], timeout: float = 15.0) -> list[Frame]:
        """Frames with data up to and including the first one `done` accepts."""
        deadline = time.monotonic() + timeout
        got: list[Frame] = []
        while True:
            frame = await self.next(max(deadline - time.monotonic(), 0.01))
            if frame is None:
                raise AssertionError(f"stream ended before the awaited frame; got {got}")
            got.append(frame)
            if done(frame):
                return got

    async def durable(self, n: int, timeout: float = 15.0) -> list[Frame]:
        """The next `n` durable frames (control frames are skipped)."""
        got: list[Frame] = []
        deadline = time.monotonic() + timeout
        while len(got) < n:
            frame = await self.next(max(deadline - time.monotonic(), 0.01))
            assert frame is not None, f"stream ended after {len(got)} of {n} durable frames"
            if frame.durable:
                got.append(frame)
        return got

    async def end(self, timeout: float = 5.0) -> list[Frame]:
        """The frames left until the server closes the stream (which it must, in time)."""
        rest: list[Frame] = []
        deadline = time.monotonic() + timeout
        while True:
            frame = await self.next(max(deadline - time.monotonic(), 0.01))
            if frame is None:
                return rest
            rest.append(frame)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@contextlib.asynccontextmanager
async def open_stream(
    http: httpx.AsyncClient, path: str, *, last_event_id: str | None = None, **params: Any
) -> AsyncIterator[Stream]:
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
    async with http.stream("GET", path, headers=headers, params=params) as response:
        if response.status_code != 200:
            body = await response.aread()
            raise AssertionError(f"GET {path} answered {response.status_code}: {body[:500]!r}")
        stream = Stream(response)
        try:
            yield stream
        finally:
            await stream.close()


def durable_ids(frames: list[Frame]) -> list[int]:
    return [int(f.id) for f in frames if f.id is not None]


def assert_gap_free(seen: list[int], first: int, last: int) -> None:
    """`seen` is exactly first..last: in order, nothing missing, nothing repeated."""
    if seen != list(range(first, last + 1)):
        dupes = sorted(k for k, v in Counter(seen).items() if v > 1)
        missing = sorted(set(range(first, last + 1)) - set(seen))
        disorder = [(a, b) for a, b in itertools.pairwise(seen) if b <= a][:5]
        raise AssertionError(
            f"expected ids {first}..{last} once each in order; got {len(seen)} ids, "
            f"duplicates {dupes[:10]}, missing {missing[:10]}, out of order {disorder}"
        )


def assert_phases(frames: list[Frame]) -> Frame:
    """Durable frames are `backlog` before the one caught_up and `live` after it; caught_up's
    payload accounts for the backlog. Returns the caught_up frame."""
    caught = [i for i, f in enumerate(frames) if f.event == "caught_up"]
    assert len(caught) == 1, [f.event for f in frames]
    at = caught[0]
    backlog = [f for f in frames[:at] if f.durable]
    live = [f for f in frames[at + 1 :] if f.durable]
    assert all(f.json["phase"] == "backlog" for f in backlog)
    assert all(f.json["phase"] == "live" for f in live)
    payload = frames[at].json
    assert payload["replayed"] == len(backlog)
    if backlog:
        assert payload["cursor"] == backlog[-1].id
        assert int(payload["fromEventId"]) == int(backlog[0].id) - 1
    else:
        assert payload["cursor"] == payload["fromEventId"]
    return frames[at]


# --- database helpers -----------------------------------------------------------------------


async def connect(database_url: str) -> psycopg.AsyncConnection[DictRow]:
    return await psycopg.AsyncConnection.connect(
        database_url, autocommit=True, row_factory=dict_row
    )


async def append_stage(database_url: str, owner: str, stage: str) -> int:
    """One owner event written straight through the store, in its own transaction."""
    async with await connect(database_url) as conn, conn.transaction():
        return await append_owner_event(conn, owner, uuid.uuid4(), STAGE, {"stage": stage})


async def bulk_owner_events(database_url: str, owner: str, count: int) -> int:
    """`count` owner events in one transaction (cheaply, by SQL); returns the last id."""
    async with await connect(database_url) as conn, conn.transaction():
        row = await (
            await conn.execute(
                """
                INSERT INTO owner_cursors (owner_id, last_id) VALUES (%(o)s, %(n)s)
                ON CONFLICT (owner_id) DO UPDATE SET last_id = owner_cursors.last_id + %(n)s
                RETURNING last_id
                """,
                {"o": owner, "n": count},
            )
        ).fetchone()
        assert row is not None
        last = int(row["last_id"])
        await conn.execute(
            """
            INSERT INTO owner_events (owner_id, id, session_id, type, data)
            SELECT %(o)s, g, gen_random_uuid(), %(t)s, jsonb_build_object('stage', 'bulk-' || g)
            FROM generate_series(%(first)s::bigint, %(last)s::bigint) g
            """,
            {"o": owner, "t": STAGE, "first": last - count + 1, "last": last},
        )
        await notify(conn, owner_feed_key(owner))
    return last


async def owner_last_id(database_url: str, owner: str) -> int:
    async with await connect(database_url) as conn:
        row = await (
            await conn.execute("SELECT last_id FROM owner_cursors WHERE owner_id = %s", (owner,))
        ).fetchone()
    return int(row["last_id"]) if row else 0


async def post_message(http: httpx.AsyncClient, session_id: str, text: str) -> int:
    response = await http.post(f"/api/agent/{session_id}/messages", json={"text": text})
    assert response.status_code == 202, response.text
    return int(response.json()["message"]["seq"])


async def rename(http: httpx.AsyncClient, session_id: str, title: str) -> None:
    response = await http.patch(f"/api/agent/{session_id}", json={"title": title})
    assert response.status_code == 200, response.text


@pytest.fixture(autouse=True)
def _retire_sessions(owner_key: tuple[str, str], database_url: str) -> Iterator[None]:
    """These tests leave hundreds of queued sessions behind; take them out of the claim queue
    (soft-delete them) so that tests which run a worker later need not work through them."""
    yield
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE sessions SET deleted_at = clock_timestamp()"
            " WHERE owner_id = %s AND deleted_at IS NULL",
            (owner_key[0],),
        )


@pytest.fixture(scope="module", params=[True, False], ids=["shortcuts", "no-shortcuts"])
def shortcuts(request: pytest.FixtureRequest) -> dict[str, str]:
    """Every server of this module runs with FERRYMAN_STREAM_SHORTCUTS on (as shipped: direct
    writes to uvicorn's transport, malloc_trim), then off, and each guarantee is checked both
    ways."""
    return {"FERRYMAN_STREAM_SHORTCUTS": str(request.param).lower()}


@pytest.fixture(scope="module")
def server(database_url: str, shortcuts: dict[str, str]) -> Iterator[ServerProcess]:
    with running(ServerProcess(database_url, env=shortcuts)) as proc:
        yield proc


@pytest.fixture(scope="module")
def other_server(database_url: str, shortcuts: dict[str, str]) -> Iterator[ServerProcess]:
    """A second API process on the same database. Its fallback poll is 30 s and its pings come
    every 0.5 s: anything it delivers within a second came through LISTEN/NOTIFY."""
    env = {"FERRYMAN_POLL_INTERVAL": "30", "FERRYMAN_PING_INTERVAL": "0.5", **shortcuts}
    with running(ServerProcess(database_url, env=env)) as proc:
        yield proc


# --- 1. gap-free owner cursors under concurrent writers ---------------------------------------


async def test_owner_cursor_gap_free_under_concurrent_writers(
    server: ServerProcess,
    other_server: ServerProcess,
    owner_key: tuple[str, str],
    database_url: str,
) -> None:
    """8 writers on their own connections (HTTP through two API processes, and direct store
    appends), one owner; readers see ids 1..N once each, in order, whoever wrote them."""
    owner, key = owner_key
    per_writer = 20
    created: list[str] = []
    renames = 0
    stages: list[str] = []

    async def http_writer(http: httpx.AsyncClient, w: int) -> None:
        nonlocal renames
        for i in range(per_writer):
            session = await create_session(http, f"writer {w} session {i}")
            created.append(session["id"])
            if i % 2:
                await rename(http, session["id"], f"w{w}-{i}")
                renames += 1

    async def direct_writer(w: int) -> None:
        # Its own connection; transactions of 1-3 appends with pauses inside, so commits of
        # the direct writers and of the API's pooled connections interleave.
        rng = random.Random(w)
        async with await connect(database_url) as conn:
            for i in range(per_writer):
                async with conn.transaction():
                    for j in range(1 + i % 3):
                        stage = f"d{w}-{i}-{j}"
                        await append_owner_event(conn, owner, uuid.uuid4(), STAGE, {"stage": stage})
                        stages.append(stage)
                        await asyncio.sleep(rng.random() * 0.003)

    async def read_to_sentinel(stream: Stream) -> list[Frame]:
        # The sentinel is known by its content: its frame may arrive before the writer of it
        # has its id back.
        frames: list[Frame] = []
        while True:
            frame = await stream.next(20)
            assert frame is not None, "stream ended"
            frames.append(frame)
            if frame.durable and frame.json["data"] == {"stage": "sentinel"}:
                return frames

    async with (
        client(server.url, key) as http,
        client(other_server.url, key) as other,
        open_stream(http, OWNER_EVENTS, lastEventId="0") as early,
        open_stream(http, OWNER_EVENTS) as live_only,
        asyncio.TaskGroup() as tasks,
    ):
        first = await early.next()
        assert first is not None and first.event == "caught_up"
        assert first.json == {"replayed": 0, "fromEventId": "0", "cursor": "0"}
        assert (await live_only.next()) is not None  # its caught_up
        early_task = tasks.create_task(read_to_sentinel(early))
        live_task = tasks.create_task(read_to_sentinel(live_only))
        writers = [tasks.create_task(http_writer(http if w % 2 else other, w)) for w in range(4)]
        writers += [tasks.create_task(direct_writer(w)) for w in range(4)]
        # A reader that joins half-way from 0 gets a backlog (from the database and from the
        # feed's buffer) and then the live tail, with the writers still busy.
        await asyncio.sleep(0.3)
        async with open_stream(other, OWNER_EVENTS, last_event_id="0") as late:
            late_task = tasks.create_task(read_to_sentinel(late))
            await asyncio.gather(*writers)
            n = await append_stage(database_url, owner, "sentinel")  # the last event
            late_frames = await late_task
        early_frames = await early_task
        live_frames = await live_task

    assert n == await owner_last_id(database_url, owner)
    early_ids = durable_ids(early_frames)
    assert_gap_free(early_ids, 1, n)
    assert_gap_free(durable_ids(late_frames), 1, n)
    assert_phases(late_frames)  # backlog, caught_up, live
    live_ids = durable_ids(live_frames)
    assert_gap_free(live_ids, live_ids[0], n)
    assert all(f.json["phase"] == "live" for f in early_frames if f.durable)

    # Every write was seen exactly once (a worker may add status events of its own).
    events = [f.json for f in early_frames if f.durable]
    seen_created = [e["data"]["session"]["id"] for e in events if e["type"] == "session_created"]
    assert sorted(seen_created) == sorted(created)
    assert sum(e["type"] == "session_title" for e in events) == renames
    seen_stages = [e["data"]["stage"] for e in events if e["type"] == STAGE]
    assert sorted(seen_stages) == sorted([*stages, "sentinel"])
    assert n >= len(created) + renames + len(stages) + 1
    assert all(e["ownerId"] == owner for e in events)


# --- 2. snapshot, then stream from its cursor ------------------------------------------------


async def test_list_snapshot_then_stream_misses_and_repeats_nothing(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    created: list[str] = []
    stop = asyncio.Event()

    async def creator(http: httpx.AsyncClient, w: int) -> None:
        i = 0
        # Bounded, so that the 200-session snapshot holds them all however fast the machine.
        while not stop.is_set() and len(created) < 150:
            session = await create_session(http, f"creator {w} #{i}")
            created.append(session["id"])
            if i % 3 == 0:
                await rename(http, session["id"], f"c{w}-{i}")
            i += 1

    async with client(server.url, key) as http, asyncio.TaskGroup() as tasks:
        for _ in range(3):
            created.append((await create_session(http, "before"))["id"])
        creators = [tasks.create_task(creator(http, w)) for w in range(4)]
        await asyncio.sleep(0.2)
        listing = (await http.get("/api/agent", params={"limit": 200})).json()
        cursor = int(listing["cursor"])
        listed = [s["id"] for s in listing["sessions"]]
        assert cursor > 0 and listed
        async with open_stream(http, OWNER_EVENTS, lastEventId=str(cursor)) as stream:
            await asyncio.sleep(0.3)  # writers keep going while the client streams
            stop.set()
            await asyncio.gather(*creators)
            last = (await create_session(http, "sentinel"))["id"]
            created.append(last)
            frames = await stream.until(
                lambda f: f.event == "session_created" and f.json["data"]["session"]["id"] == last
            )

    assert len(created) < 200, "the snapshot must hold every session for this test"
    assert listing["nextPageToken"] is None
    ids_after = durable_ids(frames)
    assert_gap_free(ids_after, cursor + 1, ids_after[-1])
    caught_up = assert_phases(frames)
    assert caught_up.json["fromEventId"] == str(cursor)
    after = [f.json["data"]["session"]["id"] for f in frames if f.event == "session_created"]
    assert len(after) == len(set(after)), "a session_created event was repeated"
    assert not set(after) & set(listed), "a session in the snapshot was announced again"
    assert len(listed) == len(set(listed))
    assert sorted(listed + after) == sorted(created)
    assert len(after) > 3, "the creators should have been busy after the snapshot"


# --- 3. resuming with Last-Event-ID / ?lastEventId= -----------------------------------------


async def test_owner_stream_resume(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    owner, key = owner_key
    stop = asyncio.Event()

    async def http_writer(http: httpx.AsyncClient) -> None:
        while not stop.is_set():
            session = await create_session(http, "resume")
            await rename(http, session["id"], "renamed")

    async def direct_writer(w: int) -> None:
        i = 0
        while not stop.is_set():
            await append_stage(database_url, owner, f"r{w}-{i}")
            i += 1
            await asyncio.sleep(0.005)

    async with client(server.url, key) as http:
        await create_session(http, "first")  # so that cursor 0 has something behind it
        async with asyncio.TaskGroup() as tasks:
            writers = [tasks.create_task(http_writer(http)) for _ in range(2)]
            writers += [tasks.create_task(direct_writer(w)) for w in range(2)]

            async def last_id() -> int:
                stop.set()
                await asyncio.gather(*writers)
                return await append_stage(database_url, owner, "sentinel")

            # From 0 (with no cursor the owner stream would start live), then resume 6 times.
            seen: list[int] = []
            async with open_stream(http, OWNER_EVENTS, last_event_id="0") as stream:
                seen += durable_ids(await stream.durable(5))
            seen += await _resume_tail(http, OWNER_EVENTS, seen, last_id)
    assert_gap_free(seen, 1, await owner_last_id(database_url, owner))


async def _resume_tail(
    http: httpx.AsyncClient,
    path: str,
    seen: list[int],
    last_id: Callable[[], Awaitable[int]],
) -> list[int]:
    more: list[int] = []
    rng = random.Random(11)
    for mode in ["header", "query", "both", "header", "query", "both"]:
        cursor = str((seen + more)[-1])
        kwargs: dict[str, Any] = {}
        if mode in ("header", "both"):
            kwargs["last_event_id"] = cursor
        if mode == "query":
            kwargs["lastEventId"] = cursor
        if mode == "both":  # the header wins; a query of 0 would replay everything again
            kwargs["lastEventId"] = "0"
        async with open_stream(http, path, **kwargs) as stream:
            frames = await stream.durable(rng.randint(3, 12))
        got = durable_ids(frames)
        assert got[0] == int(cursor) + 1, (mode, cursor, got[:3])
        more += got
    target = await last_id()
    async with open_stream(http, path, last_event_id=str(more[-1])) as stream:
        frames = await stream.until(lambda f: f.durable and int(f.id or 0) >= target)
    more += durable_ids(frames)
    return more


async def test_session_stream_resume(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    _, key = owner_key
    stop = asyncio.Event()
    posted: list[str] = []

    async with client(server.url, key) as http:
        session = await create_session(http, "opening")
        sid = session["id"]
        path = f"/api/agent/{sid}/events"

        async def poster(w: int) -> None:
            i = 0
            while not stop.is_set():
                text = f"p{w}-{i}"
                await post_message(http, sid, text)
                posted.append(text)
                i += 1

        async with asyncio.TaskGroup() as tasks:
            writers = [tasks.create_task(poster(w)) for w in range(4)]

            async def last_id() -> int:
                stop.set()
                await asyncio.gather(*writers)
                posted.append("sentinel")
                return await post_message(http, sid, "sentinel")

            seen: list[int] = []
            # No cursor: the session stream replays from seq 1.
            async with open_stream(http, path) as stream:
                frames = await stream.durable(5)
            seen += durable_ids(frames)
            assert seen[0] == 1
            seen += await _resume_tail(http, path, seen, last_id)
        last_seq = (await http.get(f"/api/agent/{sid}")).json()["lastSeq"]
        # Everything again in one go, to check the texts against what was posted.
        async with open_stream(http, path, follow="false") as stream:
            everything = await stream.end(15)
    assert_gap_free(seen, 1, last_seq)
    assert_gap_free(durable_ids(everything), 1, last_seq)
    texts = [
        f.json["data"]["text"]
        for f in everything
        if f.event == "user_message" and f.json["data"]["text"] != "opening"
    ]
    assert sorted(texts) == sorted(posted)


# --- 4. resync_required ---------------------------------------------------------------------


async def _resync(http: httpx.AsyncClient, path: str, **kwargs: Any) -> dict[str, Any]:
    """Open `path`, expect exactly `resync_required` and then the end of the stream."""
    async with open_stream(http, path, **kwargs) as stream:
        frames = await stream.end(5)
        assert [f.event for f in frames] == ["resync_required"], [f.raw for f in frames]
        assert frames[0].id is None, "a control frame must not carry an id"
        assert any(f.retry == 2000 for f in stream.frames)
    payload: dict[str, Any] = frames[0].json
    assert set(payload) == {"reason", "fromEventId", "currentEventId"}
    return payload


async def test_resync_cursor_ahead(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        # An owner with no events at all.
        assert await _resync(http, OWNER_EVENTS, last_event_id="1") == {
            "reason": "cursor_ahead",
            "fromEventId": "1",
            "currentEventId": "0",
        }
        session = await create_session(http)
        await rename(http, session["id"], "two")
        assert await _resync(http, OWNER_EVENTS, last_event_id="3") == {
            "reason": "cursor_ahead",
            "fromEventId": "3",
            "currentEventId": "2",
        }
        assert await _resync(http, OWNER_EVENTS, lastEventId="9223372036854775807") == {
            "reason": "cursor_ahead",
            "fromEventId": "9223372036854775807",
            "currentEventId": "2",
        }
        # At the head exactly: fine, nothing to replay.
        async with open_stream(http, OWNER_EVENTS, last_event_id="2") as stream:
            frame = await stream.next()
            assert frame is not None and frame.event == "caught_up"
            assert frame.json == {"replayed": 0, "fromEventId": "2", "cursor": "2"}

        path = f"/api/agent/{session['id']}/events"
        assert await _resync(http, path, last_event_id="2") == {
            "reason": "cursor_ahead",
            "fromEventId": "2",
            "currentEventId": "1",
        }
        assert await _resync(http, path, lastEventId="50") == {
            "reason": "cursor_ahead",
            "fromEventId": "50",
            "currentEventId": "1",
        }
        async with open_stream(http, path, last_event_id="1", follow="false") as stream:
            frames = await stream.end()
        assert [f.event for f in frames] == ["caught_up"]
        assert frames[0].json == {"replayed": 0, "fromEventId": "1", "cursor": "1"}


async def test_resync_too_far_behind(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    owner, key = owner_key
    last = await bulk_owner_events(database_url, owner, 1100)
    assert last == 1100
    async with client(server.url, key) as http:
        for cursor in ("0", "1", "99"):
            assert await _resync(http, OWNER_EVENTS, last_event_id=cursor) == {
                "reason": "too_far_behind",
                "fromEventId": cursor,
                "currentEventId": "1100",
            }
        # Exactly the replay limit (1000) behind: replayed in full.
        async with open_stream(http, OWNER_EVENTS, last_event_id="100") as stream:
            frames = await stream.until(lambda f: f.event == "caught_up")
        assert_gap_free(durable_ids(frames), 101, 1100)
        assert frames[-1].json == {"replayed": 1000, "fromEventId": "100", "cursor": "1100"}
        # No cursor: the owner stream starts live from now, however long the history.
        async with open_stream(http, OWNER_EVENTS) as stream:
            caught_up = await stream.next()
            assert caught_up is not None and caught_up.event == "caught_up"
            assert caught_up.json == {"replayed": 0, "fromEventId": "1100", "cursor": "1100"}
            await append_stage(database_url, owner, "after")
            frame = await stream.next(5)
            assert frame is not None and frame.id == "1101"
            assert frame.json["phase"] == "live" and frame.json["data"] == {"stage": "after"}


async def test_resync_expired(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str, db: Database
) -> None:
    owner, key = owner_key
    for i in range(5):
        await append_stage(database_url, owner, f"old-{i}")
    async with await connect(database_url) as conn, conn.transaction():
        # Age this owner's events only, so that pruning leaves other tests' owners alone.
        await conn.execute(
            "UPDATE owner_events SET created_at = created_at - interval '2 days'"
            " WHERE owner_id = %s",
            (owner,),
        )
    await retention.prune(
        db,
        owner_events_older_than=timedelta(days=1),
        deleted_sessions_older_than=timedelta(days=36500),
        idempotency_keys_older_than=timedelta(days=36500),
    )
    async with await connect(database_url) as conn:
        rows = await (
            await conn.execute("SELECT id FROM owner_events WHERE owner_id = %s", (owner,))
        ).fetchall()
    assert [r["id"] for r in rows] == [5], "retention keeps exactly the newest event"
    async with client(server.url, key) as http:
        for cursor in ("0", "2", "3"):
            assert await _resync(http, OWNER_EVENTS, last_event_id=cursor) == {
                "reason": "expired",
                "fromEventId": cursor,
                "currentEventId": "5",
            }
        # Cursor 4 missed nothing that was pruned: event 5 is replayed.
        async with open_stream(http, OWNER_EVENTS, lastEventId="4") as stream:
            frames = await stream.until(lambda f: f.event == "caught_up")
        assert durable_ids(frames) == [5]
        assert frames[-1].json == {"replayed": 1, "fromEventId": "4", "cursor": "5"}


@pytest.mark.parametrize("bad", ["abc", "-1", "1.5", "1.x", "\uff11\uff12", "99999999999999999999"])
async def test_invalid_cursor_is_a_client_error(
    server: ServerProcess, owner_key: tuple[str, str], bad: str
) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        session = await create_session(http)
        # `<seq>.<chunk>` (a token delta's id) is a session stream's cursor, not an owner's.
        paths = (
            [OWNER_EVENTS] if bad == "1.5" else [OWNER_EVENTS, f"/api/agent/{session['id']}/events"]
        )
        for path in paths:
            header = {"Last-Event-ID": bad.encode()}
            for kwargs in ({"params": {"lastEventId": bad}}, {"headers": header}):
                response = await http.get(path, **kwargs)
                assert response.status_code in (400, 422), (path, kwargs, response.text)
                assert response.headers["content-type"].startswith(PROBLEM)


# --- 5. the wire format ---------------------------------------------------------------------


def check_durable(frame: Frame, *, owner: str, phase: str, session: bool) -> dict[str, Any]:
    """One durable frame: `id`, `event`, `data` lines in that order and a full envelope."""
    assert [line.split(":", 1)[0] for line in frame.raw.split("\n")] == ["id", "event", "data"]
    assert frame.id is not None and frame.id.isdigit()
    envelope: dict[str, Any] = frame.json
    assert set(envelope) == (SESSION_ENVELOPE if session else ENVELOPE), envelope
    assert envelope["id"] == frame.id and isinstance(envelope["id"], str)
    assert envelope["type"] == frame.event
    assert str(uuid.UUID(envelope["sessionId"])) == envelope["sessionId"]
    assert envelope["ownerId"] == owner
    assert TS.match(envelope["ts"]), envelope["ts"]
    assert envelope["phase"] == phase
    assert isinstance(envelope["data"], dict)
    if session:
        assert envelope["seq"] == int(frame.id)
        assert isinstance(envelope["attempt"], int) and envelope["attempt"] >= 0
    return envelope


def check_headers(response: httpx.Response) -> None:
    assert response.headers["content-type"].split(";")[0].strip() == "text/event-stream"
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"


async def test_owner_stream_wire_format_and_pings(
    other_server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    owner, key = owner_key
    async with client(other_server.url, key) as http:
        one = await create_session(http, "one")
        await create_session(http, "two")
        await rename(http, one["id"], "first")
        async with open_stream(http, OWNER_EVENTS, last_event_id="0") as stream:
            check_headers(stream.response)
            first = await stream.next(raw=True)
            assert first is not None and first.raw == "retry: 2000" and first.retry == 2000
            frames = await stream.until(lambda f: f.event == "caught_up")
            await rename(http, one["id"], "second")
            frames += await stream.durable(1)
            # Idle: pings every 0.5 s, as comment-only blocks.
            await asyncio.sleep(1.6)
            await rename(http, one["id"], "third")
            frames += await stream.durable(1)
            raw = stream.frames

    assert [f.event for f in frames] == [
        "session_created",
        "session_created",
        "session_title",
        "caught_up",
        "session_title",
        "session_title",
    ]
    caught_up = assert_phases(frames)
    assert caught_up.raw.split("\n")[0] == "event: caught_up", "control frames carry no id"
    assert caught_up.id is None
    assert caught_up.json == {"replayed": 3, "fromEventId": "0", "cursor": "3"}
    envelopes = [
        check_durable(f, owner=owner, phase="backlog" if i < 3 else "live", session=False)
        for i, f in enumerate(f for f in frames if f.durable)
    ]
    assert [e["id"] for e in envelopes] == ["1", "2", "3", "4", "5"]
    assert envelopes[0]["data"]["session"]["id"] == one["id"]
    assert envelopes[0]["data"]["session"]["ownerId"] == owner
    assert envelopes[2]["data"] == {"title": "first"}
    assert envelopes[4]["data"] == {"title": "third"}
    pings = [f for f in raw if f.raw == ": ping"]
    assert len(pings) >= 2, [f.raw for f in raw]
    assert all(f.comments == ["ping"] for f in pings)
    # Every block is one of: the retry line, a ping, a control frame, a durable frame.
    for f in raw:
        assert f.raw in ("retry: 2000", ": ping") or f.event is not None, f.raw


async def test_session_stream_wire_format(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    owner, key = owner_key
    async with client(server.url, key) as http:
        session = await create_session(http, "hello there")
        await post_message(http, session["id"], "second")
        path = f"/api/agent/{session['id']}/events"
        # The browser way: the key as ?access_token=, no Authorization header.
        async with (
            client(server.url) as anonymous,
            open_stream(anonymous, path, access_token=key) as stream,
        ):
            check_headers(stream.response)
            first = await stream.next(raw=True)
            assert first is not None and first.raw == "retry: 2000"
            frames = await stream.until(lambda f: f.event == "caught_up")
            seq = await post_message(http, session["id"], "third")
            assert seq == 3
            frames += await stream.durable(1)

    assert [f.event for f in frames] == [
        "user_message",
        "user_message",
        "caught_up",
        "user_message",
    ]
    caught_up = assert_phases(frames)
    assert caught_up.json == {"replayed": 2, "fromEventId": "0", "cursor": "2"}
    assert caught_up.id is None
    envelopes = [
        check_durable(f, owner=owner, phase="backlog" if i < 2 else "live", session=True)
        for i, f in enumerate(f for f in frames if f.durable)
    ]
    assert [e["seq"] for e in envelopes] == [1, 2, 3]
    assert all(e["sessionId"] == session["id"] for e in envelopes)
    assert envelopes[0]["data"] == {"text": "hello there", "delivery": "queued"}
    assert envelopes[2]["data"]["text"] == "third"


# --- 6. delivery across API processes -------------------------------------------------------


async def test_events_cross_processes_through_notify(
    server: ServerProcess, other_server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    """Written through one process, streamed by the other. `other_server` polls only every
    30 s, so delivery within the bound below proves LISTEN/NOTIFY carried it."""
    _, key = owner_key
    bound = 1.5
    async with client(server.url, key) as a, client(other_server.url, key) as b:
        session = await create_session(a, "cross")
        sid = session["id"]
        async with (
            open_stream(b, OWNER_EVENTS) as owner_on_b,
            open_stream(b, f"/api/agent/{sid}/events", last_event_id="1") as session_on_b,
            open_stream(a, OWNER_EVENTS) as owner_on_a,
        ):
            for stream in (owner_on_b, session_on_b, owner_on_a):
                frame = await stream.next()
                assert frame is not None and frame.event == "caught_up"
            latencies: list[float] = []

            async def delivered(stream: Stream, type_: str, data: dict[str, Any]) -> Frame:
                frames = await stream.until(
                    lambda f: f.durable and f.event == type_ and f.json["data"] == data, 10
                )
                # Nothing was skipped on the way: ids run on from the previous frame.
                return frames[-1]

            for i in range(5):
                started = time.monotonic()
                await rename(a, sid, f"title {i}")
                await delivered(owner_on_b, "session_title", {"title": f"title {i}"})
                latencies.append(time.monotonic() - started)

                started = time.monotonic()
                await post_message(a, sid, f"message {i}")
                await delivered(
                    session_on_b, "user_message", {"text": f"message {i}", "delivery": "queued"}
                )
                latencies.append(time.monotonic() - started)

                # And the other way round: written through b, streamed by a (and by b).
                started = time.monotonic()
                await rename(b, sid, f"back {i}")
                await delivered(owner_on_a, "session_title", {"title": f"back {i}"})
                latencies.append(time.monotonic() - started)
                await delivered(owner_on_b, "session_title", {"title": f"back {i}"})
                await asyncio.sleep(random.random() * 0.2)
            all_frames = [owner_on_a.frames, owner_on_b.frames, session_on_b.frames]
    for frames in all_frames:
        ids_ = durable_ids(frames)
        assert_gap_free(ids_, ids_[0], ids_[-1])
    assert max(latencies) < bound, latencies


async def test_a_lost_notification_is_made_up_by_the_poll(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    """Events committed with no NOTIFY at all (as if it was lost) still reach both streams, in
    order, within the poll interval (2 s on the test servers): one query for all of the
    process's feeds finds the heads that moved and wakes those feeds."""
    owner, key = owner_key
    async with client(server.url, key) as http:
        session = await create_session(http, "unannounced")
        sid = session["id"]
        async with (
            open_stream(http, OWNER_EVENTS) as owner_stream,
            open_stream(http, f"/api/agent/{sid}/events", last_event_id="1") as session_stream,
        ):
            for stream in (owner_stream, session_stream):
                frame = await stream.next()
                assert frame is not None and frame.event == "caught_up"
            async with await connect(database_url) as conn, conn.transaction():
                # The stores' statements notify by themselves: these write as they do, silently.
                await conn.execute(
                    "WITH bumped AS (UPDATE sessions SET last_seq = last_seq + 1 WHERE id = %s"
                    " RETURNING last_seq) INSERT INTO session_events (session_id, seq, attempt,"
                    " type, data) SELECT %s, last_seq, 0, 'user_message',"
                    ' \'{"text": "quiet", "delivery": "queued"}\' FROM bumped',
                    (sid, sid),
                )
                await conn.execute(
                    "WITH cursor AS (INSERT INTO owner_cursors (owner_id, last_id)"
                    " VALUES (%(o)s, 1) ON CONFLICT (owner_id)"
                    " DO UPDATE SET last_id = owner_cursors.last_id + 1"
                    " RETURNING last_id) INSERT INTO owner_events (owner_id, id, session_id, type,"
                    ' data) SELECT %(o)s, last_id, %(s)s, %(t)s, \'{"stage": "quiet"}\''
                    " FROM cursor",
                    {"o": owner, "s": sid, "t": STAGE},
                )
            started = time.monotonic()
            await session_stream.until(lambda f: f.durable and f.event == "user_message", 10)
            await owner_stream.until(
                lambda f: f.durable and f.json["data"] == {"stage": "quiet"}, 10
            )
            took = time.monotonic() - started
    assert took < 2 + 2, f"delivered {took:.1f} s after the commit"
    assert durable_ids(session_stream.frames) == [2]


# --- 7. deletion and follow=false -----------------------------------------------------------


async def test_session_deleted_while_streaming(
    server: ServerProcess, other_server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    """The session stream is served by `other_server` (fallback poll 30 s) and the session is
    deleted through `server`: the stream must end promptly, on the notification."""
    _, key = owner_key
    async with client(server.url, key) as http, client(other_server.url, key) as watcher:
        session = await create_session(http, "doomed")
        sid = session["id"]
        path = f"/api/agent/{sid}/events"
        async with (
            open_stream(watcher, path) as session_stream,
            open_stream(watcher, OWNER_EVENTS) as owner_stream,
        ):
            frames = await session_stream.until(lambda f: f.event == "caught_up")
            assert durable_ids(frames) == [1]
            assert (await owner_stream.next()) is not None  # caught_up
            response = await http.delete(f"/api/agent/{sid}")
            assert response.status_code == 204
            started = time.monotonic()
            rest = await session_stream.end(timeout=5)
            assert time.monotonic() - started < 3
            owner_frames = await owner_stream.until(lambda f: f.event == "session_deleted")
        # Whatever the session logged before it went (a queued session is cancelled first)
        # arrives before the stream ends, in order, without gaps.
        assert_gap_free(durable_ids(rest), 2, 1 + len(durable_ids(rest)))
        assert all(f.json["sessionId"] == sid for f in owner_frames if f.durable)

        for kwargs in ({}, {"last_event_id": "0"}, {"follow": "false"}):
            with pytest.raises(AssertionError, match="answered 404"):
                async with open_stream(http, path, **kwargs):
                    pass
        assert (await http.get(f"/api/agent/{sid}")).status_code == 404
        assert (await http.get(f"/api/agent/{sid}/transcript")).status_code == 404


async def test_follow_false_closes_after_caught_up(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        session = await create_session(http, "once")
        await post_message(http, session["id"], "twice")
        path = f"/api/agent/{session['id']}/events"
        async with open_stream(http, path, follow="false") as stream:
            frames = await stream.end(5)
        assert [f.event for f in frames][:3] == ["user_message", "user_message", "caught_up"]
        assert frames[-1].event == "caught_up"
        async with open_stream(http, path, follow="false", last_event_id="1") as stream:
            frames = await stream.end(5)
        assert [(f.id, f.event) for f in frames][-1] == (None, "caught_up")
        assert durable_ids(frames) == list(range(2, len(frames) + 1))


# --- 8. graceful shutdown -------------------------------------------------------------------


async def test_sigterm_ends_open_streams_and_exits(
    database_url: str, owner_key: tuple[str, str], shortcuts: dict[str, str]
) -> None:
    _, key = owner_key
    proc = await asyncio.to_thread(ServerProcess(database_url, env=shortcuts).start)
    try:
        async with client(proc.url, key) as http:
            session = await create_session(http, "shutdown")
            async with (
                open_stream(http, OWNER_EVENTS, last_event_id="0") as owner_stream,
                open_stream(http, f"/api/agent/{session['id']}/events") as session_stream,
            ):
                for stream in (owner_stream, session_stream):
                    await stream.until(lambda f: f.event == "caught_up")
                assert proc.proc is not None
                started = time.monotonic()
                proc.proc.send_signal(signal.SIGTERM)
                await owner_stream.end(timeout=5)
                await session_stream.end(timeout=5)
                returncode = await asyncio.to_thread(proc.proc.wait, 10)
                elapsed = time.monotonic() - started
        assert elapsed < 5, elapsed
        assert returncode in (0, -signal.SIGTERM), (returncode, proc.logs())
    finally:
        proc.stop(signal.SIGKILL)


# --- streams hold no database connection and do not leak ------------------------------------


async def _open_streams(other_server: ServerProcess) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=other_server.url, timeout=10) as http:
        text = (await http.get("/metrics")).text
    gauges: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r'^ferryman_sse_streams_open\{kind="(\w+)"\} (\S+)$', line)
        if match:
            gauges[match[1]] = float(match[2])
    return gauges


async def test_many_idle_streams_fan_out_and_are_released(
    other_server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    """More open streams than the pool has connections (20): idle streams must not pin
    connections, every stream gets each live event, and disconnects are cleaned up."""
    _, key = owner_key
    count = 30
    before = await _open_streams(other_server)
    async with client(other_server.url, key) as http:
        session = await create_session(http, "fan-out")
        async with contextlib.AsyncExitStack() as stack:
            streams = []
            for i in range(count):
                path = OWNER_EVENTS if i % 2 else f"/api/agent/{session['id']}/events"
                streams.append(await stack.enter_async_context(open_stream(http, path)))
            for stream in streams:
                await stream.until(lambda f: f.event == "caught_up")
            during = await _open_streams(other_server)
            assert during.get("owner", 0) - before.get("owner", 0) == count // 2
            assert during.get("session", 0) - before.get("session", 0) == count - count // 2
            # The API still answers at once, and every stream sees what it wrote.
            await asyncio.wait_for(rename(http, session["id"], "fanned"), 3)
            await asyncio.wait_for(post_message(http, session["id"], "to all"), 3)
            for i, stream in enumerate(streams):
                (frame,) = await stream.durable(1, timeout=5)
                assert frame.event == ("session_title" if i % 2 else "user_message")
                assert frame.json["phase"] == "live"
    for _ in range(50):
        now = await _open_streams(other_server)
        if all(now.get(k, 0) == before.get(k, 0) for k in ("owner", "session")):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"streams of gone clients still open: {before} -> {now}")


async def test_streams_per_owner_are_capped(
    database_url: str, owner_key: tuple[str, str], shortcuts: dict[str, str]
) -> None:
    """FERRYMAN_MAX_STREAMS_PER_OWNER counts one owner's open streams of both kinds: one more
    is 429 TOO_MANY_STREAMS, other owners are not affected, and a closed stream (or one that
    ended by itself, like a resync) gives its slot back."""
    _, key = owner_key
    _, other_key = create_owner_key(database_url)
    env = {"FERRYMAN_MAX_STREAMS_PER_OWNER": "2", **shortcuts}
    with running(ServerProcess(database_url, env=env)) as proc:
        async with client(proc.url, key) as http, client(proc.url, other_key) as other:
            session = await create_session(http, "capped")
            session_events = f"/api/agent/{session['id']}/events"
            async with open_stream(http, OWNER_EVENTS) as first:
                await first.until(lambda f: f.event == "caught_up")
                # A stream that ends by itself releases its slot too.
                for _ in range(3):
                    async with open_stream(http, OWNER_EVENTS, last_event_id="999999") as gone:
                        assert (await gone.end())[-1].event == "resync_required"
                async with open_stream(http, session_events) as second:
                    await second.until(lambda f: f.event == "caught_up")
                    for path in (OWNER_EVENTS, session_events):
                        refused = await http.get(path)
                        assert refused.status_code == 429
                        assert refused.headers["content-type"].startswith(PROBLEM)
                        assert refused.headers["retry-after"] == "1"
                        assert refused.json()["code"] == "TOO_MANY_STREAMS"
                        assert refused.json()["limit"] == 2
                    async with open_stream(other, OWNER_EVENTS) as others:
                        await others.until(lambda f: f.event == "caught_up")
            # Both closed: the slots come back once the server sees the disconnects.
            for _ in range(50):
                async with http.stream("GET", OWNER_EVENTS) as response:
                    if response.status_code == 200:
                        break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("closed streams never gave their slots back")


# --- events pruned under a replaying stream -------------------------------------------------


def stage_event(i: int) -> Event:
    """Owner event `i` of an in-memory log."""
    row = {
        "owner_id": "o",
        "id": i,
        "session_id": uuid.uuid4(),
        "type": STAGE,
        "data": {"stage": str(i)},
        "created_at": datetime.now(UTC),
    }
    return owner_event(row)


def frames_in(chunks: list[bytes]) -> list[Frame]:
    return [parse_block(b) for b in b"".join(chunks).decode().split("\n\n") if b]


async def test_events_pruned_mid_replay_are_never_skipped_silently() -> None:
    """Retention may delete events a stream has not sent yet (its cursor was within retention
    when it connected). The stream must not jump over them: it says resync_required
    {reason: "expired"} and closes. Driven with an in-memory source, no database."""
    store = {i: stage_event(i) for i in range(1, 11)}
    reads = 0

    async def head() -> tuple[int, bool]:
        return max(store), False

    async def read(after: int, max_bytes: int) -> Page:
        nonlocal reads
        reads += 1
        got = [store[i] for i in sorted(store) if i > after][:2]  # pages of two events
        if reads == 1:  # retention runs after the first batch was read
            for i in (3, 4, 5, 6):
                store.pop(i)
        return Page(got, more=len(got) == 2)

    hub = FeedHub(Bus("postgresql://unused.invalid/none", [STREAMS_CHANNEL]), poll_interval=30)
    options = StreamOptions(ping_interval=30, retry_ms=2000, follow=False)
    body = event_stream("owner", hub, FeedSource("o:test", head, read), 0, options, asyncio.Event())
    chunks: list[bytes] = []
    async with asyncio.timeout(5):
        async for chunk in body:
            chunks.append(chunk)
    frames = frames_in(chunks)
    ids_ = durable_ids(frames)
    assert ids_ == list(range(1, len(ids_) + 1)), f"the stream skipped events: {ids_}"
    last = frames[-1]
    assert last.event == "resync_required" and last.id is None
    assert last.json["reason"] == "expired"
    assert last.json["fromEventId"] == str(ids_[-1] if ids_ else 0)


# --- a process that cannot read the log ----------------------------------------------------


@dataclass
class UnreliableLog:
    """An in-memory owner log whose reads fail, as the pool's do with the database away, while
    `down`."""

    events: dict[int, Event]
    down: bool = False
    failures: int = 0

    def _reach(self) -> None:
        if self.down:
            self.failures += 1
            raise psycopg.OperationalError("the database is away")

    async def head(self) -> tuple[int, bool]:
        self._reach()
        return max(self.events), False

    async def read(self, after: int, max_bytes: int) -> Page:
        self._reach()
        return Page([self.events[i] for i in sorted(self.events) if i > after], more=False)

    def source(self) -> FeedSource:
        return FeedSource("o:test", self.head, self.read, closable=False)


async def collect(body: AsyncIterator[bytes], into: list[bytes]) -> None:
    async for chunk in body:
        into.append(chunk)


async def wait_until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            if check():
                return
            await asyncio.sleep(0.01)


def unreliable_hub(outage_close: float) -> FeedHub:
    """A hub whose fallback poll wakes its feeds to read every 0.05 s."""
    bus = Bus("postgresql://unused.invalid/none", [STREAMS_CHANNEL])
    return FeedHub(bus, poll_interval=0.05, outage_close=outage_close)


LIVE = StreamOptions(ping_interval=30, retry_ms=2000)


async def test_streams_close_once_the_log_is_unreadable_for_the_outage_bound() -> None:
    """FERRYMAN_STREAM_OUTAGE_CLOSE: once a process's reads of the log have failed that long,
    its streams end (cleanly: the client reconnects from its last event, elsewhere). A stream
    that opens once the log can be read again starts a feed of its own and goes on from its
    cursor."""
    log = UnreliableLog({i: stage_event(i) for i in (1, 2)})
    hub = unreliable_hub(outage_close=0.5)
    chunks: list[bytes] = []
    shutdown = asyncio.Event()  # one a process: the hub watches the first it is given
    body = event_stream("owner", hub, log.source(), 0, LIVE, shutdown)
    stream = asyncio.create_task(collect(body, chunks))
    await wait_until(lambda: any(f.event == "caught_up" for f in frames_in(chunks)))
    log.down = True
    down_at = time.monotonic()
    await asyncio.wait_for(stream, 5)
    closed_after = time.monotonic() - down_at
    assert closed_after >= 0.5, f"closed {closed_after:.2f}s into the outage"
    assert log.failures >= 2
    assert durable_ids(frames_in(chunks)) == [1, 2]
    assert not hub.feeds

    log.down = False
    log.events[3] = stage_event(3)
    again: list[bytes] = []
    body = event_stream("owner", hub, log.source(), 2, LIVE, shutdown)
    stream = asyncio.create_task(collect(body, again))
    try:
        await wait_until(lambda: durable_ids(frames_in(again)) == [3])
    finally:
        shutdown.set()
        await asyncio.wait_for(stream, 5)


async def test_a_short_outage_closes_no_stream() -> None:
    """Reads that fail for less than FERRYMAN_STREAM_OUTAGE_CLOSE (a database restart) close
    no stream: it delivers what was written meanwhile, and stays open past the bound."""
    log = UnreliableLog({1: stage_event(1)})
    hub = unreliable_hub(outage_close=1.0)
    chunks: list[bytes] = []
    shutdown = asyncio.Event()
    body = event_stream("owner", hub, log.source(), 0, LIVE, shutdown)
    stream = asyncio.create_task(collect(body, chunks))
    try:
        await wait_until(lambda: any(f.event == "caught_up" for f in frames_in(chunks)))
        log.down = True
        await wait_until(lambda: log.failures >= 2)
        await asyncio.sleep(0.3)
        log.down = False
        log.events[2] = stage_event(2)
        await wait_until(lambda: durable_ids(frames_in(chunks)) == [1, 2])
        await asyncio.sleep(1.5)  # past the bound, counted from the first failure
        assert not stream.done(), "a short outage closed the stream"
    finally:
        shutdown.set()
        await asyncio.wait_for(stream, 5)


# --- the fallback poll and a LISTEN connection running behind -------------------------------


class LateBus(Bus):
    """A real bus (its own LISTEN connection) that hands each notification out `lag` s after it
    came, in order: an API process's bus running behind under load."""

    lag = 0.6

    def _wake(self, key: str, body: str | None = None) -> None:
        asyncio.get_running_loop().call_later(self.lag, super()._wake, key, body)


async def test_the_fallback_poll_does_not_overtake_a_late_bus(database_url: str) -> None:
    """A turn's last delta and its `assistant_message` commit together while the bus runs
    behind, and the poll reads the moved head first. Woken at once, the feed would read the
    message, the stream would send it, and then drop the delta as late (`in_order`): a token
    lost. The poll waits until the bus has heard its own marker, sent after the head was
    read, so the delta is in the feed first and goes out before the message."""
    key = session_key(uuid.uuid4())
    log: dict[int, Event] = {}

    def event(seq: int, type_: str, data: dict[str, Any]) -> Event:
        return Event.of(seq, type_, {"id": str(seq), "type": type_, "seq": seq, "data": data})

    log[1] = event(1, "session_start", {})

    async def head() -> tuple[int, bool]:
        return max(log), False

    async def read(after: int, max_bytes: int) -> Page:
        return Page([log[i] for i in sorted(log) if i > after], more=False)

    async def heads(keys: list[str], marker: str | None = None) -> dict[str, tuple[int, bool]]:
        if marker is not None:
            async with await psycopg.AsyncConnection.connect(database_url) as conn:
                await notify(conn, marker)  # committed as the connection closes
        return {key: (max(log), False)}

    bus = LateBus(database_url, [STREAMS_CHANNEL])
    await bus.start()
    await asyncio.wait_for(bus.connected.wait(), 10)
    hub = FeedHub(bus, poll_interval=0.2, heads=heads)
    chunks: list[bytes] = []
    shutdown = asyncio.Event()
    body = event_stream("session", hub, FeedSource(key, head, read), 1, LIVE, shutdown)
    stream = asyncio.create_task(collect(body, chunks))
    try:
        await wait_until(lambda: any(f.event == "caught_up" for f in frames_in(chunks)))
        # The run's last write: the turn's last delta, then the message (the key's own
        # notification lost, so that only the poll wakes the feed).
        envelope = json.dumps({"type": "message_delta", "afterSeq": 1, "chunk": 1, "text": "end"})
        delta = ephemeral_body(1, "message_delta", envelope, chunk=1)
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute(
                "SELECT pg_notify(%s, %s)",
                (STREAMS_CHANNEL, ephemeral_payloads([(key, delta)])[0]),
            )
        log[2] = event(2, "assistant_message", {"text": "end", "toolCalls": []})
        await wait_until(
            lambda: any(f.event == "assistant_message" for f in frames_in(chunks)), timeout=10
        )
        await asyncio.sleep(LateBus.lag + 0.2)  # a delta dropped as late would be gone by now
    finally:
        shutdown.set()
        await asyncio.wait_for(stream, 5)
        await bus.stop()
    live = [f.event for f in frames_in(chunks) if f.event in ("message_delta", "assistant_message")]
    assert live == ["message_delta", "assistant_message"], live
