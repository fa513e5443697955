"""Appending to and reading the two logs: session events (per-session seq) and owner events
(per-owner cursor). Both allocate their numbers under a row lock held until commit, so numbers
are gap-free and commit in order."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from app.db.pool import Connection
from app.domain import check_owner_id
from app.errors import FenceRefused, SessionNotFound
from app.store.notify import (
    OWNER_KEY_PREFIX,
    SESSION_KEY_PREFIX,
    notify,
    notifying,
    owner_key,
    session_key,
)
from app.store.statements import statement

Cursor = psycopg.AsyncCursor[DictRow]


@dataclass(frozen=True)
class Fence:
    """The lease a run write must still hold: `(workerId, attempt)`, unexpired."""

    worker_id: str
    attempt: int

    def params(self) -> dict[str, Any]:
        """The parameters `FENCE` names."""
        return {"worker_id": self.worker_id, "attempt": self.attempt}


# The whole fence, in every statement a run writes with: the holder, its attempt, and a lease
# that has not run out (a holder frozen past its TTL writes nothing, even if no one claimed).
FENCE = (
    "lease_worker_id = %(worker_id)s AND attempt = %(attempt)s"
    " AND lease_expires_at > clock_timestamp()"
)
# The fence as a write's condition on the session row (`id`): true, or an error (SQLSTATE
# FENCE_REFUSED, migration 0007) that aborts the transaction. A run's transactions are
# pipelined, so a refused write that merely wrote nothing would let the ones queued after it
# commit.
FENCED = f"CASE WHEN {FENCE} THEN true ELSE ferryman_fence_refused(id) END"
# A class no PostgreSQL error uses: psycopg raises a plain DatabaseError for it.
FENCE_REFUSED = "LEASE"


@contextlib.contextmanager
def fence_errors() -> Iterator[None]:
    """Turn the database's refusal of a fenced write into FenceRefused (around a whole
    transaction: pipelined, the error comes at its end)."""
    try:
        yield
    except psycopg.Error as exc:
        if exc.sqlstate == FENCE_REFUSED:
            raise FenceRefused(str(exc.diag.message_primary)) from exc
        raise


def owner_event_ctes(rows: str, type_: str, data: str, order: str = "s.created_at, s.id") -> str:
    """Two CTEs, `owner_cursor` and `owner_appended`, that append an owner event for each row
    `s` of the CTE `rows` (columns `owner_id`, `id` the session, and what `order` orders the
    events of one owner by): of type `type_` with data `data` (SQL expressions over `s`), and
    notify each owner's stream. Each owner's cursor moves once, by its count, so its row is
    locked once per statement; cursors are locked in owner order, so two statements writing
    several owners cannot deadlock."""
    return f"""
    owner_cursor AS (
        INSERT INTO owner_cursors AS c (owner_id, last_id)
        SELECT owner_id, count(*) FROM {rows} GROUP BY owner_id ORDER BY owner_id
        ON CONFLICT (owner_id) DO UPDATE SET last_id = c.last_id + excluded.last_id
        RETURNING owner_id, last_id, {notifying(f"'{OWNER_KEY_PREFIX}' || c.owner_id")} AS notified
    ), owner_appended AS (
        INSERT INTO owner_events (owner_id, id, session_id, type, data)
        SELECT s.owner_id,
               c.last_id - count(*) OVER owner
                   + row_number() OVER (owner ORDER BY {order}),
               s.id, {type_}, {data}
        FROM {rows} s JOIN owner_cursor c ON c.owner_id = s.owner_id
        WINDOW owner AS (PARTITION BY s.owner_id)
        RETURNING id
    )"""


_APPEND_SESSION_EVENT = statement(
    "append_session_event",
    f"""
    WITH bumped AS (
        UPDATE sessions SET last_seq = last_seq + 1, updated_at = clock_timestamp()
        WHERE id = %(session_id)s
        RETURNING last_seq, attempt, owner_id
    ), appended AS (
        INSERT INTO session_events (session_id, seq, attempt, type, data)
        SELECT %(session_id)s, last_seq, attempt, %(type)s, %(data)s FROM bumped
        RETURNING session_id, seq, attempt, type, data, created_at,
            (SELECT owner_id FROM bumped) AS owner_id
    )
    SELECT * FROM appended WHERE {notifying("%(notify_key)s")}
    """,
)


async def append_session_event(
    conn: Connection, session_id: UUID, type_: str, data: dict[str, Any]
) -> dict[str, Any]:
    """Append one event that is not a run's (unfenced; a run's go through `run_writes.send_batch`)
    and return it; SessionNotFound if there is no such session.

    The seq comes from `sessions.last_seq`, bumped under the session row lock in the same
    statement; the stream's notification goes in it too.
    """
    cur = await conn.execute(
        _APPEND_SESSION_EVENT,
        {
            "session_id": session_id,
            "type": type_,
            "data": Jsonb(data),
            "notify_key": session_key(session_id),
        },
    )
    row = await cur.fetchone()
    if row is None:
        raise SessionNotFound()
    return row


_APPEND_OWNER_EVENT = statement(
    "append_owner_event",
    f"""
    WITH event AS (
        SELECT %(owner)s::text AS owner_id, %(session_id)s::uuid AS id,
               clock_timestamp() AS created_at
    ), {owner_event_ctes("event", "%(type)s", "%(data)s")}
    SELECT id FROM owner_appended
    """,
)


async def append_owner_event(
    conn: Connection, owner_id: str, session_id: UUID, type_: str, data: dict[str, Any]
) -> int:
    """Append an owner event; its id."""
    cur = await conn.execute(
        _APPEND_OWNER_EVENT,
        {
            "owner": check_owner_id(owner_id),
            "session_id": session_id,
            "type": type_,
            "data": Jsonb(data),
        },
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row["id"])


# A page of a log: after a cursor, at most `limit` rows, and with `max_bytes` only the rows
# whose preceding ones sum to less than that many bytes of data (so at least one, and the one
# that crosses the bound is the last). Sizes are the logs' generated `size` columns.
_PAGE = """
    SELECT {columns}, page.size FROM (
        SELECT log.*, sum(log.size) OVER (ORDER BY log.{order}) AS upto FROM {table} log
        WHERE log.{key} = %(key)s AND log.{order} > %(after)s ORDER BY log.{order} LIMIT %(limit)s
    ) page {join}
    WHERE %(max_bytes)s::bigint IS NULL OR page.upto - page.size < %(max_bytes)s
    ORDER BY page.{order}
