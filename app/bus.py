"""The event bus: one dedicated LISTEN connection per process, fanned out to in-process waiters.

It listens on the channels its process subscribes to keys of (`channel_of`): an API process
to the streams', a worker to the runs', a server with a worker inside to both.

A notification is only a wake-up carrying a feed key; whoever wakes re-reads the log by cursor.
After every reconnect every waiter is woken, because notifications sent while we were away are
lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator

import psycopg
from prometheus_client import Counter, Gauge

from app.backoff import Backoff
from app.store.notify import EPHEMERAL_SEPARATOR, channel_of, listen, probe

log = logging.getLogger(__name__)

NOTIFICATIONS = Counter("ferryman_bus_notifications_total", "NOTIFY messages received")
RECONNECTS = Counter("ferryman_bus_reconnects_total", "LISTEN connection (re)connects")
CONNECTED = Gauge("ferryman_bus_connected", "1 while the LISTEN connection is up")

# Called with None for a wake-up, or with the body of an ephemeral frame.
Waiter = Callable[[str | None], None]


class Bus:
    def __init__(
        self,
        url: str,
        channels: Collection[str],
        *,
        probe_interval: float = 5.0,
        min_backoff: float = 0.1,
        # One connection per process: retrying every second costs little and keeps the
        # window in which notifications are missed (and /readyz answers 503) short.
        max_backoff: float = 1.0,
    ) -> None:
        self.url = url
        self.channels = sorted(channels)
        self.probe_interval = probe_interval
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self._waiters: dict[str, set[Waiter]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="bus-listen")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.connected.clear()
        CONNECTED.set(0)

    @contextlib.contextmanager
    def subscribe(self, key: str, waiter: Waiter) -> Iterator[None]:
        """Call `waiter` (from the event loop) on each notification for `key` and on reconnect.

        Subscribe before reading the backlog, so nothing committed after the read goes unseen.
        """
        if channel_of(key) not in self.channels:
            raise ValueError(f"this bus does not listen on {channel_of(key)!r} (key {key!r})")
        self._waiters[key].add(waiter)
        try:
            yield
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[key]

    def _wake(self, key: str, body: str | None = None) -> None:
        for waiter in list(self._waiters.get(key, ())):
            waiter(body)

    def _wake_all(self) -> None:
        for key in list(self._waiters):
            self._wake(key)

    async def _run(self) -> None:
        backoff = Backoff(self.min_backoff, self.max_backoff)
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
                    for channel in self.channels:
                        await listen(conn, channel)
                    RECONNECTS.inc()
                    self.connected.set()
                    CONNECTED.set(1)
                    log.info("bus listening", extra={"channels": self.channels})
                    backoff.reset()
                    self._wake_all()
                    await self._listen(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: drop the connection and reconnect
                if self.connected.is_set():
                    log.warning("bus connection lost: %s", exc)
                self.connected.clear()
                CONNECTED.set(0)
                await backoff.wait()

    async def _listen(self, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
        while True:
            async for note in conn.notifies(timeout=self.probe_interval):
                NOTIFICATIONS.inc()
                for line in note.payload.split("\n"):
                    key, _, body = line.partition(EPHEMERAL_SEPARATOR)
                    self._wake(key, body or None)
            await probe(conn)  # a dead server is not always noticed by a blocked read
