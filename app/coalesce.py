"""Many tasks' lookups in one query: what is asked while a query is in flight goes out together
in the next. At 2,000 session streams, every event woke 2,000 feeds that each took a pool
connection to read a few rows; they queued on the pool for seconds (and gave up after its
timeout). Coalesced, they are a handful of queries and never queue on the pool. A worker's run
writes go the same way, one transaction for many (`runtime/writes.py`).

Not aiodataloader: it batches by event-loop turn and starts every batch at once, so a busy
process still sends a query per turn and still queues on the pool; here at most `concurrency`
queries are in flight, and what arrives meanwhile waits for the next, however long it gets."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Coalescer(Generic[K, V]):
    """`get(key)` answers from `fetch(keys)`, which must answer every key it is given; it gets
    each distinct key once, at most `max_keys` of them."""

    def __init__(
        self,
        fetch: Callable[[list[K]], Awaitable[dict[K, V]]],
        *,
        max_keys: int = 200,
        concurrency: int = 2,
    ) -> None:
        self.fetch = fetch
        self.max_keys = max_keys
        self.concurrency = concurrency
        self.waiting: list[tuple[K, asyncio.Future[V]]] = []
        self.draining = 0  # drains running; each leaves (synchronously) once nothing waits
        self.drains: set[asyncio.Task[None]] = set()  # their tasks, kept from the collector

    async def get(self, key: K) -> V:
        # A future per caller, never shared: a caller that is cancelled cancels only its own.
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self.waiting.append((key, future))
        if self.draining < self.concurrency:
            self.draining += 1
            drain = asyncio.create_task(self._drain(), name="coalesced reads")
            self.drains.add(drain)
            drain.add_done_callback(self.drains.discard)
        return await future

    async def _drain(self) -> None:
        try:
            await self._fetch_all()
        finally:
            self.draining -= 1

    async def _fetch_all(self) -> None:
        while self.waiting:
            batch = [(k, f) for k, f in self.waiting[: self.max_keys] if not f.done()]
            del self.waiting[: self.max_keys]
            if not batch:
                continue
            try:
                found = await self.fetch(list(dict.fromkeys(key for key, _ in batch)))
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            except BaseException:  # cancelled (shutdown): so are its callers
                for _, future in batch:
                    future.cancel()
                raise
            for key, future in batch:
                if future.done():
                    continue
                if key in found:
                    future.set_result(found[key])
                else:  # a fetch that breaks its promise fails its callers, not the drain
                    future.set_exception(LookupError(f"{key!r} was not answered"))