"""
_SESSION_PAGE = statement(
    "session_page",
    _PAGE.format(
        columns="page.session_id, page.seq, page.attempt, page.type, page.data, page.created_at,"
        " page.epoch, s.owner_id, s.deleted_at IS NOT NULL AS deleted",
        table="session_events",
        key="session_id",
        order="seq",
        join="JOIN sessions s ON s.id = page.session_id",
    ),
)


async def read_session_events(
    conn: Connection, session_id: UUID, after: int, limit: int, max_bytes: int | None = None
) -> list[dict[str, Any]]:
    """Events after seq `after`: at most `limit`, and with `max_bytes` only as many as fit in
    that many bytes of event data (always at least one), so no read holds a session's whole
    log in memory however big its events are."""
    params = {"key": session_id, "after": after, "limit": limit, "max_bytes": max_bytes}
    return await (await conn.execute(_SESSION_PAGE, params)).fetchall()


# Pages of several logs in one statement: each wanted (key, after, max_bytes) bounded as `_PAGE`
# bounds one. A key with nothing after its cursor still gives one row (its page's columns NULL):
# for a session, it says whether the session was deleted.
#
# `after_epoch` is the epoch of the row at the cursor (NULL when there is none): a reader that
# finds it is not the epoch of the event it last sent knows the log was rewound under it
# (`app/streams/feed.py` LogRewound).
_PAGES = """
    SELECT want.key AS want_key, want.after, want.max_bytes, {columns}, page.size,
        (SELECT at.epoch FROM {table} at WHERE at.{key} = want.key AND at.{order} = want.after)
            AS after_epoch
    FROM unnest(%(keys)s::{key_type}[], %(afters)s::bigint[], %(max_bytes)s::bigint[])
        AS want(key, after, max_bytes)
    {join}
    LEFT JOIN LATERAL (
        SELECT log.*, sum(log.size) OVER (ORDER BY log.{order}) AS upto FROM {table} log
        WHERE log.{key} = want.key AND log.{order} > want.after
        ORDER BY log.{order} LIMIT %(limit)s
    ) page ON true
    WHERE page.{order} IS NULL OR page.upto - page.size < want.max_bytes
    ORDER BY want.key, want.after, want.max_bytes, page.{order}
