"""The scheduler: every worker looks for due schedules each FERRYMAN_SCHEDULE_POLL_INTERVAL and
fires them, each firing one transaction (store/schedules.py), so a tick fires once whatever
the number of workers, and a worker that dies mid-firing fires nothing (docs/schedules.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from app.backoff import Outage
from app.config import Settings
from app.cron import Cron, zone
from app.db.pool import UNAVAILABLE_ERRORS, Connection, Database
from app.domain import Overlap, Status, rfc3339
from app.store import schedules as schedule_store
from app.store import sessions as session_store

log = logging.getLogger(__name__)

# Schedules one poll fires at most; the rest wait for the next poll.
MAX_FIRINGS_PER_POLL = 100
# A failed firing's error, as its record keeps it.
_DETAIL_CHARS = 500


@dataclass(frozen=True)
class Due:
    """What a due schedule fires for: the latest tick at or before now, and how it was
    reached."""

    tick: datetime
    # Ticks before it were due too (the scheduler did not run then).
    skipped_earlier: bool
    # It was reached later than FERRYMAN_SCHEDULE_GRACE.
    late: bool

    @property
    def missed(self) -> bool:
        return self.skipped_earlier or self.late


def due_tick(cron: Cron, due: datetime, now: datetime, grace: float) -> Due:
    """The tick a schedule due at `due` fires for at `now`: the latest one (`due` itself when
    no later tick has come, or when `due` is not one of the expression's)."""
    latest = max(cron.latest_at(now), due)
    return Due(latest, latest > due, (now - latest).total_seconds() > grace)


async def run_scheduler(db: Database, settings: Settings, stopping: asyncio.Event) -> None:
    """Poll and fire until `stopping` is set."""
    outage = Outage(log, "the scheduler (the database)")
    while not stopping.is_set():
        try:
            await poll(db, settings)
            outage.recovered()
        except UNAVAILABLE_ERRORS as exc:
            outage.failed(exc)
        except Exception:
            # A bug must not end the task: every later tick would go unfired.
            log.exception("the scheduler's poll failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), settings.schedule_poll_interval)


async def poll(db: Database, settings: Settings) -> int:
    """Fire what is due now; how many schedules were handled."""
    handled = 0
    while handled < MAX_FIRINGS_PER_POLL and await _handle_one(db, settings):
        handled += 1
    return handled


async def _handle_one(db: Database, settings: Settings) -> bool:
    """Lock one due schedule and fire it, in one transaction; False when none is due. A
    firing that fails for another reason than the database being away is rolled back to a
    savepoint and recorded `failed`, and the schedule moves on to its next tick."""
    async with db.transaction() as conn:
        row = await schedule_store.lock_due(conn)
        if row is None:
            return False
        try:
            async with conn.transaction():
                await _fire_due(conn, row, settings)
        except UNAVAILABLE_ERRORS:
            raise
        except Exception as exc:
            log.exception("schedule %s: the firing failed", row["id"])
            await schedule_store.skip_failed(
                conn,
                row["id"],
                row["pending_tick"] or row["next_run_at"],
                _next_tick(row),
                str(exc)[:_DETAIL_CHARS],
            )
    return True


def _next_tick(row: dict[str, Any]) -> datetime | None:
    """The schedule's first tick after now; None when its cron no longer reads (a library
    upgrade that refuses it): the schedule is then paused rather than failed every poll."""
    try:
        return Cron(row["cron"], zone(row["timezone"])).next_after(row["now"])
    except Exception:
        log.exception("schedule %s: its cron no longer reads; paused", row["id"])
        return None


async def _fire_due(conn: Connection, row: dict[str, Any], settings: Settings) -> None:
    cron = Cron(row["cron"], zone(row["timezone"]))
    now: datetime = row["now"]
    pending: datetime | None = row["pending_tick"]
    last_session: UUID | None = row["last_session_id"]
    ended = row["last_status"] is None or Status(row["last_status"]) in schedule_store.ENDED
    if pending is not None and ended:
        last_session = await _fire(conn, row, pending, catch_up=False)
        pending, ended = None, False
    next_run_at: datetime | None = row["next_run_at"]
    if next_run_at is not None and next_run_at <= now:
        due = due_tick(cron, next_run_at, now, settings.schedule_grace)
        overlap = Overlap(row["overlap"])
        if due.late and not settings.schedule_catch_up:
            await schedule_store.record_firing(
                conn, row["id"], due.tick, "missed", detail="FERRYMAN_SCHEDULE_CATCH_UP=false"
            )
        elif ended or overlap is Overlap.ALLOW:
            catch_up = due.missed and settings.schedule_catch_up
            last_session = await _fire(conn, row, due.tick, catch_up=catch_up)
        elif overlap is Overlap.QUEUE and pending is None:
            pending = due.tick
            await schedule_store.record_firing(
                conn, row["id"], due.tick, "queued", detail=f"waits for session {last_session}"
            )
        else:
            why = "a queued firing already waits" if pending else "the last session has not ended"
            await schedule_store.record_firing(
                conn, row["id"], due.tick, "skipped", detail=f"{why} ({last_session})"
            )
        next_run_at = cron.next_after(now)
        if row["end_time"] is not None and next_run_at > row["end_time"]:
            next_run_at = None  # past its end time: it fires no more
    await schedule_store.advance(conn, row["id"], next_run_at, pending, last_session)


def fired_data(row: dict[str, Any], tick: datetime) -> dict[str, Any]:
    """What the message a bound schedule posts keeps of its firing: the schedule and tick,
    and for a cron the run metadata and strategy its create gave (the run it opens shows
    them)."""
    data: dict[str, Any] = {"schedule": {"id": str(row["id"]), "firedAt": rfc3339(tick)}}
    protocol = row["agent_protocol"] or {}
    if protocol.get("run_metadata"):
        data["runMetadata"] = protocol["run_metadata"]
    if protocol.get("multitask_strategy"):
        data["multitaskStrategy"] = protocol["multitask_strategy"]
    return data


async def _fire(conn: Connection, row: dict[str, Any], tick: datetime, *, catch_up: bool) -> UUID:
    """Create the schedule's session for `tick` (or post its prompt to the session it is bound
    to) and record the firing; the session's id."""
    if row["session_id"] is not None:
        await session_store.post_message(
            conn, row["owner_id"], row["session_id"], row["prompt"], extra=fired_data(row, tick)
        )
        session: dict[str, Any] = {"id": row["session_id"]}
    else:
        new = schedule_store.session_of(row, tick)
        session, _ = await session_store.create_session(conn, row["owner_id"], new, None)
    await schedule_store.record_firing(
        conn, row["id"], tick, "fired", catch_up=catch_up, session_id=session["id"]
    )
    log.info("schedule %s fired session %s for %s", row["id"], session["id"], tick.isoformat())
    session_id: UUID = session["id"]
    return session_id
