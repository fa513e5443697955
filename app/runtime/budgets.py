"""A worker's side of the provider budgets (docs/budgets.md): a run takes a ticket before each
model call of a budgeted provider and gives it back when the call ends; the shared state is in
PostgreSQL (app/store/budgets.py). With no budget configured none of this runs: `key_for`
answers None and a call costs no statement.

While a run waits it holds no database connection and no connection to the provider: it
sleeps between tries, until the bucket has refilled or the pause is over, or (for a slot)
until a slot is freed (a NOTIFY that wakes every worker) or a poll interval has passed. One
run per budget and worker tries at a time (the others queue behind it in the worker), so a
thousand waiting runs cost each worker one statement per try, not a thousand. The slots this
worker holds are renewed every heartbeat interval for a lease TTL: a worker killed with its
calls going on stops renewing, and its slots are free again a TTL later."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID, uuid4

from prometheus_client import Counter

from app.budgets import Bucket, Budget, WaitReason, budget_key, refusal
from app.bus import Bus
from app.db.pool import Database
from app.store import budgets as budget_store
from app.store.notify import budget_slot_key

log = logging.getLogger(__name__)

BUDGET_WAITS = Counter(
    "ferryman_model_budget_waits_total",
    "Model calls that waited on a provider budget, by provider and reason",
    ["provider", "reason"],
)
# Seconds between a waiting run's tries for a slot when no slot was said to be freed (its
# notification lost, or a dead worker's slot expired), and the shortest sleep for a refill.
SLOT_POLL = 0.5
MIN_SLEEP = 0.01

OnWait = Callable[[WaitReason, float | None], Awaitable[None]]
Guard = Callable[[Awaitable[Any]], Awaitable[Any]]


@dataclass(frozen=True)
class Ticket:
    key: str
    budget: Budget
    holder: UUID
    slot: int | None


@dataclass
class _Gate:
    """One budget within one worker: who tries next, and a wake-up when a slot frees here."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    freed: asyncio.Event = field(default_factory=asyncio.Event)
    # The last refusal the trying run met, told to the runs that queue behind it.
    reason: WaitReason | None = None
    until: float | None = None
    # Set (and replaced) each time the reason changes, for the runs queued behind.
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def wake(self, _: str | None = None) -> None:
        self.freed.set()

    def tell(self, reason: WaitReason | None, until: float | None) -> None:
        if (reason, until) != (self.reason, self.until):
            self.reason, self.until = reason, until
            self.changed.set()
            self.changed = asyncio.Event()


