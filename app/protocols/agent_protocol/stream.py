"""A run's protocol stream: the session's log through the process's feed (the same one the
native session stream reads, so one read of each new event serves both), folded by
`fold.ThreadFold` into protocol events, each with an id made of its log position. Resuming
from a `Last-Event-ID` folds the log again from seq 1 and sends only what follows that id, so
any API process, after any restart, sends the same events with the same ids. Token chunks are
numbered by the worker and stored (app/store/deltas.py): a stream that starts in the middle of
a turn sends the turn's stored chunks it has not sent, and a live chunk that shows a gap has
the missing ones read from the store first."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any

from app.api.streams import session_source
from app.db.pool import UNAVAILABLE_ERRORS
from app.domain import SessionEventType
from app.protocols.agent_protocol import fold
from app.services import Services
from app.store.deltas import CLOSING_TYPES
from app.streams.feed import Follower, StoredChunks
from app.streams.frames import PING, Ephemeral, Event, retry, sse_frame
from app.streams.sse import DirectWrites, wait_any


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# Protocol events of chunks the worker did not number come after any numbered ones.
_UNNUMBERED = 10**9


def _frame_data(frame: bytes) -> dict[str, Any]:
    """The envelope of a feed's frame (`data: <json>` is its last line)."""
    start = frame.index(b"\ndata: ") + 7
    parsed: dict[str, Any] = json.loads(frame[start:])
    return parsed


class RunStream:
    """The protocol events of one run for one client, from its cursor on."""

    def __init__(
        self,
        row: dict[str, Any],
        run: fold.Run,
        after: fold.Position | None,
        events: frozenset[str],
    ) -> None:
        self.run = run
        self.after = after
        self.events = events
        self.state = fold.ThreadFold(row["id"], model=row["model"], run=run.id)
        self.cursor = 0  # the last log event folded
        self.last_type = ""  # its type
        self.ended = False
        self.seen: tuple[int, int] = (0, 0)  # the last numbered chunk folded: (after, chunk)
        self.unnumbered: dict[int, int] = {}  # protocol events of unnumbered chunks, by after
        self.deltas: list[Ephemeral] = []
        # The stored chunks of the turn the client left in the middle of, from the one whose
        # `messages` event it saw last but not its `events` twin: sent once the event they
        # follow is folded (their metadata counts the steps up to there), whether or not the
        # turn has ended since, as its own stream sent them.
        self.resumed: list[Ephemeral] = []

    def _out(self, name: str, data: Any, position: fold.Position) -> bytes | None:
        if name == "end":
            self.ended = True
        if self.after is not None and position <= self.after:
            return None
        if name not in self.events:
            return None
        return sse_frame(name, _json(data), fold.event_id(position))

    def durable(self, event: Event) -> list[bytes]:
        envelope = _frame_data(event.live)
        seq = event.id
        in_run = seq >= self.run.start_seq and not self.ended
        frames = self._last_piece(envelope) if in_run else []
        produced = self.state.apply(envelope, in_run)
        if seq == self.run.start_seq:
            metadata = {"run_id": self.run.id, "attempt": envelope["attempt"]}
            produced.insert(0, ("metadata", metadata))
        self.cursor = seq
        self.last_type = envelope["type"]
        for j, (name, data) in enumerate(produced):
            frame = self._out(name, data, (seq, 0, j))
            if frame is not None:
                frames.append(frame)
        if self.resumed and self.resumed[0].after == seq:
            for delta in self.resumed:
                frames.extend(self.chunk(delta))
            self.resumed = []
        return frames

    def chunk(self, delta: Ephemeral) -> list[bytes]:
        """Fold a token chunk in: the frames of its protocol events, two per chunk: chunk c of
        the turn after event a gives ids a.2c-1 and a.2c, where a is the last event sent when
        that is later than the turn's (another writer's event, such as a steering message,
        came while it streamed), so that ids only ever grow."""
        text = _frame_data(delta.frame).get("data", {}).get("text", "")
        return self._chunk(delta.after, delta.chunk, text)

    def _chunk(self, after: int, number: int, text: str) -> list[bytes]:
        place = max(after, self.cursor)
        frames = []
        for j, (name, data) in enumerate(self.state.chunk(after, text)):
            if number:
                k = 2 * (number - 1) + j + 1
            else:
                k = self.unnumbered.get(place, _UNNUMBERED) + 1
                self.unnumbered[place] = k
            frame = self._out(name, data, (place, 1, k))
            if frame is not None:
                frames.append(frame)
        if number:
            self.seen = (after, number)
        return frames

    def _last_piece(self, envelope: dict[str, Any]) -> list[bytes]:
        """Before the message that ends a turn this stream sent chunks of: the turn's last
        piece, as the chunk it was (the worker sends it with the message, numbered after the
        others, and does not store it: app/runtime/deltas.py), when the stream has not had it,
        so that a stream that resumed inside the turn sends what the live one did."""
        after = self.state.last_written
        if envelope["type"] != SessionEventType.ASSISTANT_MESSAGE or self.seen[0] != after:
            return []
        text = str(envelope["data"].get("text") or "")
        streamed = self.state.streamed.get(after, "")
        if len(text) <= len(streamed) or not text.startswith(streamed):
            return []
        return self._chunk(after, self.seen[1] + 1, text[len(streamed) :])

    def _sendable(self, delta: Ephemeral) -> bool:
        return not (
            self.ended
            or not delta.frame
            or delta.after < self.run.start_seq
            or delta.after < self.state.settled
            or (delta.chunk and (delta.after, delta.chunk) <= self.seen)
        )

    async def seen_before(self, chunks: StoredChunks | None) -> None:
        """Fold in the stored chunks the client saw before it reconnected, so the turn's last
        chunk carries only the text it has not had, and keep the turn's others to send. A
        chunk's cursor: the chunks up to it (the one it names may have had only its `messages`
        event sent, not its `events` twin); a durable event's: every chunk of the turn open
        just before that event. The turn of a chunk's cursor is read even if it has ended
        since (the store keeps its chunks: app/store/deltas.py)."""
        if chunks is None or self.after is None:
            return
        seq, is_chunk, k = self.after
        turn = await chunks.open_turn(seq if is_chunk else seq - 1, 0, 0)
        if turn is None:
            return
        for delta in turn[1]:
            if not is_chunk or delta.chunk <= k // 2:
                self.chunk(delta)
            else:
                self.resumed.append(delta)

    async def open_turn(self, chunks: StoredChunks | None) -> list[bytes]:
        """The stored chunks of the turn open at the log's head, not folded yet. No turn is
        open at the start of the log, nor right after one closed: no read then."""
        if chunks is None or self.ended or not self.cursor or self.last_type in CLOSING_TYPES:
            return []
        seen_seq, seen_chunk = self.seen if self.seen[0] else (self.cursor, 0)
        turn = await chunks.open_turn(self.cursor, seen_seq, seen_chunk)
        if turn is None:
            return []
        frames: list[bytes] = []
        for delta in turn[1]:
            if self._sendable(delta):
                frames.extend(self.chunk(delta))
        return frames

    async def live(self, chunks: StoredChunks | None) -> list[bytes]:
        """Frames of the live chunks that follow events already folded (the others wait),
        the stored ones missed before each first."""
        frames: list[bytes] = []
        while self.deltas and self.deltas[0].after <= self.cursor:
            delta = self.deltas.pop(0)
            if not self._sendable(delta):
                continue
            first = self.seen[1] + 1 if delta.after == self.seen[0] else 1
            if delta.chunk > first and chunks is not None:
                for missed in await chunks.between(delta.after, first, delta.chunk):
                    frames.extend(self.chunk(missed))
            frames.extend(self.chunk(delta))
        return frames


