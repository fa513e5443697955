"""Pure pieces of the SSE protocol: envelopes, frames, cursor parsing, resync decisions."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple
from uuid import UUID

from app.domain import SessionEventType, position, rfc3339
from app.errors import InvalidCursor
from app.store.notify import delta_envelope, delta_head, parse_ephemeral

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
            f"lastEventId must be a non-negative integer below 2^63, got {_as_sent(raw)[:40]!r}"
        )
    return int(text)


# The largest chunk number a session cursor's fraction may carry (the column is an integer).
MAX_CURSOR_CHUNK = 2**31 - 1


def split_chunk(raw: str | None) -> tuple[str | None, int]:
    """A session stream's `Last-Event-ID` / `lastEventId` in its two parts: `<seq>` (a durable
    event) or `<seq>.<chunk>` (event seq, and the chunks 1..chunk of the turn open at it, as the
    id of a token delta frame says). The integer part is returned as it came, for
    `parse_cursor`; the chunk is 0 without a fraction."""
    if raw is None or "." not in raw:
        return raw, 0
    whole, _, fraction = raw.strip().partition(".")
    if (
        not fraction.isascii()
        or not fraction.isdigit()
        or len(fraction) > 10
        or int(fraction) > MAX_CURSOR_CHUNK
        or not whole
    ):
        raise InvalidCursor(
            "lastEventId must be <id> or <id>.<chunk> (non-negative decimal integers),"
            f" got {_as_sent(raw)[:40]!r}"
        )
    return whole, int(fraction)


def _as_sent(raw: str) -> str:
    """A header's text as the client wrote it: HTTP servers decode header bytes as Latin-1, so
    UTF-8 text arrives garbled (a full-width digit as three Latin-1 characters). Query values
    are decoded right already."""
    try:
        return raw.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return raw


@dataclass(frozen=True)
class Event:
    """One durable event of a feed, serialized once however many streams send it, in either
    phase: `live` is its whole live frame, the same bytes for every stream of the feed (the
    common case sends it as is; a backlog frame swaps the constant tail). It keeps no parsed
    copy of its data: a feed's memory is its frames."""

    id: int  # its number in the log: the feed's cursors count these
    type: str
    live: bytes = field(repr=False)
    epoch: int = 0  # of the log it was written in (`domain.position`)

    @classmethod
    def of(cls, id_: int, type_: str, envelope: dict[str, Any], epoch: int = 0) -> Event:
        """`envelope["id"]` is its position (`domain.position`), the `id:` of its frame."""
        body = _json(envelope)
        lead = _frame_head(type_, envelope["id"]) + _utf8(body[:-1])
        return cls(id_, type_, lead + _PHASE_TAILS["live"], epoch)

    def frame(self, phase: Phase) -> bytes:
        if phase == "live":
            return self.live
        return self.live[:_LIVE_CUT] + _PHASE_TAILS[phase]

    @property
    def size(self) -> int:
        """Bytes of its frame, what a feed's buffer and a write count."""
        return len(self.live) + _TAIL_EXTRA


_PHASE_TAILS: dict[Phase, bytes] = {
    phase: f',"phase":"{phase}"}}\n\n'.encode() for phase in ("backlog", "live")
}
_LIVE_CUT = -len(_PHASE_TAILS["live"])
# The longest frame of an event (its backlog one) is this much longer than its live one.
_TAIL_EXTRA = max(len(tail) for tail in _PHASE_TAILS.values()) - len(_PHASE_TAILS["live"])


