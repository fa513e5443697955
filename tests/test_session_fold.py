"""SessionFold (ferryman/fold.py), pure: properties over generated session logs (replays and
duplicates change nothing; a resume fails exactly its repaired calls; a stream's fold ends as
a transcript's), and examples of streamed text being replaced or dropped."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ferryman import SessionFold, StreamEvent
from ferryman.fold import INTERRUPTED, Conversation

TS = "2025-01-01T00:00:00.000Z"


def durable(seq: int, type_: str, data: dict[str, Any]) -> StreamEvent:
    envelope = {
        "id": str(seq),
        "type": type_,
        "sessionId": "s1",
        "ownerId": "o1",
        "ts": TS,
        "seq": seq,
        "attempt": 1,
        "data": data,
        "phase": "live",
    }
    return StreamEvent(type_, str(seq), data, envelope)


def delta(text: str) -> StreamEvent:
    envelope = {"type": "message_delta", "sessionId": "s1", "ownerId": "o1", "ts": TS}
    return StreamEvent("message_delta", None, {"text": text}, {**envelope, "data": {"text": text}})


def caught_up(cursor: int) -> StreamEvent:
    data = {"replayed": cursor, "fromEventId": "0", "cursor": str(cursor)}
    return StreamEvent("caught_up", None, data, data)


@dataclass
class Log:
    """A session log being written: durable events numbered from 1, deltas between them."""

    frames: list[StreamEvent] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    seq: int = 0

    def add(self, type_: str, **data: Any) -> None:
        self.seq += 1
        self.frames.append(durable(self.seq, type_, data))

    def stream(self, texts: list[str]) -> None:
        self.frames.extend(delta(text) for text in texts)


STEPS = [
    "start",
    "turn",
    "tool",
    "approval",
    "crash",
    "end",
    "message",
    "question",
    "retry",
    "wait",
]
words = st.text(alphabet="abc ", max_size=4)


@st.composite
def logs(draw: st.DrawFn) -> list[StreamEvent]:
    log = Log()
    log.add("user_message", text=draw(words), delivery="queued")
    for step in draw(st.lists(st.sampled_from(STEPS), max_size=14)):
        _STEP_WRITERS[step](draw, log)
    return log.frames


def _start(draw: st.DrawFn, log: Log) -> None:
    log.add("session_start", workerId="w", pid=1, attempt=1)


def _turn(draw: st.DrawFn, log: Log) -> None:
    log.stream(draw(st.lists(words, max_size=3)))
    ids = [f"call_{len(log.calls) + i}" for i in range(draw(st.integers(0, 2)))]
    log.calls.extend(ids)
    calls = [{"id": i, "name": "put_note", "arguments": {"key": i}} for i in ids]
    stop = "tool_use" if ids else draw(st.sampled_from(["stop", "length", "aborted"]))
    log.add("assistant_message", text=draw(words), toolCalls=calls, stopReason=stop)


def _tool(draw: st.DrawFn, log: Log) -> None:
    if not log.calls:
        return
    call_id = draw(st.sampled_from(log.calls))
    log.add("tool_call_start", toolCallId=call_id, name="put_note", arguments={})
    if draw(st.booleans()):
        result: dict[str, Any] = {"isError": draw(st.booleans()), "content": draw(words)}
        if result["isError"] and draw(st.booleans()):
            result["timedOut"] = True
        log.add("tool_result", toolCallId=call_id, name="put_note", **result)


def _approval(draw: st.DrawFn, log: Log) -> None:
    if not log.calls:
        return
    call_id = draw(st.sampled_from(log.calls))
    log.add("tool_approval_requested", toolCallId=call_id, name="put_note", arguments={})
    if draw(st.booleans()):
        log.add("tool_approval_decided", toolCallId=call_id, approved=draw(st.booleans()))


def _crash(draw: st.DrawFn, log: Log) -> None:
    log.stream(draw(st.lists(words, max_size=2)))
    if draw(st.booleans()):
        log.add("session_interrupted", reason="shutdown")
    repaired = draw(st.lists(st.sampled_from(log.calls), unique=True)) if log.calls else []
    log.add("session_resumed", reason="crash", attempt=2, repairedToolCalls=repaired)


def _end(draw: st.DrawFn, log: Log) -> None:
    status = draw(st.sampled_from(["succeeded", "failed", "cancelled", "waiting"]))
    error = {"code": "X", "message": "m"} if status == "failed" else None
    log.add("session_end", status=status, **({"error": error} if error else {}))


def _message(draw: st.DrawFn, log: Log) -> None:
    log.add("user_message", text=draw(words), delivery=draw(st.sampled_from(["queued", "steer"])))


def _question(draw: st.DrawFn, log: Log) -> None:
    log.add("user_question", question=draw(words))


def _retry(draw: st.DrawFn, log: Log) -> None:
    log.stream(draw(st.lists(words, min_size=1, max_size=2)))
    log.add("model_retry", attempt=1, delayMs=10, reason="server_error")


def _wait(draw: st.DrawFn, log: Log) -> None:
    # Before a model call, on a provider budget (docs/budgets.md): no text of its own.
    reason = draw(st.sampled_from(["concurrency", "rpm", "tpm", "paused"]))
    log.add("model_wait", reason=reason, **({} if reason == "concurrency" else {"untilMs": 1}))


_STEP_WRITERS = {
    "start": _start,
    "turn": _turn,
    "tool": _tool,
    "approval": _approval,
    "crash": _crash,
    "end": _end,
    "message": _message,
    "question": _question,
    "retry": _retry,
    "wait": _wait,
}


def fold(frames: list[StreamEvent]) -> Conversation:
    folding = SessionFold()
    for frame in frames:
        folding.apply(frame)
    return folding.snapshot()


def durable_only(frames: list[StreamEvent]) -> list[StreamEvent]:
    return [f for f in frames if f.id is not None]


# --- properties -------------------------------------------------------------------------------


@settings(max_examples=300)
@given(logs())
def test_each_durable_event_twice_is_once(frames: list[StreamEvent]) -> None:
    doubled = [copy for f in frames for copy in ([f, f] if f.id is not None else [f])]
    assert fold(doubled) == fold(frames)


@settings(max_examples=300)
@given(logs(), st.data())
def test_a_reconnect_that_replays_changes_nothing(frames: list[StreamEvent], data: Any) -> None:
    """Seen up to `k`, then a reconnect from an older cursor replays the durable events from
    `j` (deltas are never replayed), with a `caught_up`, then the rest."""
    k = data.draw(st.integers(0, len(frames)))
    j = data.draw(st.integers(0, k))
    replay = [*frames[:k], *durable_only(frames[j:k]), caught_up(k), *frames[k:]]
    assert fold(replay) == fold(frames)


@settings(max_examples=200)
@given(logs(), st.data())
def test_any_prefix_twice_is_once(frames: list[StreamEvent], data: Any) -> None:
    prefix = durable_only(frames)[: data.draw(st.integers(0, len(frames)))]
    folding = SessionFold()
    folding.apply_all(prefix)
    once = folding.snapshot()
    assert not folding.apply_all(prefix), "a repeat reported a change"
    assert folding.snapshot() == once


@settings(max_examples=300)
@given(logs())
def test_a_stream_folds_as_its_transcript(frames: list[StreamEvent]) -> None:
    """Deltas only ever show a draft: without it, the picture is the transcript's."""
    streamed, logged = fold(frames), fold(durable_only(frames))
    assert [m for m in streamed.messages if not m.streaming] == list(logged.messages)
    assert (streamed.tool_calls, streamed.status, streamed.last_seq) == (
        logged.tool_calls,
        logged.status,
        logged.last_seq,
    )
    if frames and frames[-1].id is not None:
        assert streamed.draft is None  # a turn's deltas never outlive a durable event


