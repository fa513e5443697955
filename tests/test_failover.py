"""The primary dies hard and its synchronous standby is promoted, under load: every process on
the libpq multi-host URL reconnects to the new primary by itself, claiming resumes, every
session ends, and the stream clients miss and repeat nothing. The standby is promoted by hand
(`pg_ctl promote`, as an operator would) or by pg_auto_failover's monitor.

Runs its own PostgreSQL 15 servers (Debian's binaries), whatever $DATABASE_URL says."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg
import pytest
from httpx_sse import ServerSentEvent

from app.db import migrate
from tests.ha import AUTO_FAILOVER_EXTENSION, BIN, PG_AUTOCTL, AutoFailoverFormation, ReplicatedPair
from tests.support import (
    ServerProcess,
    WorkerProcess,
    client,
    create_owner_key,
    missing,
    new_session,
    sse,
    stop_all,
)
from tests.test_db_restart import StreamLog, follow, is_durable, wait_for

# Its servers are its own, whatever $DATABASE_URL says: CI runs it on one PostgreSQL only.
pytestmark = pytest.mark.once

SESSIONS = 20
SLEEP_SECONDS = 1
TURNS = 2
# As an HA tool would: it confirms the primary gone before it promotes.
PROMOTE_AFTER = float(os.environ.get("FAILOVER_PROMOTE_AFTER", "3"))
RECOVERY_BOUND = 60.0  # from the primary's loss to every session ended


@contextlib.contextmanager
def replicated_pair(synchronous: bool) -> Iterator[ReplicatedPair]:
    if not (BIN / "pg_basebackup").exists():
        missing("PostgreSQL 15 server binaries", "apt-get install postgresql-15")
    pair = ReplicatedPair(synchronous=synchronous)
    try:
        pair.start()
        yield pair
    finally:
        pair.close()


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    with replicated_pair(synchronous=True) as pair:
        yield pair


@pytest.fixture
def formation() -> Iterator[AutoFailoverFormation]:
    if not (PG_AUTOCTL.exists() and AUTO_FAILOVER_EXTENSION.exists()):
        missing(
            "pg_auto_failover for PostgreSQL 15",
            "apt-get install pg-auto-failover-cli postgresql-15-auto-failover",
        )
    formation = AutoFailoverFormation("fm")
    try:
        formation.start()
        yield formation
    finally:
        formation.close()


def created_events(url: str) -> int:
    with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
        row = conn.execute("SELECT count(*) FROM session_events").fetchone()
        assert row is not None
        return int(row[0])


async def test_failover_to_a_synchronous_standby(pair: ReplicatedPair) -> None:
    with psycopg.connect(pair.admin_url(pair.primary), autocommit=True) as conn:
        conn.execute("CREATE DATABASE fm")

    def stop_primary() -> str:
        pair.primary.stop("immediate")
        return pair.admin_url(pair.standby, "fm")

    def promote() -> None:
        time.sleep(PROMOTE_AFTER)
        pair.promote_standby()

    await fail_over_under_load(pair.url("fm"), stop_primary, promote)


async def test_failover_by_pg_auto_failover(formation: AutoFailoverFormation) -> None:
    """The monitor notices the primary gone and promotes the standby; nothing else is done.
    Replication is synchronous until then, and the promoted standby, alone, waits for none."""
    primary, standby = formation.nodes
    assert synchronous_standby_names(formation.admin_url(primary)) != ""

    def stop_primary() -> str:
        formation.stop_hard(primary)
        return formation.admin_url(standby)

    await fail_over_under_load(formation.url(), stop_primary, None)
    assert formation.states()[standby.pgdata.name] in ("wait_primary", "primary")
    assert synchronous_standby_names(formation.admin_url(standby)) == ""


def synchronous_standby_names(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW synchronous_standby_names").fetchone()
        assert row is not None
        return str(row[0])


async def fail_over_under_load(
    url: str, stop_primary: Callable[[], str], promote: Callable[[], None] | None
) -> None:
    """20 sessions mid-run on an API process and two workers at `url`; `stop_primary()` stops
    the primary hard and names the standby, `promote` (if the test, not an HA tool, does it)
    promotes it. Every session must succeed and both streams miss and repeat nothing."""
    migrate.upgrade(url)
    _, key = create_owner_key(url)
    env = {
        "FERRYMAN_POOL_TIMEOUT": "2",
        "FERRYMAN_AUTH": "keys",
    }
    server = ServerProcess(url, env=env)
    workers = [WorkerProcess(url, env=env, concurrency=2) for _ in range(2)]
    # Runs stream text and call a tool turn after turn: writes are in flight at the loss.
    step = {"name": "sleep", "arguments": {"seconds": SLEEP_SECONDS}}
    script = [
        *({"text": f"step {n} " * 8, "chunks": 8, "delayMs": 800, "toolCalls": [step]}
          for n in range(TURNS)),
        {"text": "done", "stopReason": "stop", "delayMs": 20, "chunks": 3},
    ]  # fmt: skip
    stop_streams = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        server.start()
        for worker in workers:
            worker.start()
        async with client(server.url, key) as http:
            owner_log = StreamLog("/api/agent/owner-events")
            tasks.append(asyncio.create_task(follow(http, owner_log, stop_streams)))
            await asyncio.wait_for(owner_log.caught_up.wait(), 10)
            ids = [
                await new_session(http, f"task {i}", model="scripted", script=script)
                for i in range(SESSIONS)
            ]
            session_log = StreamLog(f"/api/agent/{ids[0]}/events")
            tasks.append(asyncio.create_task(follow(http, session_log, stop_streams)))

            async def statuses() -> dict[str, str]:
                found: dict[str, str] = {}
                for session_id in ids:
                    with contextlib.suppress(Exception):
                        response = await http.get(f"/api/agent/{session_id}")
                        if response.status_code == 200:
                            found[session_id] = response.json()["status"]
                return found

            # Runs are mid-tool (the sleep) when the primary goes.
            deadline = time.monotonic() + 30
            while list((await statuses()).values()).count("running") < 4:
                assert time.monotonic() < deadline, "no runs started"
                await asyncio.sleep(0.2)
            lost_at = time.monotonic()
            new_primary = await asyncio.to_thread(stop_primary)
            # Still a standby: it has every event the primary committed (synchronously).
            before = created_events(new_primary)
            if promote:
                await asyncio.to_thread(promote)

            def committed_again() -> bool:
                with contextlib.suppress(psycopg.Error):
                    return created_events(new_primary) > before
                return False

            await wait_for(committed_again, RECOVERY_BOUND, "a committed event")
            first_event = time.monotonic() - lost_at
            print(f"\nfirst committed event on the new primary {first_event:.2f} s after the loss")

            deadline = lost_at + RECOVERY_BOUND
            while True:
                found = await statuses()
                if len(found) == SESSIONS and all(s == "succeeded" for s in found.values()):
                    break
                if time.monotonic() > deadline:
                    logs = "\n".join(w.logs(3000) for w in workers)
                    raise AssertionError(f"not all succeeded in {RECOVERY_BOUND}s: {found}\n{logs}")
                await asyncio.sleep(0.5)
            print(f"every session succeeded {time.monotonic() - lost_at:.2f} s after the loss")

            last = (await http.get(f"/api/agent/{ids[0]}")).json()
            await wait_for(
                lambda: max(session_log.ids(), default=0) >= last["lastSeq"], 15, "session tail"
            )
            expected_owner = owner_log.start_cursor
            assert expected_owner is not None
            await asyncio.sleep(2)  # the owner stream's tail
    finally:
        stop_streams.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        stop_all(workers)
        server.stop()
    session_ids = session_log.ids()
    assert session_ids == list(range(1, len(session_ids) + 1)), f"session stream: {session_ids}"
    for log in (session_log, owner_log):
        positions = log.positions()
        assert positions == sorted(set(positions)), f"{log.path}: {positions}"
    owner_ids = owner_log.ids()
    assert owner_ids == list(range(expected_owner + 1, expected_owner + 1 + len(owner_ids))), (
        f"owner stream: {owner_ids}"
    )


@pytest.fixture
def async_pair() -> Iterator[ReplicatedPair]:
    with replicated_pair(synchronous=False) as pair:
        yield pair


def cut_replication(pair: ReplicatedPair) -> None:
    """Stop the standby's WAL receiver: what the primary commits from now on never reaches it,
    as when an asynchronous standby lags at the moment its primary dies."""
    primary = pair.admin_url(pair.primary)
    with psycopg.connect(primary, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
        assert row is not None
        flushed = row[0]
    with psycopg.connect(pair.admin_url(pair.standby), autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while True:  # first everything so far
            row = conn.execute(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (flushed,)
            ).fetchone()
            if row is not None and row[0]:
                break
            assert time.monotonic() < deadline, "the standby did not catch up"
            time.sleep(0.1)
        conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
        conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 30
        while conn.execute("SELECT 1 FROM pg_stat_wal_receiver").fetchone() is not None:
            assert time.monotonic() < deadline, "the standby's WAL receiver did not stop"
            time.sleep(0.1)


async def read_stream(
    http: httpx.AsyncClient, path: str, last_event_id: str | None = None, **params: Any
) -> list[ServerSentEvent]:
    async with sse(http, path, last_event_id=last_event_id, **params) as events:
        return [event async for event in events]


async def post_message(http: httpx.AsyncClient, session_id: str, text: str) -> int:
    deadline = time.monotonic() + RECOVERY_BOUND
    while True:  # 503 until the standby is promoted and the pool reconnects
        with contextlib.suppress(httpx.HTTPError):
            response = await http.post(f"/api/agent/{session_id}/messages", json={"text": text})
            if response.status_code == 202:
                return int(response.json()["message"]["seq"])
            assert response.status_code == 503, response.text
        assert time.monotonic() < deadline, "the API did not come back"
        await asyncio.sleep(0.2)


async def test_async_failover_asks_clients_ahead_of_the_promoted_log_to_resync(
    async_pair: ReplicatedPair,
) -> None:
    """The primary commits events the asynchronous standby never gets, a client reads them,
    and the standby is promoted: the new primary gives those seqs and owner ids out again, to
    other events. A client whose cursor names a lost event gets `resync_required`, both when it
    reconnects and when its stream stayed open through the failover; one whose cursor
    survived goes on without a gap."""
    pair = async_pair
    with psycopg.connect(pair.admin_url(pair.primary), autocommit=True) as conn:
        conn.execute("CREATE DATABASE fm")
    url = pair.url("fm")
    migrate.upgrade(url)
    _, key = create_owner_key(url)
    server = ServerProcess(url, env={"FERRYMAN_POOL_TIMEOUT": "2", "FERRYMAN_AUTH": "keys"})
    session_path = ""
    try:
        server.start()
        async with client(server.url, key) as http:
            session_id = await new_session(http, "before")  # no worker: it stays queued
            session_path = f"/api/agent/{session_id}/events"
            for n in range(2):
                await post_message(http, session_id, f"replicated {n}")
            await asyncio.to_thread(cut_replication, pair)
            survived = (await http.get(f"/api/agent/{session_id}")).json()["lastSeq"]
            for n in range(3):
                await post_message(http, session_id, f"lost {n}")
            await new_session(http, "lost too")  # and an owner event
            seen = await read_stream(http, session_path, follow="false")
            lost_cursor = [e.id for e in seen if is_durable(e)][-1]
            assert int(lost_cursor) == survived + 3
            owner_cursor = (await http.get("/api/agent")).json()["cursor"]

            # A stream open through the failover, at the lost tail.
            open_stream: list[ServerSentEvent] = []

            async def stay_open() -> None:
                with contextlib.suppress(httpx.HTTPError):
                    async with sse(http, session_path, last_event_id=lost_cursor) as events:
                        async for event in events:
                            open_stream.append(event)

            kept = asyncio.create_task(stay_open())
            await wait_for(
                lambda: any(e.event == "caught_up" for e in open_stream), 10, "caught up"
            )
            await asyncio.to_thread(pair.primary.stop, "immediate")
            await asyncio.to_thread(pair.promote_standby)
            reused = [await post_message(http, session_id, f"after {n}") for n in range(5)]
            for n in range(2):
                await new_session(http, f"after {n}")
            assert reused[0] == survived + 1, "the promoted log gives the lost seqs out again"

            await asyncio.wait_for(kept, 30)  # it ends rather than skip the new events
            sent_after = [e for e in open_stream if is_durable(e) and int(e.id) > int(lost_cursor)]
            assert sent_after == [], f"a silent gap: {sent_after}"

            again = await read_stream(http, session_path, last_event_id=lost_cursor)
            assert [e.event for e in again] == ["resync_required"]
            assert again[0].json()["reason"] == "cursor_ahead"

            owner = await read_stream(http, "/api/agent/owner-events", last_event_id=owner_cursor)
            assert [e.event for e in owner] == ["resync_required"]

            # From a cursor that survived: the new events, with their new positions, no gap.
            resumed = await read_stream(
                http, session_path, last_event_id=str(survived), follow="false"
            )
            durable = [e for e in resumed if is_durable(e)]
            assert [e.json()["seq"] for e in durable] == reused
            assert [e.json()["data"]["text"] for e in durable] == [f"after {n}" for n in range(5)]
            assert all(int(e.id) > int(lost_cursor) for e in durable)
            assert resumed[-1].event == "caught_up"
            # The cursor it ends at resumes exactly there.
            tail = resumed[-1].json()["cursor"]
            assert tail == durable[-1].id
            assert [e.event for e in await read_stream(
                http, session_path, last_event_id=tail, follow="false"
            )] == ["caught_up"]  # fmt: skip
    finally:
        server.stop()
