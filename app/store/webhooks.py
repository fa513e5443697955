"""Webhook subscriptions and their outbox (docs/webhooks.md). The deliveries are written by
the triggers of migration 0019, in the transaction of the event they carry; here they are
listed, claimed and their attempts recorded.

A claim moves a delivery's `next_attempt_at` past the send's longest time (`hold`) in its own
short transaction, so a sender that dies mid-send leaves it due again for any other; each
attempt's outcome is recorded only if no later claim took the delivery since (`attempts`)."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

from psycopg.types.json import Jsonb

from app.db.pool import Connection
from app.domain import MAX_WEBHOOKS_PER_OWNER
from app.errors import WebhookLimitReached, WebhookNotFound
from app.store.sessions import SESSION_COLUMNS, PageKey
from app.store.statements import statement

# What a subscription shows: never its secret, which only `create` answers.
_VIEW_COLUMNS = "id, owner_id, url, events, created_at, updated_at"

_CREATE = statement(
    "create_webhook",
    f"""
    INSERT INTO webhooks (id, owner_id, url, events, secret)
    VALUES (%(id)s, %(owner)s, %(url)s, %(events)s, %(secret)s)
    RETURNING {_VIEW_COLUMNS}
    """,
)
_LIST = statement(
    "list_webhooks",
    f"""
    SELECT {_VIEW_COLUMNS} FROM webhooks WHERE owner_id = %s AND session_id IS NULL
    ORDER BY created_at DESC, id DESC
    """,
)
_GET = statement(
    "get_webhook", f"SELECT {_VIEW_COLUMNS} FROM webhooks WHERE id = %s AND owner_id = %s"
)
_UPDATE = statement(
    "update_webhook",
    f"""
    UPDATE webhooks SET url = coalesce(%(url)s, url), events = coalesce(%(events)s, events),
                        updated_at = clock_timestamp()
    WHERE id = %(id)s AND owner_id = %(owner)s AND session_id IS NULL
    RETURNING {_VIEW_COLUMNS}
    """,
)
_DELIVERIES = statement(
    "webhook_deliveries",
    """
    SELECT id, session_id, type, created_at, attempts, last_status, last_error,
           last_attempt_at, next_attempt_at, delivered_at, abandoned_at
    FROM webhook_deliveries
    WHERE webhook_id = %(id)s
      AND (%(after_ts)s::timestamptz IS NULL OR (created_at, id) < (%(after_ts)s, %(after_id)s))
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)
_CLAIM = statement(
    "claim_webhook_deliveries",
    """
    WITH due AS (
        SELECT id FROM webhook_deliveries
        WHERE delivered_at IS NULL AND abandoned_at IS NULL
          AND next_attempt_at <= clock_timestamp()
        ORDER BY next_attempt_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    UPDATE webhook_deliveries d
    SET attempts = d.attempts + 1, last_attempt_at = clock_timestamp(),
        next_attempt_at = clock_timestamp() + make_interval(secs => %(hold)s)
    FROM due, webhooks w
    WHERE d.id = due.id AND w.id = d.webhook_id
    RETURNING d.id, d.webhook_id, d.session_id, d.type, d.event, d.created_at, d.attempts,
              w.url, w.secret, w.run_start_seq
    """,
)
_SESSIONS = statement(
    "webhook_sessions", f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ANY(%s)"
)
# A failure is retried after `delay`, unless that is past the delivery's `max_age`: then it
# is abandoned.
_RECORD = statement(
    "record_webhook_attempt",
    """
    UPDATE webhook_deliveries
    SET last_status = %(status)s, last_error = %(error)s,
        delivered_at = CASE WHEN %(ok)s THEN clock_timestamp() END,
        abandoned_at = CASE
            WHEN NOT %(ok)s AND created_at + make_interval(secs => %(max_age)s)
                 < clock_timestamp() + make_interval(secs => %(delay)s)
            THEN clock_timestamp() END,
        next_attempt_at = clock_timestamp() + make_interval(secs => %(delay)s)
    WHERE id = %(id)s AND attempts = %(attempt)s
    """,
)
_PRUNE = statement(
    "prune_webhook_deliveries",
    """
    DELETE FROM webhook_deliveries
    WHERE coalesce(delivered_at, abandoned_at) < clock_timestamp() - make_interval(secs => %s)
    """,
)
# One-off webhooks done with: delivered (or abandoned) and pruned, or whose session was purged
# before its run ended.
_PRUNE_ONE_OFF = statement(
    "prune_one_off_webhooks",
    """
    DELETE FROM webhooks w
    WHERE w.session_id IS NOT NULL
      AND NOT EXISTS (SELECT FROM webhook_deliveries d WHERE d.webhook_id = w.id)
      AND (w.events = '{}' OR NOT EXISTS (SELECT FROM sessions s WHERE s.id = w.session_id))
    """,
)
_RUN_SECRET = statement(
    "run_webhook_secret",
    """
    WITH made AS (
        INSERT INTO webhook_run_secrets (owner_id, secret) VALUES (%(owner)s, %(secret)s)
        ON CONFLICT (owner_id) DO NOTHING
        RETURNING secret
    )
    SELECT secret FROM made
    UNION ALL SELECT secret FROM webhook_run_secrets WHERE owner_id = %(owner)s
    LIMIT 1
    """,
)
_ROTATE_RUN_SECRET = statement(
    "rotate_run_webhook_secret",
    """
    INSERT INTO webhook_run_secrets (owner_id, secret) VALUES (%(owner)s, %(secret)s)
    ON CONFLICT (owner_id) DO UPDATE
        SET secret = excluded.secret, created_at = clock_timestamp()
    RETURNING secret, created_at
    """,
)
_CREATE_ONE_OFF = statement(
    "create_one_off_webhook",
    """
    INSERT INTO webhooks (id, owner_id, url, events, secret, session_id, run_start_seq)
    VALUES (%(id)s, %(owner)s, %(url)s, '{session_end}', %(secret)s, %(session)s, %(seq)s)
    """,
)
# The end of the run a one-off webhook is made for, when it ended before the webhook existed.
_ENDED_SINCE = statement(
    "run_end_since",
    """
    SELECT seq, type, data, created_at FROM session_events
    WHERE session_id = %s AND type = 'session_end' AND seq > %s
    ORDER BY seq LIMIT 1
    """,
)
_DELIVER_ONCE = statement(
    "deliver_one_off_webhook",
    """
    WITH spent AS (
        UPDATE webhooks SET events = '{}' WHERE id = %(id)s AND events <> '{}' RETURNING id
    )
    INSERT INTO webhook_deliveries (webhook_id, session_id, type, event)
    SELECT spent.id, %(session)s, 'session_end', %(event)s FROM spent
    """,
)


