"""Database limits under a hostile or unlucky neighbour: a lock held from outside makes requests
answer 503 within the pool timeout instead of hanging, /readyz tells "busy" from "down", and
/metrics is guarded in keys mode. Real servers, a real PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import psycopg
import pytest

from tests.support import (
    ServerProcess,
    assert_problem,
    client,
    create_owner_key,
    create_session,
    running,
)

LIMITS = {
    "FERRYMAN_DB_LOCK_TIMEOUT": "0.5",
    "FERRYMAN_POOL_TIMEOUT": "2",
    "FERRYMAN_POOL_MAX_SIZE": "4",
}


@pytest.fixture(scope="module")
def limited(isolated_db: str) -> Iterator[ServerProcess]:
    with running(ServerProcess(isolated_db, env=LIMITS)) as server:
        yield server


def lock(url: str, table: str) -> psycopg.Connection[tuple[object, ...]]:
    """An outside connection holding ACCESS EXCLUSIVE on `table` until it is closed."""
    conn = psycopg.connect(url)
    conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    return conn


async def test_a_held_lock_answers_503_in_time(limited: ServerProcess, isolated_db: str) -> None:
    async with client(limited.url) as http:
        session = await create_session(http, "before the lock")
        held = lock(isolated_db, "sessions")
        try:
            started = time.monotonic()
            answers = await asyncio.gather(
                *(http.get("/api/agent") for _ in range(6)),
                *(http.post("/api/agent", json={"prompt": "x"}) for _ in range(6)),
                *(http.get(f"/api/agent/{session['id']}") for _ in range(6)),
            )
            took = time.monotonic() - started
        finally:
            held.close()
        for answer in answers:
            assert_problem(answer, 503, "DATABASE_UNAVAILABLE")
            assert answer.headers["retry-after"] == "1"
        # Each waited at most a lock timeout for its lock, or the pool timeout for a connection.
        assert took < 2 + 0.5 + 1.5, took
        # The lock gone, the same requests succeed: nothing was left holding a connection.
        assert (await http.get("/api/agent")).status_code == 200
        assert (await http.post("/api/agent", json={"prompt": "after"})).status_code == 201


async def test_readyz_tells_busy_from_down(limited: ServerProcess, isolated_db: str) -> None:
    async with client(limited.url) as http:
        assert (await http.get("/readyz")).status_code == 200
        held = lock(isolated_db, "alembic_version")
        try:
            busy = await http.get("/readyz")
        finally:
            held.close()
        body = assert_problem(busy, 503, "NOT_READY")
        assert body["checks"]["database"] == "busy"
        assert body["checks"]["listen"] == "ok"
        assert (await http.get("/readyz")).status_code == 200


async def test_a_runaway_statement_is_stopped(isolated_db: str) -> None:
    """statement_timeout is set on every pooled connection."""
    from app.db.pool import Database, SessionLimits

    db = Database(isolated_db, min_size=1, max_size=1, limits=SessionLimits(0.3, 0.3, 5))
    await db.pool.open(wait=True)
    try:
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            async with db.connection() as conn:
                await conn.execute("SELECT pg_sleep(5)")
        assert time.monotonic() - started < 2
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT current_setting('lock_timeout') AS l,"
                " current_setting('idle_in_transaction_session_timeout') AS i"
            )
            assert await cur.fetchone() == {"l": "300ms", "i": "5s"}
    finally:
        await db.close()


async def test_metrics_want_the_metrics_token_in_keys_mode(isolated_db: str) -> None:
    """/metrics shows every owner's counts: with no FERRYMAN_METRICS_TOKEN set, no tenant's key
    reads them (403 METRICS_TOKEN_REQUIRED, naming the setting), whatever it sends."""
    _, key = create_owner_key(isolated_db)
    with running(ServerProcess(isolated_db, env={"FERRYMAN_AUTH": "keys"})) as keyed:
        async with client(keyed.url) as http:
            for bearer in ("", "Bearer fm_nope", f"Bearer {key}"):
                refused = await http.get("/metrics", headers={"Authorization": bearer})
                assert_problem(refused, 403, "METRICS_TOKEN_REQUIRED")
                assert "FERRYMAN_METRICS_TOKEN" in refused.json()["detail"]
                assert "ferryman_" not in refused.text
            # The API's description stays public.
            assert (await http.get("/openapi.json")).status_code == 200
            assert (await http.get("/docs")).status_code == 200


async def test_a_metrics_token_is_the_only_way_in_when_set(isolated_db: str) -> None:
    _, key = create_owner_key(isolated_db)
    env = {"FERRYMAN_AUTH": "keys", "FERRYMAN_METRICS_TOKEN": "scrape-me"}
    with running(ServerProcess(isolated_db, env=env)) as keyed:
        async with client(keyed.url) as http:
            assert_problem(await http.get("/metrics"), 401, "AUTH_REQUIRED")
            with_key = await http.get("/metrics", headers={"Authorization": f"Bearer {key}"})
            assert_problem(with_key, 401, "INVALID_API_KEY")
            scraper = await http.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
            assert scraper.status_code == 200


async def test_behind_a_pooler_the_pool_keeps_no_session_state() -> None:
    """A direct URL that differs from the pool's marks the pool's as a transaction-mode pooler:
    no prepared statements, no `options` (PgBouncer refuses it), the limits with each BEGIN.
    (tests/test_pgbouncer.py runs it all through a real PgBouncer.)"""
    from app.db.pool import Database, SessionLimits

    limits = SessionLimits(10, 3, 30)
    direct = Database("postgresql://db.example/app", limits=limits)
    assert not direct.pooled and direct.direct_url == "postgresql://db.example/app"
    assert direct.pool.kwargs["options"] == (
        "-c statement_timeout=10000 -c lock_timeout=3000"
        " -c idle_in_transaction_session_timeout=30000"
    )
    assert "prepare_threshold" not in direct.pool.kwargs
    same = Database("postgresql://db.example/app", direct_url="postgresql://db.example/app")
    assert not same.pooled
    pooled = Database(
        "postgresql://pooler.example:6432/app",
        direct_url="postgresql://db.example/app",
        limits=limits,
    )
    assert pooled.pooled and pooled.direct_url == "postgresql://db.example/app"
    assert pooled.pool.kwargs["prepare_threshold"] is None
    assert "options" not in pooled.pool.kwargs
    # One query, so one round trip, as a bare BEGIN.
    assert limits.begin() == (
        "BEGIN; SET LOCAL statement_timeout = 10000; SET LOCAL lock_timeout = 3000;"
        " SET LOCAL idle_in_transaction_session_timeout = 30000"
    )


async def test_a_pipelined_transaction_behind_a_pooler_has_the_limits(isolated_db: str) -> None:
    """`Database.pipeline` sets the limits for its transaction alone, as `transaction` does
    behind a pooler (here a second URL of the same database stands for the pooler's)."""
    from app.db.pool import Database, SessionLimits

    pooler = psycopg.conninfo.make_conninfo(isolated_db, application_name="pooled")
    db = Database(
        pooler, direct_url=isolated_db, min_size=1, max_size=1, limits=SessionLimits(7, 2, 9)
    )
    await db.pool.open(wait=True)
    try:
        async with db.pipeline() as conn:
            inside = await conn.execute(
                "SELECT current_setting('statement_timeout') AS s,"
                " current_setting('lock_timeout') AS l"
            )
        assert await inside.fetchone() == {"s": "7s", "l": "2s"}
        async with db.connection() as conn:  # the same server connection, outside it
            cur = await conn.execute("SELECT current_setting('statement_timeout') AS s")
            assert await cur.fetchone() == {"s": "0"}
    finally:
        await db.close()