def _json(value: dict[str, Any]) -> str:
    """Compact JSON that carries text as UTF-8, not \\u escapes (an emoji is 4 bytes on the
    wire, not 12); it still escapes line breaks, so it fits on one `data:` line."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _utf8(text: str) -> bytes:
    """UTF-8, with a lone surrogate (which JSON text from a NOTIFY payload may hold) written as
    the `\\udXXX` escape that ensure_ascii would have written: it can only sit inside a JSON
    string, where that escape means the same."""
    return text.encode("utf-8", "backslashreplace")


def writes(frames: Iterable[bytes], limit: int) -> Iterator[bytes]:
    """Consecutive frames joined into writes of at most `limit` bytes; a frame bigger than that
    is a write of its own. Lazy: frames are taken one at a time, so no more than one write and
    the frame after it are ever held."""
    pending: list[bytes] = []
    size = 0
    for frame in frames:
        if pending and size + len(frame) > limit:
            yield b"".join(pending)
            pending, size = [], 0
        pending.append(frame)
        size += len(frame)
    if pending:
        yield b"".join(pending)


def event_writes(events: Iterable[Event], phase: Phase, limit: int) -> Iterator[bytes]:
    """The frames of `events` in `phase`, in writes of at most `limit` bytes (see `writes`)."""
    return writes((event.frame(phase) for event in events), limit)


def owner_event(row: dict[str, Any]) -> Event:
    epoch = row.get("epoch", 0)
    envelope = {
        "id": str(position(epoch, row["id"])),
        "type": row["type"],
        "sessionId": str(row["session_id"]),
        "ownerId": row["owner_id"],
        "ts": rfc3339(row["created_at"]),
        "data": row["data"],
    }
    return Event.of(row["id"], row["type"], envelope, epoch)


def session_event(row: dict[str, Any]) -> Event:
    return Event.of(row["seq"], row["type"], session_envelope(row), row.get("epoch", 0))


def session_envelope(row: dict[str, Any], phase: Phase | None = None) -> dict[str, Any]:
    envelope: dict[str, Any] = {
        "id": str(position(row.get("epoch", 0), row["seq"])),
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
    return _frame_head(event, id_) + _utf8(data) + b"\n\n"


def _frame_head(event: str, id_: str | None) -> bytes:
    head = f"id: {id_}\n" if id_ is not None else ""
    return f"{head}event: {event}\ndata: ".encode()


@dataclass(frozen=True)
class Ephemeral:
    """A frame that is not logged (a token delta), and the id of the durable event it follows:
    a stream sends it after that event and before the next one. `chunk`: its number among the
    deltas that follow that event (0: unnumbered), also in its `id: <after>.<chunk>`."""

    after: int
    frame: bytes
    chunk: int = 0

    @property
    def size(self) -> int:
        return len(self.frame)

    def sent_at(self, cursor: int) -> bytes:
        """Its frame for a stream whose last event sent is `cursor`. A delta sent after an
        event later than the one it follows (another writer's, such as a user message, logged
        while the turn streams) takes `<cursor>.<chunk>` as its id, so that a client's cursor
        never goes back to before an event it has seen: chunk k of the turn open at `cursor`."""
        if self.after >= cursor or not self.chunk:
            return self.frame
        return f"id: {cursor}.{self.chunk}\n".encode() + self.frame.partition(b"\n")[2]


def ephemeral_frame(body: str) -> Ephemeral:
    """A frame from an ephemeral notification's body (`ephemeral_body`): its envelope as it
    came, unparsed, and `id: <afterSeq>.<chunk>` when it is numbered (else no `id:`)."""
    parsed = parse_ephemeral(body)
    if parsed is None:
        return Ephemeral(0, b"")
    after, chunk, event, envelope = parsed
    return Ephemeral(after, sse_frame(event, envelope, _chunk_id(after, chunk)), chunk)


def _chunk_id(after: int, chunk: int) -> str | None:
    return f"{after}.{chunk}" if chunk else None


def stored_delta(
    row: dict[str, Any], session_id: UUID | str, owner_id: str, phase: Phase
) -> Ephemeral:
    """The `message_delta` frame of a stored chunk (app/store/deltas.py: `after_seq`, `chunk`,
    `text`, `created_at`), byte for byte the live one but for its `phase`."""
    after, chunk = int(row["after_seq"]), int(row["chunk"])
    envelope = delta_envelope(
        delta_head(session_id, owner_id),
        rfc3339(row["created_at"]) or "",
        after,
        chunk,
        row["text"],
        phase,
    )
    return Ephemeral(after, sse_frame("message_delta", envelope, _chunk_id(after, chunk)), chunk)


# Events that settle a turn's streamed text: its message, or a retry that drops it. A delta that
# follows an event before the last of them sent arrived late (its notification overtaken by a
# read of the log that already found the message) and would show the text twice.
TURN_ENDS = frozenset({SessionEventType.ASSISTANT_MESSAGE, SessionEventType.MODEL_RETRY})


def settled_by(events: list[Event], settled: int) -> int:
    """The id of the last turn end among `events`, or `settled` if none."""
    return max((event.id for event in events if event.type in TURN_ENDS), default=settled)


# The last chunk a stream sent: (the afterSeq of its turn, its number); (0, 0) for none.
Seen = tuple[int, int]


class Ordered(NamedTuple):
    """What `in_order` took: the frames to send, how many deltas and events that used, and the
    stream's place after them. `gap`, when it stopped at a chunk after missing ones: (their
    afterSeq, the first missing number, the number of the chunk that came)."""

    frames: list[bytes]
    deltas: int
    events: int
    cursor: int
    settled: int
    seen: Seen
    gap: tuple[int, int, int] | None = None


def in_order(
    deltas: list[Ephemeral], events: list[Event], cursor: int, settled: int, seen: Seen = (0, 0)
) -> Ordered:
    """Frames of `deltas` and `events` (both in their order; events follow `cursor`) in one
    order: each delta right after the event it follows; a delta of a turn whose end was sent
    (`settled`, the id of the last turn end sent) is dropped, and so is a chunk at or before
    `seen` (the last chunk sent: replayed from the store, or repeated). Stops at a delta whose
    event is not among `events` yet, and at a chunk that does not come next after `seen` (the
    ones between were missed: the caller sends them from the store, then calls again)."""
    frames: list[bytes] = []
    d = e = 0
    while d < len(deltas) or e < len(events):
        if d < len(deltas) and deltas[d].after < settled:
            d += 1
        elif d < len(deltas) and deltas[d].after <= cursor:
            delta = deltas[d]
            if delta.chunk:
                place = (delta.after, delta.chunk)
                if place <= seen:
                    d += 1
                    continue
                first = seen[1] + 1 if delta.after == seen[0] else 1
                if delta.chunk != first:
                    return Ordered(
                        frames, d, e, cursor, settled, seen, (delta.after, first, delta.chunk)
                    )
                seen = place
            frames.append(delta.sent_at(cursor))
            d += 1
        elif e < len(events):
            frames.append(events[e].live)
            cursor = events[e].id
            if events[e].type in TURN_ENDS:
                settled = cursor
            e += 1
        else:
            break  # the next delta follows an event this stream has not read yet
    return Ordered(frames, d, e, cursor, settled, seen)


def control(event: str, data: dict[str, Any]) -> bytes:
    """A control frame: no `id:`, so it never moves a client's cursor."""
    return sse_frame(event, _json(data))


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


def rewound(epoch: int, epoch_at: int | None) -> ResyncReason | None:
    """Whether a reader whose cursor names an event of `epoch` must resync because the log
    holds an event of another epoch at that number (`epoch_at`; None: none there to compare):
    the log was rewound past its cursor and the number given out again (migration 0009)."""
    if epoch_at is not None and epoch_at != epoch:
        return "cursor_ahead"
    return None
