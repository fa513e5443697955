"""The database goes away and comes back: the service answers 503 while it is down, recovers
without a restart, and streams resume with nothing lost.

This test always runs its own embedded PostgreSQL cluster (its own data directory, whatever
$DATABASE_URL says), because it stops and starts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import httpx
import psycopg
import pytest
from httpx_sse import ServerSentEvent

from app.domain import split_position
from tests.cluster import Cluster, data_dir_for
from tests.support import ServerProcess, client, create_owner_key, sse

POOL_TIMEOUT = 2.0  # FERRYMAN_POOL_TIMEOUT of the server under test
# A request while the database is down must answer within the pool timeout plus slack.
DOWN_ANSWER_BOUND = POOL_TIMEOUT + 6.0
# After PostgreSQL is back, the API must answer 200 again within this many seconds.
RECOVERY_BOUND = 10.0
PROBLEM_JSON = "application/problem+json"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    cluster = Cluster(data_dir_for("ferryman-test-restart"))
    cluster.boot()
    try:
        yield cluster
    finally:
        # Leave no server behind (the package would not stop it: after our restart its
        # record of the postmaster is stale).
        with contextlib.suppress(Exception):
            if cluster.running():
                cluster.stop()


@pytest.fixture(scope="module")
def restart_db(cluster: Cluster) -> Iterator[str]:
    """A fresh, migrated database on the dedicated cluster, dropped afterwards."""
    url = cluster.create_database("ferryman_restart")
    try:
        yield url
    finally:
        cluster.drop_database(url)


def is_durable(event: ServerSentEvent) -> bool:
    """A durable event frame: its envelope's id is the frame's `id:`.

    Not just "has an id": httpx-sse (like EventSource) keeps the last event id for every later
    block, so control frames and even `: ping` blocks come out carrying the previous id.
    """
    if not event.id or not event.data:
        return False
    return bool(event.json().get("id") == event.id)


@dataclass
class StreamLog:
    """Everything one followed SSE stream delivered, across reconnects."""

    path: str
    events: list[ServerSentEvent] = field(default_factory=list)
    last_id: str | None = None
    connects: int = 0
    start_cursor: int | None = None  # the cursor of the first `caught_up`
    failures: list[str] = field(default_factory=list)
    caught_up: asyncio.Event = field(default_factory=asyncio.Event)

    def durable(self) -> list[ServerSentEvent]:
        return [e for e in self.events if is_durable(e)]

    def ids(self) -> list[int]:
        """The numbers (seqs, owner ids) of its durable events, whatever their log's epoch."""
        return [split_position(int(e.id))[1] for e in self.durable()]

    def positions(self) -> list[int]:
        """Their ids as sent (`domain.position`): they only grow, across a failover too."""
        return [int(e.id) for e in self.durable()]