"""
_SESSION_PAGES = statement(
    "session_pages",
    _PAGES.format(
        columns="want.key AS session_id, page.seq, page.attempt, page.type, page.data,"
        " page.created_at, page.epoch, s.owner_id, s.deleted_at IS NOT NULL AS deleted",
        key_type="uuid",
        join="JOIN sessions s ON s.id = want.key",
        table="session_events",
        key="session_id",
        order="seq",
    ),
)
_OWNER_PAGES = statement(
    "owner_pages",
    _PAGES.format(
        columns="want.key AS owner_id, page.id, page.session_id, page.type, page.data,"
        " page.created_at, page.epoch, false AS deleted",
        key_type="text",
        join="",
        table="owner_events",
        key="owner_id",
        order="id",
    ),
)

# A wanted page: (session id or owner id, after, max bytes).
PageWant = tuple[Any, int, int]
# A page's rows, whether its log's subject is gone, and the epoch of the row at its cursor
# (None when there is none).
PageRows = tuple[list[dict[str, Any]], bool, int | None]
Pages = dict[PageWant, PageRows]


async def read_session_pages(conn: Connection, wants: list[PageWant], limit: int) -> Pages:
    """For each wanted page (distinct), its rows as `read_session_events` reads them and
    whether the session is gone (deleted, or no longer there)."""
    return await _read_pages(conn, _SESSION_PAGES, "seq", wants, limit)


async def read_owner_pages(conn: Connection, wants: list[PageWant], limit: int) -> Pages:
    """For each wanted page (distinct), its rows bounded as `read_session_events` bounds a
    session's page (an owner's log is never gone)."""
    pages = await _read_pages(conn, _OWNER_PAGES, "id", wants, limit)
    return {want: (rows, False, epoch) for want, (rows, _, epoch) in pages.items()}


async def _read_pages(
    conn: Connection, query: str, order: str, wants: list[PageWant], limit: int
) -> Pages:
    params = {
        "keys": [want[0] for want in wants],
        "afters": [want[1] for want in wants],
        "max_bytes": [want[2] for want in wants],
        "limit": limit,
    }
    pages: Pages = {want: ([], True, None) for want in wants}
    for row in await (await conn.execute(query, params)).fetchall():
        want = (row["want_key"], row["after"], row["max_bytes"])
        rows = pages[want][0]
        if row[order] is not None:
            rows.append(row)
        pages[want] = (rows, bool(row["deleted"]), row["after_epoch"])
    return pages


async def session_event_pages(
    conn: Connection, session_id: UUID, last_seq: int, *, limit: int, max_bytes: int
) -> AsyncIterator[list[dict[str, Any]]]:
    """A session's log up to `last_seq`, page by page (each bounded as `read_session_events`
    bounds it); the caller read `last_seq` in the same transaction, so no read finds nothing."""
    after = 0
    while after < last_seq:
        rows = await read_session_events(conn, session_id, after, limit, max_bytes)
        if not rows:
            return
        yield rows
        after = int(rows[-1]["seq"])


@dataclass(frozen=True)
class LogBounds:
    """What a reader resuming at event `at` of a log checks its cursor against: the last event
    committed and its epoch, the oldest retained (owner logs), and the epoch of the event at
    `at` (None when the log holds none: `at` 0, past the end, or removed)."""

    last: int
    last_epoch: int
    first_retained: int | None
    epoch_at: int | None


async def owner_feed_bounds(conn: Connection, owner_id: str, at: int = 0) -> LogBounds:
    """The owner's log's bounds for a reader resuming at id `at`."""
    cur = await conn.execute(
        """
        SELECT c.last_id,
               (SELECT e.epoch FROM owner_events e WHERE e.owner_id = %(o)s AND e.id = c.last_id)
                   AS last_epoch,
               (SELECT min(id) FROM owner_events WHERE owner_id = %(o)s) AS first_id,
               (SELECT e.epoch FROM owner_events e WHERE e.owner_id = %(o)s AND e.id = %(at)s)
                   AS epoch_at
        FROM (SELECT coalesce((SELECT last_id FROM owner_cursors WHERE owner_id = %(o)s), 0)
              AS last_id) c
        """,
        {"o": owner_id, "at": at},
    )
    row = await cur.fetchone()
    assert row is not None
    return LogBounds(int(row["last_id"]), row["last_epoch"] or 0, row["first_id"], row["epoch_at"])


async def session_log_epochs(
    conn: Connection, session_id: UUID, at: int, last: int
) -> tuple[int | None, int]:
    """(epoch of the session's event `at` or None, epoch of its event `last` or 0): whether a
    reader resuming at `at` saw the event the log now holds there."""
    cur = await conn.execute(
        """
        SELECT (SELECT epoch FROM session_events WHERE session_id = %(s)s AND seq = %(at)s)
                   AS epoch_at,
               (SELECT epoch FROM session_events WHERE session_id = %(s)s AND seq = %(last)s)
                   AS last_epoch
        """,
        {"s": session_id, "at": at, "last": last},
    )
    row = await cur.fetchone()
    assert row is not None
    return row["epoch_at"], row["last_epoch"] or 0


async def owner_head(conn: Connection, owner_id: str) -> int:
    cur = await conn.execute("SELECT last_id FROM owner_cursors WHERE owner_id = %s", (owner_id,))
    row = await cur.fetchone()
    return int(row["last_id"]) if row else 0


async def feed_heads(
    conn: Connection, keys: list[str], marker: str | None = None
) -> dict[str, tuple[int, bool]]:
    """(newest id, gone) of the feeds named by their notification keys (`session_key`,
    `owner_key`), in one statement per kind: what the streams' fallback poll reads. A session
    that no longer exists is gone. With `marker` (`marker_key`), the reads' transaction also
    sends it, after every notification of the writes they saw (commit order)."""
    if marker is None:
        return await _feed_heads(conn, keys)
    async with conn.transaction():
        heads = await _feed_heads(conn, keys)
        await notify(conn, marker)
    return heads


async def _feed_heads(conn: Connection, keys: list[str]) -> dict[str, tuple[int, bool]]:
    sessions = [
        key.removeprefix(SESSION_KEY_PREFIX) for key in keys if key.startswith(SESSION_KEY_PREFIX)
    ]
    owners = [
        key.removeprefix(OWNER_KEY_PREFIX) for key in keys if key.startswith(OWNER_KEY_PREFIX)
    ]
    heads: dict[str, tuple[int, bool]] = {}
    if sessions:
        cur = await conn.execute(
            "SELECT id, last_seq, deleted_at IS NOT NULL AS deleted FROM sessions"
            " WHERE id = ANY(%s::uuid[])",
            (sessions,),
        )
        for row in await cur.fetchall():
            heads[session_key(row["id"])] = (int(row["last_seq"]), bool(row["deleted"]))
        for session_id in sessions:
            heads.setdefault(session_key(session_id), (0, True))
    if owners:
        cur = await conn.execute(
            "SELECT owner_id, last_id FROM owner_cursors WHERE owner_id = ANY(%s)", (owners,)
        )
        for row in await cur.fetchall():
            heads[owner_key(row["owner_id"])] = (int(row["last_id"]), False)
    return heads
