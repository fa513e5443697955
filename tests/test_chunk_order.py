"""The pure rule that keeps stored and live token chunks in order (`frames.in_order` with its
`seen` and `gap`), and the session cursor's grammar (`split_chunk`): properties over any mix of
chunks replayed from the store, repeated live, or missed."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.errors import InvalidCursor
from app.store.notify import delta_envelope, delta_head, ephemeral_body, parse_ephemeral
from app.streams.frames import (
    MAX_CURSOR_CHUNK,
    Ephemeral,
    Event,
    Seen,
    ephemeral_frame,
    in_order,
    split_chunk,
    stored_delta,
)

SESSION = "00000000-0000-0000-0000-000000000001"


def chunk(after: int, number: int) -> Ephemeral:
    head = delta_head(SESSION, "owner")
    envelope = delta_envelope(
        head, "2026-12-02T00:00:00.000Z", after, number, f"<{number}>", "live"
    )
    return ephemeral_frame(ephemeral_body(after, "message_delta", envelope, number))


def event(id_: int, type_: str = "user_message") -> Event:
    return Event.of(id_, type_, {"id": str(id_), "type": type_, "data": {}})


def frame_id(frame: bytes) -> str | None:
    first = frame.split(b"\n", 1)[0].decode()
    return first[4:] if first.startswith("id: ") else None


def numbers_in(frames: list[bytes]) -> list[int]:
    return [json.loads(f.split(b"data: ", 1)[1])["chunk"] for f in frames if b"message_delta" in f]


def deliver(
    live: list[Ephemeral], events: list[Event], cursor: int, seen: Seen, store: dict[int, Ephemeral]
) -> tuple[list[bytes], Seen]:
    """What a live stream sends of `live` (and `events`), filling each gap from `store` as
    `Feed.fill` does: the whole loop of `Feed.take` over `in_order`."""
    sent: list[bytes] = []
    held, settled = list(live), 0
    for _ in range(10 * (len(live) + len(events)) + 10):
        got = in_order(held, events, cursor, settled, seen)
        sent += got.frames
        del held[: got.deltas]
        events = events[got.events :]
        cursor, settled, seen = got.cursor, got.settled, got.seen
        if got.gap is not None:
            after, first, came = got.gap
            sent += [store[n].sent_at(cursor) for n in range(first, came) if n in store]
            seen = (after, came - 1)
            continue
        if not held and not events:
            break
    return sent, seen


@given(
    total=st.integers(1, 40),
    stored=st.integers(0, 40),
    data=st.data(),
)
def test_stored_then_live_chunks_are_each_sent_once_in_order(
    total: int, stored: int, data: st.DataObject
) -> None:
    """A reader got chunks 1..`stored` from the store; live, any increasing run of the turn's
    chunks comes (from before or after those: repeats, and missed ones). It sends every chunk
    after the stored ones up to the last that came, once each, in order."""
    stored = min(stored, total)
    came = sorted(data.draw(st.sets(st.integers(1, total), min_size=1)))
    store = {n: chunk(5, n) for n in range(1, total + 1)}
    sent, seen = deliver([chunk(5, n) for n in came], [], 5, (5, stored), store)
    assert numbers_in(sent) == list(range(stored + 1, max(came[-1], stored) + 1))
    assert seen == (5, max(came[-1], stored))
    assert all(frame_id(f) == f"5.{n}" for f, n in zip(sent, numbers_in(sent), strict=True))


@given(total=st.integers(1, 30), missing=st.sets(st.integers(1, 30)), seen_k=st.integers(0, 30))
def test_what_the_store_lacks_stays_missed_and_nothing_repeats(
    total: int, missing: set[int], seen_k: int
) -> None:
    """A chunk neither stored nor heard (a failed flush) is missed, and the stream goes on."""
    store = {n: chunk(3, n) for n in range(1, total + 1) if n not in missing}
    live = [chunk(3, total)]
    sent, _ = deliver(live, [], 3, (3, seen_k), store)
    numbers = numbers_in(sent)
    assert numbers == sorted(set(numbers))
    expected = [n for n in range(seen_k + 1, total + 1) if n in store or n == total]
    assert numbers == expected


@given(st.integers(1, 20), st.integers(1, 20))
def test_a_new_turn_numbers_from_one(first_turn: int, second_turn: int) -> None:
    """Chunks of the next turn (a later afterSeq, after its event) follow those of the last."""
    live = [chunk(4, n) for n in range(1, first_turn + 1)]
    live += [chunk(7, n) for n in range(1, second_turn + 1)]
    events = [event(5, "assistant_message"), event(6), event(7)]
    sent, seen = deliver(live, events, 4, (0, 0), {})
    assert numbers_in(sent) == list(range(1, first_turn + 1)) + list(range(1, second_turn + 1))
    assert seen == (7, second_turn)


def test_a_late_chunk_of_a_settled_turn_is_dropped() -> None:
    reply = [event(6, "assistant_message"), event(7)]
    got = in_order([], reply, 5, 0, (5, 3))
    late = in_order([chunk(5, 4), chunk(7, 1)], [], got.cursor, got.settled, got.seen)
    assert numbers_in(late.frames) == [1] and late.seen == (7, 1)


def test_a_chunk_sent_after_a_later_event_takes_that_event_in_its_id() -> None:
    """Another writer's event (a user message while the turn streams) came first: the chunk's id
    must not take the client's cursor back before it."""
    got = in_order([chunk(5, 1)], [event(6)], 5, 0, (5, 0))
    assert [frame_id(f) for f in got.frames] == ["5.1", "6"]
    after = in_order([chunk(5, 2)], [], got.cursor, got.settled, got.seen)
    assert [frame_id(f) for f in after.frames] == ["6.2"]
    assert json.loads(after.frames[0].split(b"data: ", 1)[1])["afterSeq"] == 5