@settings(max_examples=300)
@given(logs(), st.data())
def test_a_resume_fails_exactly_its_repaired_calls(frames: list[StreamEvent], data: Any) -> None:
    before = fold(frames)
    known = [c.id for c in before.tool_calls]
    repaired = data.draw(st.lists(st.sampled_from([*known, "call_unknown"]), unique=True))
    seq = before.last_seq + 1
    resumed = durable(seq, "session_resumed", {"reason": "crash", "repairedToolCalls": repaired})
    after = fold([*frames, resumed])
    calls_before = {c.id: c for c in before.tool_calls}
    calls_after = {c.id: c for c in after.tool_calls}
    assert set(calls_after) == set(calls_before) | set(repaired)
    for call_id, call in calls_after.items():
        if call_id in repaired:
            assert (call.status, call.error, call.interrupted) == ("failed", INTERRUPTED, True)
        else:
            assert call == calls_before[call_id]
    assert (after.status, after.draft) == ("running", None)


# --- examples ---------------------------------------------------------------------------------


def test_streamed_text_is_replaced_by_the_final_message() -> None:
    folding = SessionFold()
    folding.apply(durable(1, "user_message", {"text": "hi", "delivery": "queued"}))
    assert folding.status == "queued"
    folding.apply(durable(2, "session_start", {"workerId": "w", "pid": 1, "attempt": 1}))
    for text in ("Hel", "lo"):
        assert folding.apply(delta(text))
    assert [(m.role, m.text, m.streaming) for m in folding.messages] == [
        ("user", "hi", False),
        ("assistant", "Hello", True),
    ]
    folding.apply(durable(3, "assistant_message", {"text": "Hello!", "stopReason": "stop"}))
    folding.apply(durable(4, "session_end", {"status": "succeeded"}))
    assert [(m.role, m.text, m.seq) for m in folding.messages] == [
        ("user", "hi", 1),
        ("assistant", "Hello!", 3),
    ]
    assert (folding.status, folding.draft, folding.last_seq) == ("succeeded", None, 4)