async def follow(http: httpx.AsyncClient, log: StreamLog, stop: asyncio.Event) -> None:
    """Read a stream until `stop`; when it ends or fails, reconnect from the last id seen,
    as an EventSource would."""
    while not stop.is_set():
        try:
            async with sse(http, log.path, last_event_id=log.last_id) as events:
                log.connects += 1
                async for event in events:
                    log.events.append(event)
                    if is_durable(event):
                        log.last_id = event.id
                    if event.event == "caught_up":
                        if log.start_cursor is None:
                            log.start_cursor = split_position(int(event.json()["cursor"]))[1]
                        log.caught_up.set()
            log.failures.append("stream ended")
        except httpx.HTTPStatusError as exc:
            log.failures.append(f"reconnect answered {exc.response.status_code}")
        except httpx.HTTPError as exc:
            log.failures.append(f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll `predicate()` until true; return how long it took."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


def assert_unavailable(response: httpx.Response, elapsed: float, what: str) -> None:
    assert response.status_code == 503, f"{what}: {response.status_code} {response.text}"
    assert response.headers["content-type"].startswith(PROBLEM_JSON), what
    body = response.json()
    assert body["code"] == "DATABASE_UNAVAILABLE", f"{what}: {body}"
    assert body["status"] == 503
    assert elapsed < DOWN_ANSWER_BOUND, f"{what} took {elapsed:.1f}s while the database was down"


async def timed(request: Awaitable[httpx.Response]) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    response = await request
    return response, time.monotonic() - start


async def test_database_restart(cluster: Cluster, restart_db: str) -> None:
    owner, key = create_owner_key(restart_db)
    server = ServerProcess(
        restart_db,
        env={
            "FERRYMAN_POOL_TIMEOUT": str(POOL_TIMEOUT),
            "FERRYMAN_PING_INTERVAL": "1",
            "FERRYMAN_AUTH": "keys",
        },
    )
    stop_streams = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        server.start()  # inside the try: a server that never got ready is still stopped
        async with client(server.url, key) as http:
            # Before: one session, then an owner stream and that session's stream.
            first = await http.post("/api/agent", json={"prompt": "before the outage"})
            assert first.status_code == 201, first.text
            first_id = first.json()["id"]
            # The owner stream starts live from now (no cursor), so it opens before we write.
            owner_log = StreamLog("/api/agent/owner-events")
            session_log = StreamLog(f"/api/agent/{first_id}/events")
            for log in (owner_log, session_log):
                tasks.append(asyncio.create_task(follow(http, log, stop_streams)))
            await asyncio.wait_for(owner_log.caught_up.wait(), 10)
            await asyncio.wait_for(session_log.caught_up.wait(), 10)

            created = [first_id]
            for i in range(3):
                response = await http.post("/api/agent", json={"prompt": f"before {i}"})
                assert response.status_code == 201, response.text
                created.append(response.json()["id"])
            message = await http.post(f"/api/agent/{first_id}/messages", json={"text": "one"})
            assert message.status_code == 202, message.text
            # The streams are live: the pre-outage events arrive before we pull the plug.
            await wait_for(lambda: len(owner_log.durable()) >= 3, 10, "pre-outage owner events")
            # The first session's creation (and whatever the in-process worker did with it)
            # came before the stream opened.
            assert owner_log.start_cursor is not None and owner_log.start_cursor >= 1
            await wait_for(lambda: 2 in session_log.ids(), 10, "pre-outage session event")

            # The database goes away.
            await asyncio.to_thread(cluster.stop)
            assert not await asyncio.to_thread(cluster.running)

            response, elapsed = await timed(http.get("/api/agent"))
            assert_unavailable(response, elapsed, "GET /api/agent")
            response, elapsed = await timed(http.post("/api/agent", json={"prompt": "down"}))
            assert_unavailable(response, elapsed, "POST /api/agent")
            response, elapsed = await timed(http.get(f"/api/agent/{first_id}"))
            assert_unavailable(response, elapsed, "GET /api/agent/{id}")
            response, elapsed = await timed(
                http.post(f"/api/agent/{first_id}/messages", json={"text": "lost"})
            )
            assert_unavailable(response, elapsed, "POST /api/agent/{id}/messages")
            response, elapsed = await timed(
                http.get("/api/agent/owner-events", headers={"Accept": "text/event-stream"})
            )
            assert_unavailable(response, elapsed, "GET /api/agent/owner-events")

            ready, elapsed = await timed(http.get("/readyz"))
            assert ready.status_code == 503, ready.text
            assert ready.json()["code"] == "NOT_READY"
            assert ready.json()["checks"]["database"] == "unavailable"
            assert elapsed < DOWN_ANSWER_BOUND
            health = await http.get("/healthz")
            assert health.status_code == 200

            # Several more seconds down, so the pool and the bus back off for a while.
            down_until = time.monotonic() + 4
            while time.monotonic() < down_until:
                response, elapsed = await timed(http.get("/api/agent"))
                assert_unavailable(response, elapsed, "GET /api/agent (down)")
            assert server.proc is not None and server.proc.poll() is None

            # The database comes back; the server is not restarted.
            await asyncio.to_thread(cluster.start)
            back = time.monotonic()
            while True:
                response = await http.get("/api/agent")
                if response.status_code == 200:
                    break
                assert_unavailable(response, 0.0, "GET /api/agent (recovering)")
                assert time.monotonic() - back < RECOVERY_BOUND, "the API did not recover"
                await asyncio.sleep(0.1)
            recovered_in = time.monotonic() - back
            while (await http.get("/readyz")).status_code != 200:
                assert time.monotonic() - back < RECOVERY_BOUND, (
                    f"/readyz did not recover: {(await http.get('/readyz')).text}"
                )
                await asyncio.sleep(0.1)
            ready_in = time.monotonic() - back
            print(f"API recovered {recovered_in:.2f}s, ready {ready_in:.2f}s after restart")

            # Everything written after recovery reaches the streams, once, in order.
            for i in range(5):
                response = await http.post("/api/agent", json={"prompt": f"after {i}"})
                assert response.status_code == 201, response.text
                created.append(response.json()["id"])
            message = await http.post(f"/api/agent/{first_id}/messages", json={"text": "two"})
            assert message.status_code == 202, message.text
            last_seq = message.json()["message"]["seq"]

            with psycopg.connect(restart_db, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT last_id FROM owner_cursors WHERE owner_id = %s", (owner,)
                ).fetchone()
            assert row is not None
            owner_head = int(row[0])

            def owner_done() -> bool:
                seen = owner_log.ids()
                return bool(seen) and seen[-1] >= owner_head

            await wait_for(owner_done, 15, f"owner events up to {owner_head}")
            await wait_for(lambda: last_seq in session_log.ids(), 15, f"session seq {last_seq}")

            assert server.proc is not None and server.proc.poll() is None, "server restarted"
    finally:
        stop_streams.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        server.stop()

    logs = server.logs()
    assert "unhandled error" not in logs, logs
    context = (
        f"owner stream: ids={owner_log.ids()} connects={owner_log.connects}"
        f" failures={owner_log.failures}; session stream: ids={session_log.ids()}"
        f" connects={session_log.connects} failures={session_log.failures}"
    )
    print(context)

    # Owner feed: ids contiguous from the first one, no gap, no duplicate; every session's
    # creation is on it exactly once.
    assert owner_log.start_cursor is not None
    owner_ids = [i for i in owner_log.ids() if i <= owner_head]
    assert owner_ids == list(range(owner_log.start_cursor + 1, owner_head + 1)), context
    created_on_stream = [
        e.json()["sessionId"] for e in owner_log.durable() if e.event == "session_created"
    ]
    assert sorted(created_on_stream) == sorted(created[1:]), context
    # Session feed: seqs contiguous from 1 (backlog, then live), none twice.
    session_ids = [i for i in session_log.ids() if i <= last_seq]
    assert session_ids == list(range(1, last_seq + 1)), context