class ProviderBudgets:
    def __init__(
        self,
        db: Database,
        bus: Bus | None,
        worker_id: str,
        budgets: Mapping[str, Budget],
        *,
        ttl: float,
        renew_interval: float,
    ) -> None:
        self.db = db
        self.bus = bus
        self._subscriptions = contextlib.ExitStack()
        self.worker_id = worker_id
        self.budgets = dict(budgets)
        self.ttl = ttl
        self.renew_interval = renew_interval
        self._gates = {key: _Gate() for key in self.budgets}
        self._held: set[UUID] = set()
        self._ensured: set[str] = set()
        self._renewer: asyncio.Task[None] | None = None

    def key_for(self, model: str) -> str | None:
        return budget_key(model, self.budgets) if self.budgets else None

    def start(self) -> None:
        if self.budgets and self._renewer is None:
            self._renewer = asyncio.create_task(self._renew(), name="budget-renew")
            for key, gate in self._gates.items():  # a slot freed in any worker wakes ours
                if self.bus is not None:
                    self._subscriptions.enter_context(
                        self.bus.subscribe(budget_slot_key(key), gate.wake)
                    )

    async def stop(self) -> None:
        self._subscriptions.close()
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None

    async def acquire(self, key: str, on_wait: OnWait, guard: Guard) -> Ticket:
        """A ticket for one call against budget `key`, once every limit admits it. `on_wait`
        is told the first time (and each time the reason changes) that the call must wait;
        `guard` runs each wait and each try (the run's `interruptible`: a cancel ends them),
        never `on_wait`, which writes."""
        budget = self.budgets[key]
        gate = self._gates[key]
        told = await self._enter(key, gate, on_wait, guard)
        try:
            while True:
                holder = uuid4()
                self._held.add(holder)
                try:
                    verdict = await guard(self._try(key, budget, holder))
                except BaseException:
                    self._held.discard(holder)  # a slot taken unbeknown expires in a TTL
                    raise
                if verdict.admitted:
                    gate.tell(None, None)
                    return Ticket(key, budget, holder, verdict.slot)
                self._held.discard(holder)
                reason, until, now = _why(verdict, budget)
                gate.tell(reason, until)
                if reason != told:
                    told = reason
                    await self._waiting(key, reason, until, on_wait)
                await guard(self._sleep(gate, reason, until, now))
        finally:
            gate.lock.release()

    async def _enter(
        self, key: str, gate: _Gate, on_wait: OnWait, guard: Guard
    ) -> WaitReason | None:
        """Take the budget's turn in this worker; while another run of ours has it, say what
        that run waits on (this one waits on the same), as it learns it. What was said."""
        told: WaitReason | None = None
        entering = asyncio.ensure_future(gate.lock.acquire())
        try:
            while not entering.done():
                if gate.reason is not None and gate.reason != told:
                    told = gate.reason
                    await self._waiting(key, told, gate.until, on_wait)
                    continue
                changed = asyncio.ensure_future(gate.changed.wait())
                try:
                    await guard(asyncio.wait({entering, changed}, return_when=FIRST_COMPLETED))
                finally:
                    changed.cancel()
        except BaseException:
            if entering.done() and not entering.cancelled() and entering.exception() is None:
                gate.lock.release()
            else:
                entering.cancel()
            raise
        return told

    async def release(
        self, ticket: Ticket, *, used_tokens: int = 0, pause: float | None = None
    ) -> None:
        """The call ended (`pause`: the provider asked for that many seconds' rest)."""
        self._held.discard(ticket.holder)
        self._gates[ticket.key].freed.set()
        if ticket.budget.tpm is None:
            used_tokens = 0  # counted nowhere
        if ticket.slot is None and not used_tokens and pause is None:
            return  # nothing to write: a budget of requests per minute alone
        async with self.db.connection() as conn:
            await budget_store.release(
                conn,
                ticket.key,
                ticket.budget,
                ticket.holder,
                ticket.slot,
                used_tokens=used_tokens,
                pause=pause,
            )

    async def _try(self, key: str, budget: Budget, holder: UUID) -> budget_store.Verdict:
        async with self.db.connection() as conn:
            if key not in self._ensured:
                await budget_store.ensure(conn, key, budget)
                self._ensured.add(key)
            return await budget_store.acquire(conn, key, budget, holder, self.worker_id, self.ttl)

    async def _waiting(
        self, key: str, reason: WaitReason, until: float | None, on_wait: OnWait
    ) -> None:
        BUDGET_WAITS.labels(key.partition(":")[0], reason).inc()
        log.info("model call waits on its budget", extra={"budget": key, "reason": reason})
        await on_wait(reason, until)

    async def _sleep(
        self, gate: _Gate, reason: WaitReason, until: float | None, now: float
    ) -> None:
        if reason == "concurrency":
            gate.freed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SLOT_POLL * (0.5 + random.random())):
                    await gate.freed.wait()
            return
        assert until is not None
        # A little jitter, so the workers that waited together do not all come back at once.
        await asyncio.sleep(max(until - now, MIN_SLEEP) + random.random() * 0.02)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.renew_interval)
            if not self._held:
                continue
            try:
                async with self.db.connection() as conn:
                    await budget_store.renew(conn, list(self._held), self.ttl)
            except Exception:  # the database away: the next beat tries again
                log.warning("renewing the provider budget slots failed", exc_info=True)


def _why(verdict: budget_store.Verdict, budget: Budget) -> tuple[WaitReason, float | None, float]:
    """The refusal's reason, until when (epoch seconds, None for a slot: no one knows), and
    the database's time of the try."""
    now = verdict.at.timestamp()
    paused = verdict.paused_until.timestamp() if verdict.paused_until is not None else None
    refused = refusal(Bucket(verdict.requests, verdict.tokens, now, paused), budget, now)
    if refused is not None:
        return refused[0], refused[1], now
    return "concurrency", None, now
