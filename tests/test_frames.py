"""Pure unit tests of the SSE protocol pieces in app.streams.frames (no database, no server)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.errors import InvalidCursor
from app.store.notify import ephemeral_body
from app.streams.frames import (
    MAX_CURSOR,
    PING,
    Ephemeral,
    Event,
    control,
    ephemeral_frame,
    in_order,
    owner_event,
    parse_cursor,
    resync_reason,
    retry,
    session_event,
    settled_by,
    sse_frame,
)

SESSION_ID = UUID("12345678-1234-5678-1234-567812345678")
CREATED = datetime(2026, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC)

# --- parse_cursor ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("0", 0),
        ("1", 1),
        ("42", 42),
        ("007", 7),
        (" 12 ", 12),
        ("\t12\n", 12),
        (str(MAX_CURSOR), MAX_CURSOR),
        (str(2**63 - 1), 2**63 - 1),
    ],
)
def test_parse_cursor_valid(raw: str, expected: int) -> None:
    assert parse_cursor(raw) == expected


@pytest.mark.parametrize("raw", [None, "", " ", "\t\n"])
def test_parse_cursor_absent(raw: str | None) -> None:
    assert parse_cursor(raw) is None


@pytest.mark.parametrize(
    "raw",
    [
        "abc",
        "-1",
        "+1",
        "1.5",
        "1e3",
        "0x10",
        "1_000",
        "1 2",
        "12abc",
        str(2**63),  # one past the largest bigint
        str(2**64),
        "9" * 19,  # 19 digits but above 2^63-1
        "9" * 40,
        "\uff11\uff12",  # fullwidth digits: str.isdigit() and int() accept them, a cursor must not
        "١٢",  # Arabic-Indic digits
        "²",  # superscript two: isdigit() but not a decimal
        "NaN",
        "∞",
    ],
)
def test_parse_cursor_invalid(raw: str) -> None:
    with pytest.raises(InvalidCursor) as info:
        parse_cursor(raw)
    assert info.value.code == "INVALID_CURSOR"
    assert info.value.status in (400, 422)


def test_parse_cursor_error_detail_is_bounded() -> None:
    with pytest.raises(InvalidCursor) as info:
        parse_cursor("x" * 10_000)
    assert len(info.value.detail) < 200


@given(st.integers(min_value=0, max_value=MAX_CURSOR))
def test_parse_cursor_roundtrip(n: int) -> None:
    assert parse_cursor(str(n)) == n
    assert parse_cursor(f"  {n}\n") == n


@given(st.integers(max_value=-1))
def test_parse_cursor_rejects_negatives(n: int) -> None:
    with pytest.raises(InvalidCursor):
        parse_cursor(str(n))


@given(st.integers(min_value=MAX_CURSOR + 1, max_value=2**200))
def test_parse_cursor_rejects_beyond_bigint(n: int) -> None:
    with pytest.raises(InvalidCursor):
        parse_cursor(str(n))


@given(st.text(max_size=30))
def test_parse_cursor_total(raw: str) -> None:
    """Any text either parses to an in-range int equal to its ASCII-decimal reading, or raises
    InvalidCursor: never another exception, never a value from non-ASCII digits."""
    try:
        value = parse_cursor(raw)
    except InvalidCursor:
        stripped = raw.strip()
        assert not re.fullmatch(r"[0-9]+", stripped) or int(stripped) > MAX_CURSOR
        return
    if value is None:
        assert raw.strip() == ""
    else:
        assert re.fullmatch(r"[0-9]+", raw.strip())
        assert 0 <= value <= MAX_CURSOR
        assert value == int(raw.strip())


# --- resync_reason --------------------------------------------------------------------------

ids = st.integers(min_value=0, max_value=10**12)
limits = st.one_of(st.none(), st.integers(min_value=0, max_value=10**6))


@st.composite
def feeds(draw: st.DrawFn) -> tuple[int, int | None]:
    """(last id, oldest retained id) as the store reports them: retention keeps the newest
    event, so a non-empty feed has 1 <= first <= last, an empty one (last 0) has none."""
    last = draw(ids)
    if last == 0:
        return 0, None
    return last, draw(st.integers(min_value=1, max_value=last))


@given(feeds(), st.integers(min_value=1, max_value=10**12), limits)
def test_resync_cursor_ahead(feed: tuple[int, int | None], ahead: int, limit: int | None) -> None:
    last, first = feed
    assert resync_reason(last + ahead, last, first, limit) == "cursor_ahead"


@given(feeds(), limits)
def test_resync_cursor_at_head_is_fine(feed: tuple[int, int | None], limit: int | None) -> None:
    last, first = feed
    assert resync_reason(last, last, first, limit) is None


@given(feeds(), st.data())
def test_resync_within_limit_and_retained(
    feed: tuple[int, int | None], data: st.DataObject
) -> None:
    last, first = feed
    # A cursor whose next event is still retained ...
    lowest = 0 if first is None else first - 1
    cursor = data.draw(st.integers(min_value=lowest, max_value=last))
    # ... and a limit that covers the gap.
    limit = data.draw(st.one_of(st.none(), st.integers(min_value=last - cursor, max_value=10**13)))
    assert resync_reason(cursor, last, first, limit) is None


@given(feeds(), st.data())
def test_resync_expired(feed: tuple[int, int | None], data: st.DataObject) -> None:
    last, first = feed
    if first is None or first < 2:
        return  # nothing was pruned: no cursor can be expired
    cursor = data.draw(st.integers(min_value=0, max_value=first - 2))
    limit = data.draw(limits)
    assert resync_reason(cursor, last, first, limit) == "expired"


@given(feeds(), st.data())
def test_resync_too_far_behind(feed: tuple[int, int | None], data: st.DataObject) -> None:
    last, first = feed
    lowest = 0 if first is None else first - 1
    if last - lowest < 1:
        return
    cursor = data.draw(st.integers(min_value=lowest, max_value=last - 1))
    limit = data.draw(st.integers(min_value=0, max_value=last - cursor - 1))
    assert resync_reason(cursor, last, first, limit) == "too_far_behind"


@given(ids, feeds(), limits)
def test_resync_total(cursor: int, feed: tuple[int, int | None], limit: int | None) -> None:
    """Whatever the inputs, the answer is one of the contract's reasons or None, and None means
    replaying (cursor, last] is possible and within the limit."""
    last, first = feed
    reason = resync_reason(cursor, last, first, limit)
    assert reason in (None, "cursor_ahead", "too_far_behind", "expired")
    if reason is None:
        assert cursor <= last
        assert first is None or cursor >= first - 1 or cursor == last
        assert limit is None or last - cursor <= limit


def test_resync_boundaries() -> None:
    # Replay limit 1000: exactly 1000 behind is served, 1001 is not.
    assert resync_reason(100, 1100, 1, 1000) is None
    assert resync_reason(99, 1100, 1, 1000) == "too_far_behind"
    assert resync_reason(0, 1100, 1, 1000) == "too_far_behind"
    assert resync_reason(0, 1100, 1, None) is None
    # Events 1..4 pruned, 5 kept: cursor 4 misses nothing, cursor 3 missed event 4.
    assert resync_reason(4, 5, 5, 1000) is None
    assert resync_reason(3, 5, 5, 1000) == "expired"
    assert resync_reason(0, 5, 5, 1000) == "expired"
    assert resync_reason(5, 5, 5, 1000) is None
    # Empty feed.
    assert resync_reason(0, 0, None, 1000) is None
    assert resync_reason(1, 0, None, 1000) == "cursor_ahead"
    # Expired wins over too far behind: the client must resnapshot either way, but "expired"
    # is the more precise reason.
    assert resync_reason(0, 5000, 3000, 1000) == "expired"


# --- frames ---------------------------------------------------------------------------------


def _owner_row(**overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "owner_id": "alice",
        "id": 42,
        "session_id": SESSION_ID,
        "type": "session_status",
        "data": {"status": "running", "attempt": 1},
        "created_at": CREATED,
    }
    row.update(overrides)
    return row


def _session_row(**overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "session_id": SESSION_ID,
        "seq": 7,
        "attempt": 2,
        "type": "assistant_message",
        "data": {"text": "héllo\nworld", "toolCalls": [], "stopReason": "stop"},
        "created_at": CREATED,
        "owner_id": "alice",
    }
    row.update(overrides)
    return row


def _parse(frame: bytes) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    text = frame.decode()
    assert text.endswith("\n\n")
    lines = text[:-2].split("\n")
    fields = [tuple(line.split(": ", 1)) for line in lines]
    assert all(len(f) == 2 for f in fields), lines
    data = json.loads(dict(fields)["data"])  # type: ignore[arg-type]
    return fields, data  # type: ignore[return-value]


def test_owner_event_wire_format_exact() -> None:
    event = owner_event(_owner_row())
    frame = event.frame("backlog")
    expected_data = (
        '{"id":"42","type":"session_status",'
        '"sessionId":"12345678-1234-5678-1234-567812345678","ownerId":"alice",'
        '"ts":"2026-01-02T03:04:05.678Z","data":{"status":"running","attempt":1},'
        '"phase":"backlog"}'
    )
    assert frame == f"id: 42\nevent: session_status\ndata: {expected_data}\n\n".encode()


def test_owner_event_envelope() -> None:
    event = owner_event(_owner_row())
    assert event.id == 42
    assert event.type == "session_status"
    fields, data = _parse(event.frame("live"))
    assert [name for name, _ in fields] == ["id", "event", "data"]
    assert fields[0] == ("id", "42")
    assert fields[1] == ("event", "session_status")
    assert set(data) == {"id", "type", "sessionId", "ownerId", "ts", "phase", "data"}
    assert data["id"] == "42" and isinstance(data["id"], str)
    assert data["type"] == "session_status"
    assert data["sessionId"] == str(SESSION_ID)
    assert data["ownerId"] == "alice"
    assert data["ts"] == "2026-01-02T03:04:05.678Z"
    assert data["phase"] == "live"
    assert data["data"] == {"status": "running", "attempt": 1}


def test_session_event_envelope() -> None:
    event = session_event(_session_row())
    assert event.id == 7
    fields, data = _parse(event.frame("backlog"))
    assert [name for name, _ in fields] == ["id", "event", "data"]
    assert fields[0] == ("id", "7")
    assert fields[1] == ("event", "assistant_message")
    assert set(data) == {
        "id",
        "type",
        "sessionId",
        "ownerId",
        "ts",
        "phase",
        "data",
        "seq",
        "attempt",
    }
    assert data["id"] == "7"
    assert data["seq"] == 7
    assert data["attempt"] == 2
    assert data["phase"] == "backlog"
    # A line break in the payload is escaped: the frame still has exactly one data: line.
    assert data["data"]["text"] == "héllo\nworld"
    assert event.frame("backlog").count(b"\n") == 4


def test_ts_is_utc_millis_whatever_the_input_zone() -> None:
    local = CREATED.astimezone(timezone(timedelta(hours=-5)))
    _, data = _parse(owner_event(_owner_row(created_at=local)).frame("live"))
    assert data["ts"] == "2026-01-02T03:04:05.678Z"


def test_frames_of_both_phases_share_one_serialization() -> None:
    """An event is serialized once, at creation: its frames differ only in `phase`, and later
    changes to the row it came from do not leak in."""
    row = _owner_row()
    event = owner_event(row)
    row["data"]["status"] = "changed"
    backlog, live = event.frame("backlog"), event.frame("live")
    assert b'"phase":"backlog"' in backlog and b'"phase":"live"' in live
    assert backlog.replace(b'"phase":"backlog"', b'"phase":"live"') == live
    assert b'"status":"running"' in live
    assert event.size == max(len(backlog), len(live))


def test_frame_for_big_ids() -> None:
    event = owner_event(_owner_row(id=MAX_CURSOR))
    frame = event.frame("live")
    assert frame.startswith(f"id: {MAX_CURSOR}\nevent: session_status\ndata: ".encode())
    _, data = _parse(frame)
    assert data["id"] == str(MAX_CURSOR)


def test_sse_frame_and_control_frames() -> None:
    assert sse_frame("x", "{}", "3") == b"id: 3\nevent: x\ndata: {}\n\n"
    assert sse_frame("x", "{}") == b"event: x\ndata: {}\n\n"
    frame = control("caught_up", {"replayed": 3, "fromEventId": "0", "cursor": "3"})
    assert frame == b'event: caught_up\ndata: {"replayed":3,"fromEventId":"0","cursor":"3"}\n\n'
    assert not frame.startswith(b"id:") and b"\nid:" not in frame


def test_retry_and_ping() -> None:
    assert retry(2000) == b"retry: 2000\n\n"
    assert PING == b": ping\n\n"


@given(
    st.integers(min_value=1, max_value=MAX_CURSOR),
    st.sampled_from(["session_created", "session_title", "session_deleted"]),
    st.dictionaries(st.text(max_size=8), st.text(max_size=20), max_size=4),
)
def test_frame_roundtrip(id_: int, type_: str, payload: dict[str, str]) -> None:
    """Any payload (any text, line breaks included) makes one well-formed frame whose data line
    decodes back to the envelope."""
    event = owner_event(_owner_row(id=id_, type=type_, data=payload))
    frame = event.frame("live")
    text = frame.decode()
    head = f"id: {id_}\nevent: {type_}\ndata: "
    assert text.startswith(head) and text.endswith("\n\n")
    body = text[len(head) : -2]
    assert "\n" not in body and "\r" not in body
    decoded = json.loads(body)
    assert decoded["data"] == payload
    assert decoded["id"] == str(id_)


def _event(id_: int, type_: str = "tool_result") -> Event:
    return Event.of(id_, type_, {"id": str(id_), "type": type_, "data": {}})


def _delta(after: int, text: str) -> Ephemeral:
    envelope = json.dumps({"type": "message_delta", "afterSeq": after, "data": {"text": text}})
    return ephemeral_frame(ephemeral_body(after, "message_delta", envelope))


def test_a_delta_goes_right_after_the_event_it_follows() -> None:
    """A delta's notification can arrive before the event it follows is read from the log (the
    text of the turn after a tool result): it waits for that event, and goes before the next."""
    deltas = [_delta(5, "a"), _delta(5, "b"), _delta(6, "c")]
    frames, taken, sent, cursor, _ = in_order(deltas, [_event(5)], cursor=4, settled=0)[:5]
    assert (taken, sent, cursor) == (2, 1, 5)
    assert [f.count(b"id: ") for f in frames] == [1, 0, 0]  # the event, then "a" and "b"
    frames, taken, sent, cursor, _ = in_order(
        deltas[2:], [_event(6), _event(7)], cursor=5, settled=0
    )[:5]
    assert (taken, sent, cursor) == (1, 2, 7)
    assert b'"c"' in frames[1] and b"id: 7" in frames[2]


def test_a_delta_waits_for_an_event_not_read_yet() -> None:
    frames, taken, sent, cursor, _ = in_order([_delta(9, "x")], [], cursor=8, settled=0)[:5]
    assert (frames, taken, sent, cursor) == ([], 0, 0, 8)
    malformed = ephemeral_frame('{"type":"message_delta","data":{"text":"y"}}')
    assert malformed.frame == b""  # not a line of ours: nothing goes out, nothing waits for it
    assert in_order([malformed], [], cursor=0, settled=0)[1] == 1


def test_a_delta_of_a_turn_whose_message_was_sent_is_dropped() -> None:
    """A read of the log can find a turn's message before the notification that carries the
    turn's last delta arrives: sent after the message, the delta would show its text twice."""
    reply = [_event(6, "assistant_message"), _event(7, "tool_call_start")]
    frames, taken, sent, cursor, settled = in_order([], reply, cursor=5, settled=0)[:5]
    assert (taken, sent, cursor, settled) == (0, 2, 7, 6)
    late, next_turn = _delta(5, "Saving it. "), _delta(8, "All")
    frames, taken, sent, cursor, settled = in_order(
        [late, next_turn], [_event(8)], cursor=7, settled=settled
    )[:5]
    assert (taken, sent, cursor) == (2, 1, 8)
    assert len(frames) == 2 and b"Saving" not in b"".join(frames)
    assert settled_by([_event(9, "model_retry"), _event(10)], 6) == 9
