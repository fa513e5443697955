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

import psycopg
import pytest

from app.db import migrate
from tests.ha import AUTO_FAILOVER_EXTENSION, BIN, PG_AUTOCTL, AutoFailoverFormation, ReplicatedPair
from tests.support import (
    ServerProcess,
    WorkerProcess,
    client,
    create_owner_key,
    missing,
    new_session,
    stop_all,
)
from tests.test_db_restart import StreamLog, follow, wait_for

# Its servers are its own, whatever $DATABASE_URL says: CI runs it on one PostgreSQL only.
pytestmark = pytest.mark.once

SESSIONS = 20
SLEEP_SECONDS = 1
TURNS = 2
# As an HA tool would: it confirms the primary gone before it promotes.
PROMOTE_AFTER = float(os.environ.get("FAILOVER_PROMOTE_AFTER", "3"))
RECOVERY_BOUND = 60.0  # from the primary's loss to every session ended


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    if not (BIN / "pg_basebackup").exists():
        missing("PostgreSQL 15 server binaries", "apt-get install postgresql-15")
    pair = ReplicatedPair(synchronous=True)
    try:
        pair.start()
        yield pair
    finally:
        pair.close()


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
    owner_ids = owner_log.ids()
    assert owner_ids == list(range(expected_owner + 1, expected_owner + 1 + len(owner_ids))), (
        f"owner stream: {owner_ids}"
    )