def test_a_retried_turn_drops_its_partial_text() -> None:
    folding = SessionFold()
    folding.apply(durable(1, "user_message", {"text": "hi", "delivery": "queued"}))
    folding.apply(delta("partial ans"))
    folding.apply(durable(2, "model_retry", {"attempt": 1, "delayMs": 5, "reason": "timeout"}))
    assert folding.draft is None
    folding.apply(delta("full "))
    folding.apply(delta("answer"))
    assert folding.messages[-1].text == "full answer"
    folding.apply(durable(3, "assistant_message", {"text": "full answer", "stopReason": "stop"}))
    assert [m.text for m in folding.messages] == ["hi", "full answer"]


def test_a_budget_wait_changes_nothing_but_the_cursor() -> None:
    folding = SessionFold()
    folding.apply(durable(1, "user_message", {"text": "hi", "delivery": "queued"}))
    before = (folding.messages, folding.status, folding.draft)
    assert folding.apply(durable(2, "model_wait", {"reason": "paused", "untilMs": 1}))
    assert (folding.messages, folding.status, folding.draft) == before
    assert folding.last_seq == 2


def test_an_interrupted_turn_is_not_duplicated() -> None:
    """A worker dies mid-stream; its successor streams the turn again from the start."""
    folding = SessionFold()
    folding.apply(durable(1, "user_message", {"text": "hi", "delivery": "queued"}))
    folding.apply(durable(2, "session_start", {"attempt": 1}))
    folding.apply(delta("The ans"))
    folding.apply(durable(3, "session_resumed", {"attempt": 2, "repairedToolCalls": []}))
    folding.apply(delta("The answer"))
    assert [m.text for m in folding.messages] == ["hi", "The answer"]


def test_tool_calls_go_through_their_states() -> None:
    folding = SessionFold()
    call = {"id": "c1", "name": "put_note", "arguments": {"key": "k"}}
    folding.apply(durable(1, "user_message", {"text": "note", "delivery": "queued"}))
    folding.apply(durable(2, "session_start", {}))
    folding.apply(
        durable(3, "assistant_message", {"text": "", "toolCalls": [call], "stopReason": "tool_use"})
    )
    states = [folding.tool_calls["c1"].status]
    folding.apply(durable(4, "tool_approval_requested", {"toolCallId": "c1", "name": "put_note"}))
    folding.apply(durable(5, "session_end", {"status": "waiting"}))
    states.append(folding.tool_calls["c1"].status)
    folding.apply(durable(6, "tool_approval_decided", {"toolCallId": "c1", "approved": True}))
    states.append(folding.tool_calls["c1"].status)
    assert folding.status == "queued"
    folding.apply(durable(7, "session_resumed", {"repairedToolCalls": []}))
    folding.apply(durable(8, "tool_call_start", {"toolCallId": "c1", "name": "put_note"}))
    states.append(folding.tool_calls["c1"].status)
    result = {"toolCallId": "c1", "name": "put_note", "isError": False, "content": "saved"}
    folding.apply(durable(9, "tool_result", result))
    done = folding.tool_calls["c1"]
    assert [*states, done.status] == [
        "pending",
        "awaiting_approval",
        "approved",
        "running",
        "succeeded",
    ]
    assert (done.name, done.arguments, done.result, done.error) == (
        "put_note",
        {"key": "k"},
        "saved",
        None,
    )
    assert folding.messages[-1].tool_call_ids == ("c1",)