async def create(
    conn: Connection, owner_id: str, url: str, events: list[str], secret: str
) -> dict[str, Any]:
    """A new subscription; WebhookLimitReached past MAX_WEBHOOKS_PER_OWNER."""
    # One owner's creates take turns, so two of them cannot both pass the count.
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('webhooks:' || %s))", (owner_id,))
    cur = await conn.execute(
        "SELECT count(*) AS n FROM webhooks WHERE owner_id = %s AND session_id IS NULL",
        (owner_id,),
    )
    counted = await cur.fetchone()
    assert counted is not None
    if counted["n"] >= MAX_WEBHOOKS_PER_OWNER:
        raise WebhookLimitReached(
            f"an owner has at most {MAX_WEBHOOKS_PER_OWNER} webhooks (MAX_WEBHOOKS_PER_OWNER)",
            limit=MAX_WEBHOOKS_PER_OWNER,
        )
    params = {"id": uuid4(), "owner": owner_id, "url": url, "events": events, "secret": secret}
    cur = await conn.execute(_CREATE, params)
    row = await cur.fetchone()
    assert row is not None
    return row


async def list_all(conn: Connection, owner_id: str) -> list[dict[str, Any]]:
    """The owner's subscriptions, newest first (at most MAX_WEBHOOKS_PER_OWNER)."""
    cur = await conn.execute(_LIST, (owner_id,))
    return await cur.fetchall()


async def get(conn: Connection, owner_id: str, webhook_id: UUID) -> dict[str, Any]:
    """The owner's subscription, or WebhookNotFound (also for another owner's)."""
    cur = await conn.execute(_GET, (webhook_id, owner_id))
    row = await cur.fetchone()
    if row is None:
        raise WebhookNotFound()
    return row


async def update(
    conn: Connection,
    owner_id: str,
    webhook_id: UUID,
    *,
    url: str | None,
    events: list[str] | None,
) -> dict[str, Any]:
    """The subscription with the fields given changed; pending deliveries go to the new URL."""
    params = {"id": webhook_id, "owner": owner_id, "url": url, "events": events}
    cur = await conn.execute(_UPDATE, params)
    row = await cur.fetchone()
    if row is None:
        raise WebhookNotFound()
    return row