async def run_events(
    services: Services, row: dict[str, Any], stream: RunStream, direct: DirectWrites | None = None
) -> AsyncGenerator[bytes, None]:
    """The run's frames; with `direct` (FERRYMAN_STREAM_SHORTCUTS), written straight to the
    connection while it takes them, through the response's `send` otherwise."""
    settings = services.settings
    shutdown = services.shutdown
    yield retry(settings.sse_retry_ms)
    services.hub.watch_shutdown(shutdown)
    source = session_source(services, row["id"], row["owner_id"])
    async with services.hub.attach(source, tick_interval=settings.ping_interval) as feed:
        ready = await wait_any(
            feed.ready, feed.unreadable, shutdown, timeout=settings.ping_interval
        )
        if not ready:
            yield PING
            await wait_any(feed.ready, feed.unreadable, shutdown, timeout=3600)
        seen = feed.ephemeral_count
        sent = True  # whether anything went out since the last wait
        pushed: list[bytes] = []  # frames folded while parked that no direct write took
        failed: list[Exception] = []

        def push(chunk: bytes) -> bool:
            """While parked, the feed's direct write (`Feed.park`): its newest event alone,
            the common case, folded here and written straight to the connection, no task
            woken. False wakes the loop, which does everything else (deltas, several events,
            a run's end, a connection that takes no more)."""
            nonlocal sent
            write = direct.write if direct is not None else None
            items = feed.buffer.items
            if write is None or pushed or failed or stream.deltas or not items:
                return False
            newest = items[-1][1]
            if chunk is not newest.live or newest.id != stream.cursor + 1:
                return False
            try:
                frames = stream.durable(newest)
            except Exception as exc:  # raised again by the loop, in the stream's own task
                failed.append(exc)
                return False
            if frames:
                sent = True
                if not write(b"".join(frames)):
                    pushed.extend(frames)
                    return False
            return not stream.ended

        with contextlib.suppress(*UNAVAILABLE_ERRORS):  # best effort, as the stored chunks are
            await stream.seen_before(source.chunks)
        caught_up = False
        while not shutdown.is_set() and not feed.unreadable.is_set():
            generation = feed.generation
            try:
                events = await feed.read(stream.cursor)
                if events and events[0].id != stream.cursor + 1:
                    return  # the log no longer reaches back (a purged session)
                frames: list[bytes] = []
                for event in events:
                    frames.extend(stream.durable(event))
                    if stream.ended:
                        break
                if not events and not caught_up:
                    # At the head: the turn streaming now, from the store; live from here.
                    caught_up = True
                    frames.extend(await stream.open_turn(source.chunks))
                new, seen = feed.ephemeral_since(seen)
                stream.deltas.extend(new)
                frames.extend(await stream.live(source.chunks))
            except UNAVAILABLE_ERRORS:
                yield PING
                await asyncio.sleep(min(settings.ping_interval, 1.0))
                continue
            if frames:
                chunk = b"".join(frames)
                if direct is None or direct.write is None or not direct.write(chunk):
                    yield chunk
                sent = True
            if stream.ended:
                return
            if events:
                continue
            if feed.closed:
                return
            if not sent:
                yield PING  # woken by the keep-alive tick with nothing to send
            sent = False
            # A new place each time: what the feed's `take` kept in the last one (held deltas,
            # its own frames when `push` declined them) is this loop's to do, from its cursor.
            follower = Follower(push if direct is not None else None, stream.cursor, 0, seen)
            await feed.park(follower, generation)
            if failed:
                raise failed[0]
            if pushed:
                chunk = b"".join(pushed)
                pushed.clear()
                yield chunk
                sent = True
            if stream.ended:
                return
