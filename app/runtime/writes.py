"""A worker's run writes, sent together (group commit): what runs ask to write while a write is
in flight goes out in the next, in one transaction.

Each write that announces something (a tool's start, a run's end) moves its owner's cursor row,
which it locks until its commit: that is what keeps owner event ids gap-free and in commit order.
One owner's sessions wrote one at a time behind that row, and under CPU load a holder waiting
for a core kept all of them waiting (`bench.compare` with three busy loops on the machine: 429
sessions/s fell to 169, while DBOS, with no such row, held its rate). Together, the row is
locked once a transaction, and the more runs wait, the more each transaction carries."""

from __future__ import annotations

from typing import Any

import psycopg

from app.coalesce import Coalescer
from app.db.pool import Database
from app.errors import FenceRefused
from app.store.events import fence_errors
from app.store.run_writes import Write, send_writes

# A written row (`send_batch`'s), or why the write failed (FenceRefused: its lease was gone).
Outcome = dict[str, Any] | None | Exception


class RunWrites:
    """`send(write)` returns the write's row once it has committed, and raises FenceRefused if
    its lease was gone, or the database's error. At most `concurrency` transactions are in
    flight, each with at most `max_writes` writes. When a transaction of several fails (a lease
    gone, a lock timeout, a lost connection), each of its writes is sent again alone: one run's
    trouble is not the others'."""

    def __init__(self, db: Database, *, max_writes: int = 32, concurrency: int = 2) -> None:
        self.db = db
        self.coalescer: Coalescer[Write, Outcome] = Coalescer(
            self._send_all, max_keys=max_writes, concurrency=concurrency
        )

    async def send(self, write: Write) -> dict[str, Any] | None:
        outcome = await self.coalescer.get(write)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def _send_all(self, writes: list[Write]) -> dict[Write, Outcome]:
        if len(writes) > 1:
            try:
                with fence_errors():
                    async with self.db.pipeline() as conn:
                        sent = await send_writes(conn, writes)
                return {
                    write: await cur.fetchone() for write, cur in zip(writes, sent, strict=True)
                }
            except (FenceRefused, psycopg.Error):
                pass  # each alone, so that the others commit
        return {write: await self._send_one(write) for write in writes}

    async def _send_one(self, write: Write) -> Outcome:
        """One write in one statement, so no transaction around it."""
        try:
            with fence_errors():
                async with self.db.connection() as conn:
                    return await (await write.send(conn)).fetchone()
        except (FenceRefused, psycopg.Error) as failed:
            return failed
