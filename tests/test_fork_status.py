"""`domain.fork_status` against the resume planner (property tests): a fork starts `idle` only
when its first run would have nothing to answer, so idling never strands a question."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.agent.conversation import conversation_from_events
from app.agent.resume import plan_resume
from app.domain import SessionEventType, Status, fork_status

Event = dict[str, Any]


def user(text: str) -> Event:
    return {"type": SessionEventType.USER_MESSAGE, "data": {"text": text, "delivery": "queued"}}


def turn(index: int, calls: int, stop: str) -> list[Event]:
    """An assistant message with `calls` tool calls, and a result for each."""
    tool_calls = [
        {"id": f"c{index}.{i}", "name": "get_note", "arguments": {}} for i in range(calls)
    ]
    message = {
        "type": SessionEventType.ASSISTANT_MESSAGE,
        "data": {"text": f"turn {index}", "toolCalls": tool_calls, "stopReason": stop},
    }
    results = [
        {
            "type": SessionEventType.TOOL_RESULT,
            "data": {"toolCallId": c["id"], "name": "get_note", "isError": False, "content": "x"},
        }
        for c in tool_calls
    ]
    return [message, *results]


def run_end(status: str) -> Event:
    return {"type": SessionEventType.SESSION_END, "data": {"status": status}}


pieces = st.one_of(
    st.builds(lambda t: [user(t)], st.text(min_size=1, max_size=5)),
    st.builds(
        turn,
        st.integers(0, 1000),
        st.integers(0, 2),
        st.sampled_from(["stop", "tool_use", "length", "aborted", "error"]),
    ),
    st.builds(lambda s: [run_end(s)], st.sampled_from(["succeeded", "failed", "cancelled"])),
)


@given(st.lists(pieces, min_size=1, max_size=12), st.data())
def test_an_idle_fork_has_nothing_left_to_answer(parts: list[list[Event]], data: Any) -> None:
    log = [user("opening")]
    for event in (event for part in parts for event in part):
        # A run ends succeeded only right after a final answer, as the runner writes it.
        previous = log[-1]
        succeeded = event["type"] == SessionEventType.SESSION_END and (
            event["data"]["status"] == "succeeded"
        )
        answered = previous["type"] == SessionEventType.ASSISTANT_MESSAGE and (
            fork_status(previous["type"], previous["data"], False) == Status.IDLE
        )
        if answered or not succeeded:
            log.append(event)
    at = data.draw(st.integers(1, len(log)))
    prefix = [{**e, "seq": seq} for seq, e in enumerate(log[:at], start=1)]
    last = prefix[-1]
    if fork_status(last["type"], last["data"], edited=False) == Status.IDLE:
        plan = plan_resume(conversation_from_events(prefix))
        assert (plan.kind, plan.outcome) == ("already-complete", "succeeded")


@given(st.sampled_from(list(SessionEventType)), st.dictionaries(st.text(max_size=8), st.none()))
def test_an_edit_is_always_answered(type_: str, data: dict[str, Any]) -> None:
    assert fork_status(type_, data, edited=True) == Status.QUEUED
