"""The API's session creates, sent together (group commit): the creates requests ask for while a
statement of creates is in flight go out in the next, all in one statement, which is its own
transaction (`session_store.create_sessions`).

Every create of an owner moves that owner's cursor row (`session_created`) and its claim clock
(`owner_queues`, a queued session's `claim_key`), and holds both row locks until its commit:
that is what keeps owner event ids gap-free and in commit order. One at a time, a transaction
each, an owner's creates queued behind those rows for four round trips and a commit each
(`bench.create_throughput`: 135-180 creates/s at 32 in flight, p50 140-200 ms). Together, the
rows are locked once a transaction, and the more creates wait, the more each one carries, as
the workers' run writes do (`app/runtime/writes.py`)."""

from __future__ import annotations

from typing import Any

import psycopg

from app.coalesce import Coalescer
from app.db.pool import Database
from app.store import sessions as session_store
from app.store.sessions import ApiCreate, NewSession

# A created session's row; None: its Idempotency-Key was taken before; or why the create failed.
Outcome = dict[str, Any] | None | Exception


class SessionCreates:
    """`create(...)` returns the new session's row once it has committed, None when its
    Idempotency-Key was taken before (by a create committed earlier, or by one before it in the
    same statement), or raises the database's error. At most `concurrency` statements are in
    flight, each with at most `max_creates` creates. When a statement of several fails for one
    create's data, each of its creates is sent again alone: one request's trouble is not the
    others'. When it fails for the database's sake (a lock or statement timeout, a lost
    connection), each of its requests gets that error (503), as each alone would have, after
    one wait instead of one each.

    A request cancelled while its create waits or is in flight (its client went away) may
    still have its session created, as a request cancelled between the commit and its answer
    always could: a retry with the same Idempotency-Key finds it."""

    def __init__(self, db: Database, *, max_creates: int = 64, concurrency: int = 2) -> None:
        self.db = db
        self.coalescer: Coalescer[ApiCreate, Outcome] = Coalescer(
            self._send_all, max_keys=max_creates, concurrency=concurrency
        )

    async def create(
        self, owner_id: str, new: NewSession, idempotency_key: str | None
    ) -> dict[str, Any] | None:
        outcome = await self.coalescer.get(ApiCreate(owner_id, new, idempotency_key))
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def _send_all(self, creates: list[ApiCreate]) -> dict[ApiCreate, Outcome]:
        if len(creates) > 1:
            try:
                return await self._send(creates)
            except psycopg.OperationalError as failed:
                # The database's trouble (a lock or statement timeout, a lost connection) would
                # be each one's again, a timeout's wait each: the batch's answer is theirs.
                return dict.fromkeys(creates, failed)
            except psycopg.Error:
                pass  # one create's error (its data): each alone, so that the others commit
        outcomes: dict[ApiCreate, Outcome] = {}
        for create in creates:
            try:
                outcomes.update(await self._send([create]))
            except psycopg.Error as failed:
                outcomes[create] = failed
        return outcomes

    async def _send(self, creates: list[ApiCreate]) -> dict[ApiCreate, Outcome]:
        # In owner order, so two statements in flight lock owners' rows in the same order and
        # cannot deadlock; each owner's creates in the order they were asked for.
        ordered = sorted(creates, key=lambda c: c.owner_id)
        async with self.db.connection() as conn:
            rows = await session_store.create_sessions(conn, ordered)
        return dict(zip(ordered, rows, strict=True))
