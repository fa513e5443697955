"""Pure pieces of the SSE protocol: envelopes, frames, cursor parsing, resync decisions."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from app.domain import rfc3339
from app.errors import InvalidCursor

Phase = Literal["backlog", "live"]
# A cursor above this is not a cursor we could have issued (ids are PostgreSQL bigints).
MAX_CURSOR = 2**63 - 1

PING = b": ping\n\n"


def parse_cursor(raw: str | None) -> int | None:
    """A `Last-Event-ID` / `lastEventId` value: a non-negative decimal integer, or absent."""
    if raw is None or raw.strip() == "":
        return None
    text = raw.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 19 or int(text) > MAX_CURSOR:
        raise InvalidCursor(
            f"lastEventId must be a non-negative integer below 2^63, got {raw[:40]!r}"
        )
    return int(text)


@dataclass
class Event:
    """One durable event of a feed, serialized at most once per phase however many read it."""

    id: int
    type: str
    envelope: dict[str, Any]
    _frames: dict[str, bytes] = field(default_factory=dict, repr=False)

    def frame(self, phase: Phase) -> bytes:
        cached = self._frames.get(phase)
        if cached is None:
            body = json.dumps({**self.envelope, "phase": phase}, separators=(",", ":"))
            cached = sse_frame(self.type, body, str(self.id))
            self._frames[phase] = cached
        return cached


def owner_event(row: dict[str, Any]) -> Event:
    return Event(
        id=row["id"],
        type=row["type"],
        envelope={
            "id": str(row["id"]),
            "type": row["type"],
            "sessionId": str(row["session_id"]),
            "ownerId": row["owner_id"],
            "ts": rfc3339(row["created_at"]),
            "data": row["data"],
        },
    )


def session_event(row: dict[str, Any]) -> Event:
    return Event(
        id=row["seq"],
        type=row["type"],
        envelope=session_envelope(row),
    )


def session_envelope(row: dict[str, Any], phase: Phase | None = None) -> dict[str, Any]:
    envelope: dict[str, Any] = {
        "id": str(row["seq"]),
        "type": row["type"],
        "sessionId": str(row["session_id"]),
        "ownerId": row["owner_id"],
        "ts": rfc3339(row["created_at"]),
        "seq": row["seq"],
        "attempt": row["attempt"],
        "data": row["data"],
    }
    if phase is not None:
        envelope["phase"] = phase
    return envelope


def sse_frame(event: str, data: str, id_: str | None = None) -> bytes:
    """One SSE frame in the field order of SPEC section 4 (`id`, `event`, `data`).

    `data` is compact JSON, which never contains a line break, so one `data:` line suffices.
    """
    head = f"id: {id_}\n" if id_ is not None else ""
    return f"{head}event: {event}\ndata: {data}\n\n".encode()


def ephemeral_frame(body: str) -> bytes:
    """A frame from an ephemeral notification body `{"type": ..., ...envelope}`: no `id:`."""
    try:
        envelope = json.loads(body)
        event = str(envelope["type"])
    except (ValueError, KeyError, TypeError):
        return b""
    return sse_frame(event, json.dumps({**envelope, "phase": "live"}, separators=(",", ":")))


def control(event: str, data: dict[str, Any]) -> bytes:
    """A control frame: no `id:`, so it never moves a client's cursor."""
    return sse_frame(event, json.dumps(data, separators=(",", ":")))


def retry(ms: int) -> bytes:
    return f"retry: {ms}\n\n".encode()


ResyncReason = Literal["cursor_ahead", "too_far_behind", "expired"]


def resync_reason(
    cursor: int, last_id: int, first_retained: int | None, replay_limit: int | None
) -> ResyncReason | None:
    """Whether a reader at `cursor` can be served by replay, or must take a fresh snapshot."""
    if cursor > last_id:
        return "cursor_ahead"
    if cursor < last_id and first_retained is not None and cursor + 1 < first_retained:
        return "expired"
    if cursor < last_id and first_retained is None and last_id > 0:
        return "expired"
    if replay_limit is not None and last_id - cursor > replay_limit:
        return "too_far_behind"
    return None
