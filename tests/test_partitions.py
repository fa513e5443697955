"""Network partitions: API and worker processes as hosts in network namespaces of their own
(tests/netns.py), against a PostgreSQL of the test's own that listens on the host side of each
host's link. A cut takes the host's link down; a heal brings it up.

- A worker host cut off mid-run: its sessions are taken over within the lease TTL; once the
  link heals its late writes are refused by the fence and it lets the sessions go; the
  non-idempotent tool ran once per call; every session succeeds; the owner stream has no gap
  and no repeat.
- An API host cut off: its requests answer 503 DATABASE_UNAVAILABLE within the pool timeout,
  its streams close, and clients that reconnect to another API host miss and repeat nothing.
- Only the LISTEN connection cut: the poll keeps every stream live, then LISTEN comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from app.db import migrate
from bench.compare import Cluster
from tests.netns import Host, hosts
from tests.support import (
    WORKER_ENV,
    ServerProcess,
    WorkerProcess,
    assert_problem,
    client,
    create_owner_key,
    ready,
    sse,
    wait_logged,
)
from tests.test_recovery import session_rows
from tests.tools import TOOLS_ENV

LEASE_TTL = 3.0
POOL_TIMEOUT = 2.0
POLL_INTERVAL = 1.0
PARTITION_ENV = {
    "FERRYMAN_LEASE_TTL": str(LEASE_TTL),
    "FERRYMAN_HEARTBEAT_INTERVAL": "1",
    "FERRYMAN_POOL_TIMEOUT": str(POOL_TIMEOUT),
    "FERRYMAN_POLL_INTERVAL": str(POLL_INTERVAL),
    "FERRYMAN_AUTH": "keys",
}


@contextlib.contextmanager
def network(count: int) -> Iterator[tuple[list[Host], str]]:
    """`count` test hosts and a migrated database on a PostgreSQL that all of them reach
    (the URL as seen from this machine; `via` gives a host's)."""
    with hosts(count) as made:
        cluster = Cluster(networks=[made[0].database])
        try:
            cluster.start()
            with cluster.database("ferryman_partitions") as url:
                migrate.upgrade(url)
                yield made, url
        finally:
            cluster.stop()


def via(url: str, host: Host) -> str:
    """`url` as `host` reaches the database."""
    return psycopg.conninfo.make_conninfo(url, host=str(host.database.ip))


def status_of(url: str, session_id: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT status FROM sessions WHERE id = %s", (session_id,)).fetchone()
    assert row is not None
    return str(row[0])


async def until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def owner_stream(
    http: httpx.AsyncClient, into: list[dict[str, Any]], last_id: str = "0"
) -> AsyncIterator[None]:
    """Read the owner stream into `into` in the background."""

    async def read() -> None:
        async with sse(http, "/api/agent/owner-events", last_event_id=last_id) as events:
            async for event in events:
                if event.id and event.event not in ("caught_up", "resync_required"):
                    into.append({**json.loads(event.data), "id": int(event.id)})

    task = asyncio.create_task(read())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await task


def assert_gap_free(seen: list[dict[str, Any]], url: str) -> None:
    """The owner stream delivered every row of the owner log once, in order."""
    with psycopg.connect(url, autocommit=True) as conn:
        stored = [row[0] for row in conn.execute("SELECT id FROM owner_events ORDER BY id")]
    assert [e["id"] for e in seen] == stored, "the owner stream missed or repeated an event"


def count(seen: list[dict[str, Any]], type_: str, **data: Any) -> int:
    return sum(
        1
        for e in seen
        if e["type"] == type_ and all(e["data"].get(k) == v for k, v in data.items())
    )


def record_script(path: Path, name: str, seconds: float) -> list[dict[str, Any]]:
    def record(step: str) -> dict[str, Any]:
        call = {"name": "record", "arguments": {"path": str(path), "text": f"{name}-{step}"}}
        return {"toolCalls": [call]}

    return [
        record("before"),
        {"toolCalls": [{"name": "slow", "arguments": {"seconds": seconds}}]},
        record("after"),
        {"text": "finished"},
    ]


async def test_a_worker_cut_off_mid_run_is_taken_over_and_fenced(tmp_path: Path) -> None:
    records = tmp_path / "records.txt"
    with network(2) as ([cut_host, other_host], url):
        _, key = create_owner_key(url)
        env = {**WORKER_ENV, **PARTITION_ENV, **TOOLS_ENV}
        api = ServerProcess(url, env=PARTITION_ENV).start()
        cut = WorkerProcess(via(url, cut_host), env=env, netns=cut_host, concurrency=4).start()
        other = WorkerProcess(via(url, other_host), env=env, netns=other_host, concurrency=4)
        try:
            await ready(cut)
            seen: list[dict[str, Any]] = []
            async with client(api.url, key) as http, owner_stream(http, seen):
                sessions = []
                for i in range(4):
                    script = record_script(records, f"s{i}", seconds=6)
                    response = await http.post(
                        "/api/agent", json={"prompt": f"cut {i}", "script": script}
                    )
                    assert response.status_code == 201, response.text
                    sessions.append(response.json()["id"])

                await until(
                    lambda: count(seen, "session_active_stage", stage="tool:slow") == len(sessions),
                    30,
                    "every session's slow tool to start",
                )
                other.start()
                await ready(other)
                cut_host.cut()
                cut_at = time.monotonic()
                try:
                    await until(
                        lambda: count(seen, "session_resumed") == len(sessions),
                        LEASE_TTL + 10,
                        "the other worker to take over",
                    )
                    took = time.monotonic() - cut_at
                finally:
                    cut_host.heal()
                for session_id in sessions:
                    # The cut worker's slow tool ended during the cut; its result is refused.
                    await wait_logged(
                        cut, "lease lost; run stops writing", session=session_id, timeout=40
                    )
                await until(
                    lambda: count(seen, "session_status", status="succeeded") == len(sessions),
                    40,
                    "every session to succeed",
                )
                assert cut.proc is not None and cut.proc.poll() is None, "the cut worker died"
            print(f"worker cut -> takeover {took:.2f}s (lease TTL {LEASE_TTL}s)")
            assert took < LEASE_TTL + 5, took
            for session_id in sessions:
                assert status_of(url, session_id) == "succeeded"
                rows = session_rows(url, session_id)
                first_new = min(r["seq"] for r in rows if r["attempt"] > 1)
                late = [r for r in rows if r["attempt"] == 1 and r["seq"] > first_new]
                assert not late, f"the cut worker wrote after the takeover: {late}"
            lines = [line.split()[0] for line in records.read_text().splitlines()]
            expected = sorted(f"s{i}-{step}" for i in range(4) for step in ("before", "after"))
            assert sorted(lines) == expected, "a non-idempotent tool ran twice (or never)"
            assert_gap_free(seen, url)
            # The cut worker let the sessions go: it holds none of them and claims again.
            with psycopg.connect(url, autocommit=True) as conn:
                held = conn.execute(
                    "SELECT count(*) FROM sessions WHERE status = 'running'"
                ).fetchone()
            assert held == (0,)
        finally:
            for process in (cut, other, api):
                process.stop()


async def test_an_api_host_cut_off_answers_503_and_clients_move_on() -> None:
    with network(2) as ([cut_host, other_host], url):
        _, key = create_owner_key(url)
        env = {**WORKER_ENV, **PARTITION_ENV, **TOOLS_ENV}
        cut_api = ServerProcess(via(url, cut_host), env=PARTITION_ENV, netns=cut_host).start()
        other_api = ServerProcess(via(url, other_host), env=PARTITION_ENV, netns=other_host)
        other_api.start()
        worker = WorkerProcess(url, env=env, concurrency=4).start()
        try:
            await ready(worker)
            seen: list[dict[str, Any]] = []
            async with client(cut_api.url, key) as http:
                sessions = []
                for i in range(3):
                    script = [
                        {"toolCalls": [{"name": "slow", "arguments": {"seconds": 2}}]},
                        {"toolCalls": [{"name": "slow", "arguments": {"seconds": 2}}]},
                        {"text": "finished"},
                    ]
                    response = await http.post(
                        "/api/agent", json={"prompt": f"api cut {i}", "script": script}
                    )
                    assert response.status_code == 201, response.text
                    sessions.append(response.json()["id"])
                stream = asyncio.create_task(read_until_closed(http, seen))
                await until(lambda: len(seen) >= 3, 20, "events on the cut host's stream")
                cut_host.cut_database()
                try:
                    started = time.monotonic()
                    response = await http.get("/api/agent", params={"limit": 5})
                    answered = time.monotonic() - started
                    assert_problem(response, 503, "DATABASE_UNAVAILABLE")
                    assert answered < POOL_TIMEOUT + 3, answered
                finally:
                    cut_host.heal_database()
                # The client gives up on the cut host's stream (see the test below).
                stream.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stream
            await go_on_elsewhere(other_api, key, seen, sessions, url)
        finally:
            for process in (worker, cut_api, other_api):
                process.stop()


STREAM_OUTAGE_CLOSE = 4.0


async def test_an_api_host_cut_off_closes_its_streams() -> None:
    """Its streams end cleanly once it has been unable to read the log for
    FERRYMAN_STREAM_OUTAGE_CLOSE (not at the first failed read), a new stream there answers 503
    within the pool timeout, and the client goes on at the other API host from its last id."""
    with network(2) as ([cut_host, other_host], url):
        _, key = create_owner_key(url)
        api_env = {**PARTITION_ENV, "FERRYMAN_STREAM_OUTAGE_CLOSE": str(STREAM_OUTAGE_CLOSE)}
        cut_api = ServerProcess(via(url, cut_host), env=api_env, netns=cut_host).start()
        other_api = ServerProcess(via(url, other_host), env=api_env, netns=other_host)
        other_api.start()
        worker_env = {**WORKER_ENV, **PARTITION_ENV, **TOOLS_ENV}
        worker = WorkerProcess(url, env=worker_env, concurrency=4).start()
        try:
            await ready(worker)
            seen: list[dict[str, Any]] = []
            async with client(cut_api.url, key) as http:
                stream = asyncio.create_task(read_until_closed(http, seen))
                sessions = []
                for i in range(3):
                    # Still writing when the stream closes, and after.
                    slow = {"toolCalls": [{"name": "slow", "arguments": {"seconds": 5}}]}
                    script = [slow, slow, slow, {"text": "finished"}]
                    response = await http.post(
                        "/api/agent", json={"prompt": f"stream cut {i}", "script": script}
                    )
                    assert response.status_code == 201, response.text
                    sessions.append(response.json()["id"])
                await until(lambda: len(seen) >= 3, 20, "events on the cut host's stream")
                cut_host.cut_database()
                cut_at = time.monotonic()
                try:
                    ended_cleanly = await asyncio.wait_for(stream, STREAM_OUTAGE_CLOSE + 20)
                    closed_after = time.monotonic() - cut_at
                    started = time.monotonic()
                    response = await asyncio.wait_for(
                        http.get(
                            "/api/agent/owner-events", headers={"Accept": "text/event-stream"}
                        ),
                        POOL_TIMEOUT + 10,
                    )
                    answered = time.monotonic() - started
                finally:
                    cut_host.heal_database()
                    stream.cancel()
            print(
                f"API cut -> its stream closed {closed_after:.2f}s, a new one 503 {answered:.2f}s"
            )
            assert ended_cleanly, "the cut host's stream broke instead of ending"
            assert closed_after >= STREAM_OUTAGE_CLOSE, closed_after
            # Found within a poll and a pool timeout, closed at a failed read that came later.
            assert closed_after < STREAM_OUTAGE_CLOSE + 3 * (POLL_INTERVAL + POOL_TIMEOUT) + 5
            assert_problem(response, 503, "DATABASE_UNAVAILABLE")
            assert answered < POOL_TIMEOUT + 3, answered
            await go_on_elsewhere(other_api, key, seen, sessions, url)
        finally:
            for process in (worker, cut_api, other_api):
                process.stop()


async def go_on_elsewhere(
    api: ServerProcess, key: str, seen: list[dict[str, Any]], sessions: list[str], url: str
) -> None:
    """The client reads the owner stream at another API host from the last id it saw, until
    every session succeeded: the stream missed and repeated nothing."""
    last_id = str(seen[-1]["id"]) if seen else "0"
    async with client(api.url, key) as http, owner_stream(http, seen, last_id):
        await until(
            lambda: count(seen, "session_status", status="succeeded") == len(sessions),
            60,
            "every session to succeed",
        )
    assert_gap_free(seen, url)


async def read_until_closed(http: httpx.AsyncClient, into: list[dict[str, Any]]) -> bool:
    """Read the owner stream until the server closes it (True) or the connection breaks."""
    try:
        async with sse(http, "/api/agent/owner-events", last_event_id="0") as events:
            async for event in events:
                if event.id and event.event not in ("caught_up", "resync_required"):
                    into.append({**json.loads(event.data), "id": int(event.id)})
    except httpx.HTTPError:
        return False
    return True


async def test_a_cut_listen_connection_leaves_the_poll() -> None:
    with network(1) as ([api_host], url):
        _, key = create_owner_key(url)
        env = {**WORKER_ENV, **PARTITION_ENV, **TOOLS_ENV}
        api = ServerProcess(via(url, api_host), env=PARTITION_ENV, netns=api_host).start()
        worker = WorkerProcess(url, env=env, concurrency=2).start()
        try:
            await ready(worker)
            seen: list[dict[str, Any]] = []
            async with client(api.url, key) as http, owner_stream(http, seen):
                await until(lambda: listeners(url, api_host) == 1, 20, "the API's LISTEN")
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE query ILIKE 'LISTEN%%' AND client_addr = %s",
                        (api_host.address,),
                    )
                script = [
                    {"toolCalls": [{"name": "slow", "arguments": {"seconds": 0.5}}]},
                    {"text": "finished"},
                ]
                response = await http.post("/api/agent", json={"prompt": "poll", "script": script})
                assert response.status_code == 201, response.text

                await until(
                    lambda: count(seen, "session_status", status="succeeded") == 1,
                    20,
                    "the session's end through the poll",
                )
                await until(lambda: listeners(url, api_host) == 1, 20, "LISTEN to come back")
            assert_gap_free(seen, url)
        finally:
            for process in (worker, api):
                process.stop()


def listeners(url: str, host: Host) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%%'"
            " AND client_addr = %s",
            (host.address,),
        ).fetchone()
    return int(row[0]) if row else 0


pytestmark = pytest.mark.timeout(120)
