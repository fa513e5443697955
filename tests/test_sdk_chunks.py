"""The Python SDK and token chunks, pure: a delta's id `<seq>.<chunk>` moves the stream's
cursor (so a reconnect resumes after it) without making the delta a durable event, and the fold
applies each numbered chunk once, whatever a reconnect replays."""

from __future__ import annotations

import json

import httpx
from httpx_sse import ServerSentEvent
from hypothesis import given
from hypothesis import strategies as st

from ferryman import SessionFold, StreamEvent
from ferryman._core import Backoff, Stream

TS = "2026-12-02T00:00:00.000Z"


def delta_sse(after: int, chunk: int, text: str, id_: str | None = None) -> ServerSentEvent:
    envelope = {
        "type": "message_delta",
        "sessionId": "s1",
        "ownerId": "o1",
        "ts": TS,
        "afterSeq": after,
        "chunk": chunk,
        "data": {"text": text},
        "phase": "live",
    }
    return ServerSentEvent("message_delta", json.dumps(envelope), id_ or f"{after}.{chunk}")


def event_sse(seq: int, type_: str, data: dict[str, object]) -> ServerSentEvent:
    envelope: dict[str, object] = {"id": str(seq), "type": type_, "sessionId": "s1", "ts": TS}
    envelope.update({"ownerId": "o1", "seq": seq, "attempt": 1, "data": data, "phase": "live"})
    return ServerSentEvent(type_, json.dumps(envelope), str(seq))


def stream() -> Stream:
    return Stream("/api/agent/s1/events", None, Backoff(0.1, 1.0), httpx.Timeout(5.0))


def test_a_deltas_id_is_the_streams_cursor_not_an_event() -> None:
    s = stream()
    started = s.receive(event_sse(2, "session_start", {"attempt": 1}))
    assert started is not None and started.durable and s.cursor == "2"
    got = s.receive(delta_sse(2, 3, "abc"))
    assert got is not None and got.id == "2.3" and got.chunk == 3 and not got.durable
    assert s.cursor == "2.3"
    assert s.request_options()["headers"] == {"Last-Event-ID": "2.3"}
    # A chunk sent after a later event carries that event's seq.
    assert s.receive(delta_sse(2, 4, "d", id_="5.4")) is not None and s.cursor == "5.4"
    # Control frames repeat the last id (as EventSource does) and move nothing.
    caught = ServerSentEvent("caught_up", json.dumps({"replayed": 0, "cursor": "5"}), "5.4")
    control = s.receive(caught)
    assert control is not None and control.id is None


def frames(after: int, numbers: list[int]) -> list[StreamEvent]:
    s = stream()
    return [e for n in numbers if (e := s.receive(delta_sse(after, n, f"<{n}>"))) is not None]


@given(st.lists(st.integers(1, 30), min_size=1))
def test_the_fold_applies_each_chunk_once(numbers: list[int]) -> None:
    """Chunks that come again (a replay from the store) or late are not text twice: the draft
    is each chunk, in the order first seen, above the last one applied."""
    fold = SessionFold()
    fold.apply_all(frames(2, numbers))
    applied: list[int] = []
    for n in numbers:
        if not applied or n > applied[-1]:
            applied.append(n)
    assert fold.draft == "".join(f"<{n}>" for n in applied)


def test_a_reconnect_from_an_event_mid_turn_repeats_no_text() -> None:
    fold = SessionFold()
    fold.apply_all(frames(2, [1, 2, 3]))
    fold.apply_all(frames(2, [1, 2, 3, 4]))  # `Last-Event-ID: 2`: all stored chunks again
    assert fold.draft == "<1><2><3><4>"
    s = stream()
    message = s.receive(event_sse(3, "assistant_message", {"text": "<1><2><3><4>"}))
    assert message is not None and fold.apply(message) and fold.draft is None
    assert fold.apply_all(frames(4, [1])) and fold.draft == "<1>"  # the next turn
