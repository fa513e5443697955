"""Ferryman behind PgBouncer in transaction mode, as many hosted PostgreSQL services run it.

Real `ferryman serve` and `ferryman worker` processes get DATABASE_URL through Debian's pgbouncer
(tests/pgbouncer.py: transaction pooling, 5 server connections) and FERRYMAN_DIRECT_DATABASE_URL
straight to PostgreSQL. The suite's end-to-end paths run there: create, run to the end, both
streams with a Last-Event-ID reconnect (nothing missing, nothing repeated), a worker SIGKILLed
mid-tool and the session resumed by another with its dangling call repaired. Then, on every
server connection PgBouncer holds, no server-side prepared statement exists (psycopg's default
`prepare_threshold` would have left some: a statement prepared in one client's transaction is
unknown to the next client's), and LISTEN and the liveness locks are on direct connections.

The fallback poll of the streams is 30 s, and the streams must see the run end (and the crashed
run resumed) far sooner: they were woken by LISTEN/NOTIFY.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from app.store.liveness import WORKER_LOCK_NAMESPACE
from tests.pgbouncer import POOL_SIZE, PgBouncer, pgbouncer, require_pgbouncer
from tests.support import (
    CONTROL_EVENTS,
    WORKER_ENV,
    ServerProcess,
    WorkerProcess,
    client,
    create_owner_key,
    fresh_database,
    ready,
    server_url,
    sse,
    stop_all,
    transcript,
)
from tests.test_recovery import RESUME_BOUND, check_log, kill_and_resume, workers

pytestmark = pytest.mark.once


@pytest.fixture(scope="module")
def bouncer() -> Iterator[PgBouncer]:
    require_pgbouncer()
    with pgbouncer(server_url()) as running:
        yield running


@pytest.fixture(scope="module")
def direct_db(bouncer: PgBouncer) -> Iterator[str]:
    with fresh_database("ferryman_pgbouncer") as url:
        yield url


@pytest.fixture(scope="module")
def pooled_db(bouncer: PgBouncer, direct_db: str) -> str:
    return bouncer.url(direct_db)


def direct_env(direct_db: str) -> dict[str, str]:
    return {"FERRYMAN_DIRECT_DATABASE_URL": direct_db, "FERRYMAN_POLL_INTERVAL": "30"}


@pytest.fixture(scope="module")
def api(pooled_db: str, direct_db: str) -> Iterator[ServerProcess]:
    env = {**direct_env(direct_db), "FERRYMAN_AUTH": "keys"}
    server = ServerProcess(pooled_db, env=env).start()
    yield server
    server.stop()


# --- checks ----------------------------------------------------------------------------------


def db_name(url: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])


def server_pids(bouncer: PgBouncer, direct_db: str) -> set[int]:
    """Backend pids of PgBouncer's server connections to the test database."""
    servers = bouncer.show("SERVERS")
    return {int(row["remote_pid"]) for row in servers if row["database"] == db_name(direct_db)}


def prepared_statements_per_server(bouncer: PgBouncer, pooled_db: str) -> dict[int, int]:
    """{backend pid: server-side prepared statements} for each of PgBouncer's server
    connections (pg_prepared_statements shows only its own backend's): POOL_SIZE clients each
    hold a transaction at once, so each is on a server connection of its own."""
    conns = [psycopg.connect(pooled_db, prepare_threshold=None) for _ in range(POOL_SIZE)]
    try:
        found: dict[int, int] = {}
        for conn in conns:  # not autocommit: each holds its server until the rollback
            row = conn.execute(
                "SELECT pg_backend_pid(), (SELECT count(*) FROM pg_prepared_statements)"
            ).fetchone()
            assert row is not None
            found[int(row[0])] = int(row[1])
        return found
    finally:
        for conn in conns:
            conn.close()


def check_no_prepared_statements(
    bouncer: PgBouncer, pooled_db: str, direct_db: str, *processes: WorkerProcess | ServerProcess
) -> None:
    before = server_pids(bouncer, direct_db)
    assert before, "nothing went through PgBouncer"
    found = prepared_statements_per_server(bouncer, pooled_db)
    # Every server connection that served the processes was looked at.
    assert before <= set(found), (before, found)
    assert all(n == 0 for n in found.values()), f"server-side prepared statements: {found}"
    for process in processes:
        assert "prepared statement" not in process.logs(tail=None), process.logs()


