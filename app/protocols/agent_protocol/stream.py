"""A run's protocol stream: the session's log through the process's feed (the same one the
native session stream reads, so one read of each new event serves both), folded by
`fold.ThreadFold` into protocol events, each with an id made of its log position. Resuming
from a `Last-Event-ID` folds the log again from seq 1 and sends only what follows that id, so
any API process, after any restart, sends the same events with the same ids."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from app.api.streams import session_source
from app.db.pool import UNAVAILABLE_ERRORS
from app.protocols.agent_protocol import fold
from app.services import Services
from app.streams.feed import Follower
from app.streams.frames import PING, Ephemeral, Event, retry, sse_frame
from app.streams.sse import wait_any


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


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
        self.ended = False
        # Chunk events given a number so far, by the log event they follow.
        self.chunks: dict[int, int] = {}
        if after is not None and after[1] == 1:
            self.chunks[after[0]] = after[2]
        self.deltas: list[Ephemeral] = []

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
        produced = self.state.apply(envelope, in_run)
        if seq == self.run.start_seq:
            produced.insert(
                0, ("metadata", {"run_id": self.run.id, "attempt": envelope["attempt"]})
            )
        self.cursor = seq
        frames = []
        for j, (name, data) in enumerate(produced):
            frame = self._out(name, data, (seq, 0, j))
            if frame is not None:
                frames.append(frame)
        return frames

    def ephemeral(self) -> list[bytes]:
        """Frames of the token chunks that follow events already folded; the others wait."""
        frames: list[bytes] = []
        kept: list[Ephemeral] = []
        for delta in self.deltas:
            if delta.after > self.cursor:
                kept.append(delta)
                continue
            skip = (
                self.ended
                or delta.after < self.run.start_seq
                or delta.after < self.state.settled
                or (self.after is not None and delta.after < self.after[0])
                or not delta.frame
            )
            if skip:
                continue
            text = _frame_data(delta.frame).get("data", {}).get("text", "")
            for name, data in self.state.chunk(delta.after, text):
                k = self.chunks.get(delta.after, 0) + 1
                self.chunks[delta.after] = k
                frame = self._out(name, data, (delta.after, 1, k))
                if frame is not None:
                    frames.append(frame)
        self.deltas = kept
        return frames


async def run_events(
    services: Services, row: dict[str, Any], stream: RunStream
) -> AsyncGenerator[bytes, None]:
    settings = services.settings
    shutdown = services.shutdown
    yield retry(settings.sse_retry_ms)
    services.hub.watch_shutdown(shutdown)
    async with services.hub.attach(
        session_source(services, row["id"]), tick_interval=settings.ping_interval
    ) as feed:
        if not await wait_any(
            feed.ready, feed.unreadable, shutdown, timeout=settings.ping_interval
        ):
            yield PING
            await wait_any(feed.ready, feed.unreadable, shutdown, timeout=3600)
        seen = feed.ephemeral_count
        follower = Follower(None, 0, 0, seen)
        sent = True
        while not shutdown.is_set() and not feed.unreadable.is_set():
            generation = feed.generation
            try:
                events = await feed.read(stream.cursor)
            except UNAVAILABLE_ERRORS:
                yield PING
                await asyncio.sleep(min(settings.ping_interval, 1.0))
                continue
            if events and events[0].id != stream.cursor + 1:
                return  # the log no longer reaches back (a purged session): nothing to resume
            frames: list[bytes] = []
            for event in events:
                frames.extend(stream.durable(event))
                if stream.ended:
                    break
            new, seen = feed.ephemeral_since(seen)
            stream.deltas.extend(new)
            frames.extend(stream.ephemeral())
            if frames:
                yield b"".join(frames)
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
            follower.cursor, follower.ephemeral_seen = stream.cursor, seen
            await feed.park(follower, generation)
