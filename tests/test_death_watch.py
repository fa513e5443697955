"""The death watch (app/runtime/watcher.py) with real `ferryman worker` processes: a worker
killed with SIGKILL is reaped by its peer at once, with no claim poll to help; and no live
worker keeps a statement open that holds a snapshot (one would keep every row version deleted
meanwhile in the whole database, as the watch's old blocking wait on the peer's lock did)."""

from __future__ import annotations

import asyncio
import signal
import time

from tests.support import StartWorker, live_workers, query, ready

# No claim poll to speak of: only the death watch can reap the killed worker in time.
QUIET = {"FERRYMAN_CLAIM_INTERVAL": "60"}


async def test_a_killed_worker_is_reaped_by_its_peer_at_once(
    isolated_db: str, start_worker: StartWorker
) -> None:
    survivor, victim = start_worker(QUIET), start_worker(QUIET)
    await ready(survivor, victim)
    await asyncio.sleep(1.0)  # each has chosen its peer
    assert len(await live_workers(isolated_db)) == 2
    victim.signal(signal.SIGKILL)
    killed = time.monotonic()
    while len(await live_workers(isolated_db)) > 1:
        assert time.monotonic() - killed < 2.0, survivor.logs()
        await asyncio.sleep(0.02)
    assert "workers died" in survivor.logs()


async def test_live_workers_hold_no_snapshot(isolated_db: str, start_worker: StartWorker) -> None:
    workers = start_worker(QUIET), start_worker(QUIET)
    await ready(*workers)
    await asyncio.sleep(1.5)
    held = await query(
        isolated_db,
        "SELECT pid, state, query FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND backend_xmin IS NOT NULL AND query_start < clock_timestamp() - interval '1 second'",
    )
    assert held == []
