"""Provider budgets (docs/budgets.md): each budget's row (`provider_budgets`: its request and
token buckets, its pause) and its concurrency slots (`provider_slots`), shared by every worker.

`acquire` is one statement: it locks the budget row (so every acquire of a key is serialized),
refills its buckets as app/budgets.py does, takes a free slot (FOR UPDATE SKIP LOCKED, the
claim's pattern: a slot another worker took since the statement began is re-checked and
skipped), and takes one request from the bucket only when every limit admits the call. A slot
is held until `expires_at`: its worker renews it with its heartbeat and frees it when the call
ends, and a worker that died stops renewing, so the slot frees itself a lease TTL later.
Times come from the database's clock, the same for every worker."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from app.budgets import Budget
from app.db.pool import Connection
from app.store.notify import RUNS_CHANNEL, notifying

_ENSURE = """
WITH b AS (
    INSERT INTO provider_budgets (key) VALUES (%(key)s) ON CONFLICT (key) DO NOTHING
)
INSERT INTO provider_slots (key, n)
SELECT %(key)s, n FROM generate_series(0, coalesce(%(slots)s::int, 0) - 1) AS n
ON CONFLICT (key, n) DO NOTHING
"""

# The buckets refilled at the statement's clock: up by a minute's worth per minute, up to it.
_ACQUIRE = """
WITH b AS (
    SELECT key, paused_until, clock_timestamp() AS at,
        CASE WHEN %(rpm)s::float8 IS NULL THEN 'Infinity'::float8
             ELSE least(%(rpm)s::float8, requests + %(rpm)s::float8 / 60 * greatest(0,
                 extract(epoch FROM clock_timestamp() - refilled_at)::float8)) END AS requests,
        CASE WHEN %(tpm)s::float8 IS NULL THEN 'Infinity'::float8
             ELSE least(%(tpm)s::float8, tokens + %(tpm)s::float8 / 60 * greatest(0,
                 extract(epoch FROM clock_timestamp() - refilled_at)::float8)) END AS tokens
    FROM provider_budgets WHERE key = %(key)s
    FOR UPDATE
),
free AS (
    SELECT n FROM provider_slots
    WHERE key = %(key)s AND n < %(slots)s::int AND expires_at <= clock_timestamp()
    ORDER BY n LIMIT 1
    FOR UPDATE SKIP LOCKED
),
admitted AS (
    UPDATE provider_budgets p
    SET requests = CASE WHEN %(rpm)s::int IS NULL THEN p.requests ELSE b.requests - 1 END,
        tokens = CASE WHEN %(tpm)s::int IS NULL THEN p.tokens ELSE b.tokens END,
        refilled_at = b.at
    FROM b
    WHERE p.key = b.key
      AND (b.paused_until IS NULL OR b.paused_until <= b.at)
      AND b.requests >= 1 AND b.tokens > 0
      AND (%(slots)s::int IS NULL OR EXISTS (SELECT FROM free))
    RETURNING p.key
),
slot AS (
    UPDATE provider_slots s
    SET holder = %(holder)s, worker_id = %(worker)s,
        expires_at = clock_timestamp() + make_interval(secs => %(ttl)s)
    FROM free
    WHERE s.key = %(key)s AND s.n = free.n AND EXISTS (SELECT FROM admitted)
    RETURNING s.n
)
SELECT EXISTS (SELECT FROM admitted) AS admitted, (SELECT n FROM slot) AS slot,
    EXISTS (SELECT FROM free) AS slot_free, b.requests, b.tokens, b.paused_until, b.at
FROM b
"""

# The slot freed wakes the runs waiting for one, in every worker (`budget_slot_key`).
_RELEASE = f"""
WITH freed AS (
    UPDATE provider_slots SET expires_at = '-infinity', holder = NULL, worker_id = NULL
    WHERE key = %(key)s AND n = %(slot)s AND holder = %(holder)s
      AND {notifying("'b:' || key", RUNS_CHANNEL)}
)
UPDATE provider_budgets
SET tokens = CASE WHEN %(tpm)s::float8 IS NULL THEN tokens
        ELSE least(%(tpm)s::float8, tokens + %(tpm)s::float8 / 60 * greatest(0,
            extract(epoch FROM clock_timestamp() - refilled_at)::float8)) - %(used)s END,
    requests = CASE WHEN %(rpm)s::float8 IS NULL THEN requests
        ELSE least(%(rpm)s::float8, requests + %(rpm)s::float8 / 60 * greatest(0,
            extract(epoch FROM clock_timestamp() - refilled_at)::float8)) END,
    refilled_at = greatest(refilled_at, clock_timestamp()),
    paused_until = CASE WHEN %(pause)s::float8 IS NULL THEN paused_until
        ELSE greatest(paused_until, clock_timestamp() + make_interval(secs => %(pause)s)) END
WHERE key = %(key)s AND (%(used)s > 0 OR %(pause)s::float8 IS NOT NULL)
"""


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    slot: int | None  # the slot taken (None: the budget has no concurrency limit, or refused)
    slot_free: bool  # whether a slot was free (False only for a budget with a limit)
    requests: float  # the refilled buckets at `at`
    tokens: float
    paused_until: datetime | None
    at: datetime


async def ensure(conn: Connection, key: str, budget: Budget) -> None:
    """The budget's row and its slots, made once (by whichever worker comes first)."""
    await conn.execute(_ENSURE, {"key": key, "slots": budget.max_concurrent})


async def acquire(
    conn: Connection, key: str, budget: Budget, holder: UUID, worker_id: str, ttl: float
) -> Verdict:
    cur = await conn.execute(
        _ACQUIRE,
        {
            "key": key,
            "slots": budget.max_concurrent,
            "rpm": budget.rpm,
            "tpm": budget.tpm,
            "holder": holder,
            "worker": worker_id,
            "ttl": ttl,
        },
    )
    row = await cur.fetchone()
    if row is None:
        raise LookupError(f"no provider budget {key!r}: ensure() makes it")
    return Verdict(
        bool(row["admitted"]),
        row["slot"],
        bool(row["slot_free"]) or budget.max_concurrent is None,
        float(row["requests"]),
        float(row["tokens"]),
        row["paused_until"],
        row["at"],
    )


async def release(
    conn: Connection,
    key: str,
    budget: Budget,
    holder: UUID,
    slot: int | None,
    *,
    used_tokens: int = 0,
    pause: float | None = None,
) -> None:
    """A call ended: its slot freed, its tokens spent, and the provider paused for `pause`
    seconds when it asked for a wait (a later pause already set is kept)."""
    await conn.execute(
        _RELEASE,
        {
            "key": key,
            "slot": slot,
            "holder": holder,
            "rpm": budget.rpm,
            "tpm": budget.tpm,
            "used": used_tokens,
            "pause": pause,
        },
    )


async def renew(conn: Connection, holders: list[UUID], ttl: float) -> None:
    """The slots of the calls still going on hold for `ttl` seconds more."""
    await conn.execute(
        "UPDATE provider_slots SET expires_at = clock_timestamp() + make_interval(secs => %s)"
        " WHERE holder = ANY(%s) AND expires_at > clock_timestamp()",
        (ttl, holders),
    )