def test_unnumbered_deltas_go_as_before() -> None:
    """A delta without a number (from a worker before chunks were numbered) has no id and is
    neither deduplicated nor a gap."""
    envelope = json.dumps({"type": "message_delta", "afterSeq": 2, "data": {"text": "x"}})
    old = ephemeral_frame(ephemeral_body(2, "message_delta", envelope))
    assert old.chunk == 0 and frame_id(old.frame) is None
    got = in_order([old, old], [], 2, 0, (2, 9))
    assert len(got.frames) == 2 and got.gap is None


def test_a_stored_chunk_is_the_live_frame_but_for_its_phase() -> None:
    live = chunk(8, 3)
    at = datetime.fromisoformat("2026-12-02T00:00:00+00:00")
    row = {"after_seq": 8, "chunk": 3, "text": "<3>", "created_at": at}
    replayed = stored_delta(row, SESSION, "owner", "backlog")
    assert replayed.frame == live.frame.replace(b'"phase":"live"', b'"phase":"backlog"')
    assert (replayed.after, replayed.chunk) == (8, 3)


@given(st.integers(0, 2**63 - 1), st.integers(0, MAX_CURSOR_CHUNK))
def test_body_and_cursor_round_trip(after: int, number: int) -> None:
    body = ephemeral_body(after, "message_delta", "{}", number)
    assert parse_ephemeral(body) == (after, number, "message_delta", "{}")
    assert split_chunk(f"{after}.{number}") == (str(after), number)
    assert split_chunk(str(after)) == (str(after), 0)


@pytest.mark.parametrize(
    "raw",
    ["1.", ".1", "1.x", "1.-1", "1.+1", "1.2.3", "1.\uff11", f"1.{MAX_CURSOR_CHUNK + 1}", "1.1e3"],
)
def test_a_bad_chunk_is_an_invalid_cursor(raw: str) -> None:
    with pytest.raises(InvalidCursor):
        split_chunk(raw)


@given(st.text(max_size=20))
def test_split_chunk_is_total(raw: str) -> None:
    """Any text splits or raises InvalidCursor; the fraction is ASCII decimal digits."""
    try:
        whole, number = split_chunk(raw)
    except InvalidCursor:
        return
    if "." in raw:
        assert re.fullmatch(r"[0-9]+", raw.strip().partition(".")[2])
        assert 0 <= number <= MAX_CURSOR_CHUNK and whole
    else:
        assert (whole, number) == (raw, 0)