def check_session_state_is_direct(
    bouncer: PgBouncer, direct_db: str, processes: int, workers: int, timeout: float = 10
) -> None:
    """The only connections that bypass PgBouncer are each process's LISTEN connection and each
    worker's heartbeat (holding its liveness lock) and death watch; the pools go through it.
    (A worker opens its death watch's connection just after it says it started: wait.)"""
    deadline = time.monotonic() + timeout
    while True:
        with psycopg.connect(direct_db, autocommit=True, row_factory=dict_row) as conn:
            backends = conn.execute(
                "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).fetchall()
            locks = conn.execute(
                "SELECT l.pid FROM pg_locks l JOIN workers w ON l.objid = w.lock_key::oid"
                " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2"
                " AND l.classid = %s::oid AND l.mode = 'ExclusiveLock'"
                " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND w.stopped_at IS NULL",
                (WORKER_LOCK_NAMESPACE,),
            ).fetchall()
        pooled = server_pids(bouncer, direct_db)  # after: PgBouncer's servers only add up
        direct = [row for row in backends if row["pid"] not in pooled]
        try:
            assert len(direct) == processes + 2 * workers, (direct, pooled)
            assert len(locks) == workers, locks
            assert {row["pid"] for row in locks} <= {row["pid"] for row in direct}
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


# --- streams ---------------------------------------------------------------------------------


async def read_with_reconnect(
    http: httpx.AsyncClient,
    path: str,
    done: Callable[[dict[str, Any]], bool],
    *,
    first: int,
    last_event_id: str | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """Durable envelopes of a stream until `done`: the first `first` on one connection, the
    rest on a second that resumes from the last id seen (Last-Event-ID). Also returns it."""
    got: list[dict[str, Any]] = []
    for connection in range(2):
        async with sse(http, path, last_event_id=last_event_id) as events:
            async for event in events:
                if event.event in CONTROL_EVENTS or not event.id:
                    continue
                envelope = json.loads(event.data)
                assert envelope["id"] == event.id
                got.append(envelope)
                last_event_id = event.id
                if done(envelope) or (connection == 0 and len(got) >= first):
                    break
        if got and done(got[-1]):
            break
    assert last_event_id is not None
    return got, last_event_id


# --- tests -----------------------------------------------------------------------------------


async def test_create_run_and_both_streams(
    bouncer: PgBouncer, pooled_db: str, direct_db: str, api: ServerProcess
) -> None:
    _, key = create_owner_key(direct_db)
    worker = WorkerProcess(pooled_db, env={**WORKER_ENV, **direct_env(direct_db)}).start()
    try:
        await ready(worker)
        check_session_state_is_direct(bouncer, direct_db, processes=2, workers=1)
        async with client(api.url, key) as http:
            script = [
                {"toolCalls": [{"name": "put_note", "arguments": {"key": "k", "text": "v"}}]},
                {"text": "a streamed answer " * 4, "chunks": 8, "delayMs": 1500},
            ]
            response = await http.post("/api/agent", json={"prompt": "hi", "script": script})
            assert response.status_code == 201, response.text
            session_id = response.json()["id"]

            def session_ended(envelope: dict[str, Any]) -> bool:
                return envelope["type"] == "session_end"

            def owner_ended(envelope: dict[str, Any]) -> bool:
                return (
                    envelope["sessionId"] == session_id
                    and envelope["type"] == "session_status"
                    and envelope["data"]["status"] in ("succeeded", "failed")
                )

            # Well within the 30 s fallback poll: the streams were woken by NOTIFY.
            async with asyncio.timeout(20):
                (session_events, _), (owner_events, _) = await asyncio.gather(
                    read_with_reconnect(
                        http, f"/api/agent/{session_id}/events", session_ended, first=3
                    ),
                    read_with_reconnect(
                        http, "/api/agent/owner-events", owner_ended, first=2, last_event_id="0"
                    ),
                )
            log = await transcript(http, session_id)
            session = (await http.get(f"/api/agent/{session_id}")).json()
        assert session["status"] == "succeeded", session
        # The session stream: every event once, in order, as the transcript has them.
        assert [int(e["id"]) for e in session_events] == list(range(1, session["lastSeq"] + 1))
        assert [(e["type"], e["data"]) for e in session_events] == [
            (e["type"], e["data"]) for e in log
        ]
        types = [e["type"] for e in session_events]
        assert types[:2] == ["user_message", "session_start"] and types[-1] == "session_end"
        assert "tool_result" in types
        # The owner stream: a fresh owner's feed from its start, each id once, in order.
        owner_ids = [int(e["id"]) for e in owner_events]
        assert owner_ids == list(range(1, len(owner_ids) + 1)), owner_ids
        assert owner_events[0]["type"] == "session_created"
        assert [e["data"]["status"] for e in owner_events if e["type"] == "session_status"] == [
            "running",
            "succeeded",
        ]
        check_no_prepared_statements(bouncer, pooled_db, direct_db, api, worker)
        # This server sets no statement_timeout for autocommit statements: each process says so.
        with psycopg.connect(direct_db) as conn:
            row = conn.execute("SELECT current_setting('statement_timeout')").fetchone()
        if row == ("0",):
            for process in (api, worker):
                assert "statements in autocommit have no statement_timeout" in process.logs(
                    tail=None
                )
    finally:
        stop_all([worker])


async def test_crash_mid_tool_and_resume(
    bouncer: PgBouncer, pooled_db: str, direct_db: str, api: ServerProcess
) -> None:
    _, key = create_owner_key(direct_db)
    script = [
        {
            "toolCalls": [
                {"name": "put_note", "arguments": {"key": "plan", "text": "step one"}},
                {"name": "sleep", "arguments": {"seconds": 3}},
            ]
        },
        {"text": "finished"},
    ]

    def in_sleep(watch: Any) -> bool:
        return any(
            e["type"] == "tool_call_start" and e["data"]["name"] == "sleep"
            for e in watch.envelopes()
        )

    with workers(pooled_db, size=3, **direct_env(direct_db)) as pool:
        check_session_state_is_direct(bouncer, direct_db, processes=4, workers=3)
        clients = [c for c in bouncer.show("CLIENTS") if c["database"] == db_name(direct_db)]
        # More clients than server connections: they share them.
        assert len(clients) > POOL_SIZE, clients
        async with client(api.url, key) as http:
            session_id, _, owner_watch, took = await kill_and_resume(
                pool, http, script, in_sleep, "kill during a tool, through PgBouncer"
            )
        assert took < RESUME_BOUND, f"kill -> session_resumed took {took:.2f}s"
        (resumed,) = check_log(direct_db, session_id, owner_watch)
        with psycopg.connect(direct_db, row_factory=dict_row) as conn:
            sleep_call = conn.execute(
                "SELECT data->>'toolCallId' AS id FROM session_events WHERE session_id = %s"
                " AND type = 'tool_call_start' AND data->>'name' = 'sleep' ORDER BY seq LIMIT 1",
                (session_id,),
            ).fetchone()
        assert sleep_call is not None
        assert resumed["data"]["repairedToolCalls"] == [sleep_call["id"]]
        check_no_prepared_statements(bouncer, pooled_db, direct_db, api, *pool.alive, *pool.dead)


async def test_limits_are_set_per_transaction(pooled_db: str, direct_db: str) -> None:
    """Behind the pooler the pool's limits come with each transaction's BEGIN (SET LOCAL), not
    with the connection; nothing of them is left on the server connection afterwards."""
    from app.db.pool import Database, SessionLimits

    db = Database(
        pooled_db, direct_url=direct_db, min_size=1, max_size=1, limits=SessionLimits(0.3, 0.3, 5)
    )
    assert db.pooled
    await db.pool.open(wait=True)
    try:
        async with db.transaction() as conn:
            # Still the transaction's first statement as far as isolation goes.
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            cur = await conn.execute(
                "SELECT current_setting('statement_timeout') AS s,"
                " current_setting('lock_timeout') AS l,"
                " current_setting('idle_in_transaction_session_timeout') AS i,"
                " current_setting('transaction_isolation') AS iso"
            )
            assert await cur.fetchone() == {
                "s": "300ms",
                "l": "300ms",
                "i": "5s",
                "iso": "repeatable read",
            }
            async with conn.transaction():  # a savepoint
                await conn.execute("SELECT 1")
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            async with db.transaction() as conn:
                await conn.execute("SELECT pg_sleep(5)")
        assert time.monotonic() - started < 2
        # Rolled back and given back clean: the next transaction works, and outside one the
        # server's defaults hold.
        async with db.transaction() as conn:
            await conn.execute("SELECT 1")
        async with db.connection() as conn:
            cur = await conn.execute("SELECT current_setting('lock_timeout') AS l")
            assert await cur.fetchone() == {"l": "0"}
    finally:
        await db.close()