async def delete(conn: Connection, owner_id: str, webhook_id: UUID) -> None:
    """Deletes the subscription and its deliveries, sent or not."""
    cur = await conn.execute(
        "DELETE FROM webhooks WHERE id = %s AND owner_id = %s", (webhook_id, owner_id)
    )
    if cur.rowcount == 0:
        raise WebhookNotFound()


async def deliveries(
    conn: Connection, owner_id: str, webhook_id: UUID, *, limit: int, after: PageKey | None
) -> tuple[list[dict[str, Any]], PageKey | None]:
    """A page of the subscription's deliveries, newest first, and the key of the next."""
    await get(conn, owner_id, webhook_id)
    params = {
        "id": webhook_id,
        "after_ts": after.created_at if after else None,
        "after_id": after.id if after else None,
        "limit": limit + 1,
    }
    cur = await conn.execute(_DELIVERIES, params)
    rows = await cur.fetchall()
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], PageKey(last["created_at"], last["id"])


async def claim(conn: Connection, *, limit: int, hold: float) -> list[dict[str, Any]]:
    """Up to `limit` due deliveries, each with its subscription's URL and secret, taken for
    `hold` seconds; another claimer skips them."""
    cur = await conn.execute(_CLAIM, {"limit": limit, "hold": hold})
    return await cur.fetchall()


async def sessions(conn: Connection, session_ids: list[UUID]) -> dict[UUID, dict[str, Any]]:
    """The rows of the sessions named (those that still exist), by id."""
    cur = await conn.execute(_SESSIONS, (session_ids,))
    return {row["id"]: row for row in await cur.fetchall()}


async def record(
    conn: Connection,
    delivery_id: UUID,
    attempt: int,
    *,
    status: int | None,
    error: str | None,
    ok: bool,
    delay: float,
    max_age: float,
) -> None:
    """An attempt's outcome; a failure is due again after `delay` seconds, or abandoned when
    that is past `max_age` seconds from the delivery's creation."""
    params = {
        "id": delivery_id,
        "attempt": attempt,
        "status": status,
        "error": error,
        "ok": ok,
        "delay": delay,
        "max_age": max_age,
    }
    await conn.execute(_RECORD, params)


async def prune(conn: Connection, older_than: float) -> int:
    """Deletes deliveries sent or abandoned more than `older_than` seconds ago, then the
    one-off webhooks done with."""
    cur = await conn.execute(_PRUNE, (older_than,))
    pruned = cur.rowcount
    await conn.execute(_PRUNE_ONE_OFF)
    return pruned


async def rotate_run_secret(conn: Connection, owner_id: str, secret: str) -> dict[str, Any]:
    """Make `secret` the one the owner's run webhooks are signed with from now on."""
    cur = await conn.execute(_ROTATE_RUN_SECRET, {"owner": owner_id, "secret": secret})
    row = await cur.fetchone()
    assert row is not None
    return row


async def create_one_off(
    conn: Connection, owner_id: str, session_id: UUID, start_seq: int, url: str, secret: str
) -> UUID:
    """A webhook delivered once, when the run of the session that opened at `start_seq`
    ends; signed with the owner's run secret (`secret` becomes it if the owner has none).

    The session's row is locked first: a run's end writes its `session_end` under that lock
    (the event's foreign key), so either the end comes after this commits, and the trigger
    delivers it, or it came before, and it is delivered here."""
    await conn.execute("SELECT FROM sessions WHERE id = %s FOR UPDATE", (session_id,))
    cur = await conn.execute(_RUN_SECRET, {"owner": owner_id, "secret": secret})
    found = await cur.fetchone()
    assert found is not None
    webhook_id = uuid4()
    params = {
        "id": webhook_id,
        "owner": owner_id,
        "url": url,
        "secret": found["secret"],
        "session": session_id,
        "seq": start_seq,
    }
    await conn.execute(_CREATE_ONE_OFF, params)
    cur = await conn.execute(_ENDED_SINCE, (session_id, start_seq))
    end = await cur.fetchone()
    if end is not None:
        event = {
            "seq": end["seq"],
            "type": end["type"],
            "data": end["data"],
            "createdAt": end["created_at"].isoformat(),
        }
        await conn.execute(
            _DELIVER_ONCE, {"id": webhook_id, "session": session_id, "event": Jsonb(event)}
        )
    return webhook_id