def test_a_transcripts_events_fold_like_frames() -> None:
    """`Event` models (a transcript page) and `StreamEvent` frames fold alike."""
    log = Log()
    log.add("user_message", text="hi", delivery="queued")
    log.add("session_start", attempt=1)
    log.add("assistant_message", text="yo", toolCalls=[], stopReason="stop")
    log.add("session_end", status="succeeded")
    from_events = SessionFold()
    from_events.apply_all([frame.event() for frame in log.frames])
    assert from_events.snapshot() == fold(log.frames)
    assert not from_events.apply(caught_up(4))


def test_a_delta_of_a_turn_that_ended_is_stale_and_the_cursor_holds_chunks() -> None:
    """As the TypeScript fold: a late chunk starts no new draft; mid-turn, `<seq>.<chunk>`."""

    def chunk(after: int, n: int, text: str) -> StreamEvent:
        envelope = {"type": "message_delta", "afterSeq": after, "chunk": n, "data": {"text": text}}
        return StreamEvent("message_delta", f"{after}.{n}", {"text": text}, envelope)

    folding = SessionFold()
    folding.apply(durable(1, "session_start", {"workerId": "w", "pid": 1, "attempt": 1}))
    folding.apply_all([chunk(1, 1, "Half "), chunk(1, 2, "an ans")])
    assert folding.cursor == "1.2"
    folding.apply(durable(2, "model_retry", {"attempt": 1, "delayMs": 10}))
    assert folding.cursor == 2
    assert not folding.apply(chunk(1, 3, "late"))  # a chunk of the retried turn
    assert folding.draft is None
    assert folding.apply(chunk(2, 1, "Whole"))
    folding.apply(durable(3, "assistant_message", {"text": "Whole", "stopReason": "stop"}))
    assert not folding.apply(chunk(2, 2, " late"))  # a chunk after its final message
    assert (folding.draft, folding.cursor) == (None, 3)
    assert [m.text for m in folding.messages] == ["Whole"]


def test_a_delegate_call_runs_until_its_result_and_names_its_child() -> None:
    """docs/delegation.md: `delegate_call` starts the call with its child session's id; the
    child's end (`delegate_result`) shows on it; the `tool_result` the parent's run writes
    settles it."""
    call = {"id": "c1", "name": "agent__researcher", "arguments": {"task": "look"}}
    folding = SessionFold()
    folding.apply(durable(1, "assistant_message", {"text": "", "toolCalls": [call]}))
    made = {"toolCallId": "c1", "name": call["name"], "arguments": call["arguments"]}
    folding.apply(durable(2, "delegate_call", {**made, "childSessionId": "k1"}))
    assert folding.tool_calls["c1"].status == "running"
    assert folding.tool_calls["c1"].child_session_id == "k1"
    end = {"toolCallId": "c1", "childSessionId": "k1", "status": "succeeded", "answer": "A"}
    folding.apply(durable(3, "delegate_result", end))
    ended = folding.tool_calls["c1"]
    assert ended.status == "running"  # until the parent's run answers it
    assert ended.delegated is not None and (ended.delegated.status, ended.delegated.answer) == (
        "succeeded",
        "A",
    )
    result = {"toolCallId": "c1", "name": call["name"], "isError": False, "content": "A"}
    folding.apply(durable(4, "tool_result", result))
    settled = folding.tool_calls["c1"]
    assert (settled.status, settled.result, settled.child_session_id) == ("succeeded", "A", "k1")
