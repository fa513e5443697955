"""Heartbeats from their own thread and event loop, so a busy worker loop cannot starve them.

The heartbeat connection also holds the worker's liveness lock: if the process dies, the server
drops the connection and the lock with it, and other workers take its sessions at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from collections.abc import Callable
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from app.backoff import Backoff, Outage
from app.db.pool import MAX_RECONNECT_DELAY
from app.store import liveness

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    def __init__(
        self,
        url: str,
        worker_id: str,
        *,
        interval: float,
        ttl: float,
        held: Callable[[], list[UUID]],
        on_beat: Callable[[dict[UUID, bool], list[UUID]], None],
        on_disconnect: Callable[[], None],
    ) -> None:
        super().__init__(name=f"heartbeat {worker_id}", daemon=True)
        self.url = url
        self.worker_id = worker_id
        self.interval = interval
        self.ttl = ttl
        self.held = held
        self.on_beat = on_beat
        self.on_disconnect = on_disconnect
        self.registered = threading.Event()
        # Not `_stop`: that would shadow threading.Thread._stop, which join() calls.
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        # Capped low: until it registers again the worker claims nothing.
        backoff = Backoff(cap=MAX_RECONNECT_DELAY)
        outage = Outage(log, "heartbeat connection")
        while not self._stopping.is_set():
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, row_factory=dict_row
                ) as conn:
                    await liveness.register_worker(
                        conn, self.worker_id, os.getpid(), socket.gethostname()
                    )
                    self.registered.set()
                    backoff.reset()
                    outage.recovered()
                    await self._beat(conn)
                    await liveness.mark_worker_stopped(conn, self.worker_id)
                    return
            except Exception as exc:
                # Without this connection our leases cannot be proven: give them all up.
                outage.failed(exc)
                self.on_disconnect()
                await backoff.wait()

    async def _beat(self, conn: psycopg.AsyncConnection[dict[str, object]]) -> None:
        while not self._stopping.is_set():
            held = self.held()
            still_held = await liveness.heartbeat(conn, self.worker_id, self.ttl, held)
            lost = [session_id for session_id in held if session_id not in still_held]
            self.on_beat(still_held, lost)
            await asyncio.to_thread(self._stopping.wait, self.interval)
