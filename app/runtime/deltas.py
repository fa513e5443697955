"""A worker's token deltas, sent together: every `FERRYMAN_DELTA_FLUSH_INTERVAL` (0.1 s) at most
one NOTIFY transaction carries the new text of all the worker's streaming sessions (several
payloads when they exceed NOTIFY's limit). One NOTIFY per session per 50 ms made 1,000 streaming
sessions 20,000 transactions a second, more than the database commits.

Each flush of a session is a chunk, numbered 1, 2, 3... among those that follow the same event
(`afterSeq`), and stored in the statement that notifies it (app/store/deltas.py), so that a
client that reconnects mid-turn gets the chunks it missed. Deltas are best effort: the durable
`assistant_message` carries the whole text. A run takes the text its session has not sent yet
when its turn ends (`take`), to send it with the message."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from uuid import UUID

from app.db.pool import Database
from app.domain import rfc3339
from app.store.deltas import MAX_STORED_CHUNKS_PER_TURN, SWEEP_SECONDS, Chunk, publish_deltas
from app.store.notify import delta_envelope, delta_head, ephemeral_body, session_key

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    """A streaming session's text not sent yet. It lives for the session's turn, so `key` and
    `head` (its notification key and the start of its envelope) are built once a turn, not at
    every flush. `chunk`: the number of the last frame cut for `after_seq`."""

    session_id: UUID
    key: str
    head: str
    after_seq: int
    texts: list[str] = field(default_factory=list)
    chunk: int = 0

    @classmethod
    def of(cls, session_id: UUID, owner_id: str, after_seq: int) -> _Pending:
        return cls(session_id, session_key(session_id), delta_head(session_id, owner_id), after_seq)

    def follows(self, after_seq: int) -> None:
        """Its text from now on follows event `after_seq`: the numbering starts again there."""
        if after_seq != self.after_seq:
            self.after_seq = after_seq
            self.chunk = 0

    def cut(self, ts: str | None = None) -> tuple[tuple[str, str], Chunk]:
        """The (key, body) line of the ephemeral `message_delta` of the text
        (`ephemeral_body`), which is then no longer pending, and the chunk it is. `afterSeq` is
        the last event its run wrote before it: streams send it after that event and before
        the next. `ts`: when it was built (a flush cuts one for all its frames)."""
        self.chunk += 1
        text = "".join(self.texts)
        self.texts = []
        after = int(self.after_seq)
        envelope = delta_envelope(self.head, ts or _now(), after, self.chunk, text, "live")
        line = (self.key, ephemeral_body(after, "message_delta", envelope, self.chunk))
        return line, Chunk(self.session_id, after, self.chunk, text)


def _now(at: datetime | None = None) -> str:
    return rfc3339(at or datetime.now(UTC)) or ""


class DeltaHub:
    """Text waits at most one interval, whether or not more follows (a stalled stream holds
    nothing back); frames of one session leave in the order their text came."""

    def __init__(self, db: Database, interval: float) -> None:
        self.db = db
        self.interval = interval
        self.streaming: dict[UUID, _Pending] = {}  # sessions in a turn, until `take`
        self.due: dict[UUID, _Pending] = {}  # those with text for the next flush
        self.last_flush = 0.0
        self.last_sweep = time.monotonic()  # of the stored chunks (`publish_deltas`)
        self.timer: asyncio.Task[None] | None = None
        self.sending = asyncio.Lock()

    def add(self, session_id: UUID, owner_id: str, text: str, after_seq: int) -> None:
        entry = self.streaming.get(session_id)
        if entry is None:
            entry = self.streaming[session_id] = _Pending.of(session_id, owner_id, after_seq)
        entry.follows(after_seq)
        entry.texts.append(text)
        self.due[session_id] = entry
        if self.timer is None:
            # At least one interval after the last send: a turn shorter than that sends its
            # text with the message that ends it, not in a NOTIFY.
            wait = max(self.interval, self.last_flush + self.interval - time.monotonic())
            self.timer = asyncio.create_task(self._flush_after(wait))

    async def take(self, session_id: UUID) -> tuple[str, str] | None:
        """The (key, body) line of the session's text not sent yet (its turn is over), once a
        send in flight has left: the caller sends it after everything sent before."""
        async with self.sending:
            entry = self.streaming.pop(session_id, None)
            self.due.pop(session_id, None)
        # Sent with the event that ends the turn (or just before it), so not stored: a reader
        # that reconnects after it reads that event. It keeps its number: a stream that missed
        # the ones before it fills the gap from the stored ones.
        return entry.cut()[0] if entry is not None and entry.texts else None

    async def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.timer
            self.timer = None

    async def _flush_after(self, wait: float) -> None:
        await asyncio.sleep(wait)
        self.timer = None
        await self.flush()

    async def flush(self) -> None:
        async with self.sending:
            if not self.due:
                return
            due, self.due = self.due, {}
            self.last_flush = time.monotonic()
            sweep = self.last_flush - self.last_sweep >= SWEEP_SECONDS
            if sweep:
                self.last_sweep = self.last_flush
            at = datetime.now(UTC)
            ts = _now(at)
            frames: list[tuple[str, str]] = []
            chunks: list[Chunk] = []
            for entry in due.values():
                line, chunk = entry.cut(ts)
                frames.append(line)
                if chunk.chunk <= MAX_STORED_CHUNKS_PER_TURN:
                    chunks.append(chunk)
            try:
                async with self.db.connection() as conn:
                    await publish_deltas(conn, frames, chunks, at, sweep=sweep)
            except Exception as exc:  # deltas are best effort; the durable message follows
                log.debug("deltas not sent: %s", exc)
