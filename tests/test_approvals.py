"""Tool approval, pure: the approval record, settling decisions, and resume planning with calls
that wait for a person (SPEC section 6.2). No database."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.agent.approvals import (
    SUPERSEDED_REASON,
    Approval,
    approvals_from_events,
    denied_result,
    settle,
)
from app.agent.conversation import AssistantMessage, Message, ToolCall, ToolResult, UserMessage
from app.agent.resume import plan_resume, repair


def call(id_: str, name: str = "deploy") -> ToolCall:
    return ToolCall(id_, name, {"target": id_})


def turn(*calls: ToolCall) -> AssistantMessage:
    return AssistantMessage("", calls, "tool_use")


def ok(id_: str, name: str = "deploy") -> ToolResult:
    return ToolResult(id_, name, "done")


def event(type_: str, **data: Any) -> dict[str, Any]:
    return {"type": type_, "data": data}


# --- the record -----------------------------------------------------------------------------


def test_approvals_are_read_from_the_log() -> None:
    approvals = approvals_from_events(
        [
            event("tool_approval_requested", toolCallId="a", name="deploy", arguments={}),
            event("tool_approval_requested", toolCallId="b", name="deploy", arguments={}),
            event("tool_approval_decided", toolCallId="a", approved=False, reason="not now"),
            event("tool_approval_decided", toolCallId="a", approved=True),  # too late
            event("assistant_message", text="", toolCalls=[], stopReason="stop"),
        ]
    )
    assert approvals == {
        "a": Approval("a", False, "not now"),
        "b": Approval("b"),
    }


def test_a_denied_result_says_why() -> None:
    denied = denied_result(call("a"), "too risky")
    assert denied.wire() == {
        "toolCallId": "a",
        "name": "deploy",
        "isError": True,
        "content": "denied: too risky",
        "denied": True,
    }
    assert denied_result(call("a"), None).content == "denied: no reason given"


# --- settling -------------------------------------------------------------------------------


def test_settle_runs_the_approved_denies_the_denied_and_keeps_the_rest() -> None:
    a, b, c = call("a"), call("b"), call("c")
    conversation: list[Message] = [UserMessage("go"), turn(a, b, c)]
    approvals = {"a": Approval("a", True), "b": Approval("b", False, "no"), "c": Approval("c")}
    settlement = settle(conversation, [a, b, c], approvals)
    assert settlement.run == (a,)
    assert [r.tool_call_id for r in settlement.denied] == ["b"]
    assert settlement.denied[0].content == "denied: no"
    assert settlement.pending == (c,)


def test_a_call_never_asked_about_is_pending() -> None:
    a = call("a")
    assert settle([UserMessage("go"), turn(a)], [a], {}).pending == (a,)


def test_a_user_message_denies_what_is_still_pending() -> None:
    a, b = call("a"), call("b")
    conversation: list[Message] = [UserMessage("go"), turn(a, b), UserMessage("never mind")]
    settlement = settle(conversation, [a, b], {"a": Approval("a", True), "b": Approval("b")})
    assert settlement.run == (a,)  # a decision already made stands
    assert [(r.tool_call_id, r.content) for r in settlement.denied] == [
        ("b", f"denied: {SUPERSEDED_REASON}")
    ]
    assert settlement.pending == ()


def test_a_user_message_before_the_call_does_not_deny_it() -> None:
    a = call("a")
    conversation: list[Message] = [UserMessage("go"), UserMessage("and hurry"), turn(a)]
    assert settle(conversation, [a], {"a": Approval("a")}).pending == (a,)


# --- resume planning ------------------------------------------------------------------------


def test_a_call_waiting_for_approval_is_not_an_orphan() -> None:
    a, b = call("a"), call("b", "sleep")
    history: list[Message] = [UserMessage("go"), turn(a, b), ok("b", "sleep")]
    plan = plan_resume(history, approvals={"a": Approval("a")})
    assert plan.kind == "continue" and plan.outcome is None
    assert plan.repairs == ()
    assert plan.awaiting == (a,)
    # The waiting call is left unanswered; the other keeps its result, in call order.
    assert plan.conversation == (UserMessage("go"), turn(a, b), ok("b", "sleep"))


def test_an_approved_call_that_never_started_is_run_not_repaired() -> None:
    a = call("a")
    plan = plan_resume([UserMessage("go"), turn(a)], approvals={"a": Approval("a", True)})
    assert plan.awaiting == (a,) and plan.repairs == ()


def test_an_approved_call_that_started_and_died_is_repaired() -> None:
    a = call("a")
    plan = plan_resume(
        [UserMessage("go"), turn(a)], approvals={"a": Approval("a", True)}, started={"a"}
    )
    assert plan.awaiting == ()
    assert plan.repaired_tool_calls == ["a"]
    assert plan.repairs[0].interrupted


def test_an_answered_call_is_done_whatever_its_approval() -> None:
    a = call("a")
    history: list[Message] = [UserMessage("go"), turn(a), ok("a"), AssistantMessage("fine")]
    plan = plan_resume(history, approvals={"a": Approval("a", True)}, started={"a"})
    assert (plan.kind, plan.outcome, plan.awaiting) == ("already-complete", "succeeded", ())


def test_repair_leaves_held_calls_unanswered() -> None:
    a, b = call("a"), call("b")
    conversation, synthetic = repair([turn(a, b), ok("b")], held={"a"})
    assert conversation == [turn(a, b), ok("b")]
    assert synthetic == []


@st.composite
def approval_histories(draw: st.DrawFn) -> tuple[list[Message], dict[str, Approval], set[str]]:
    """Turns of 1..3 calls; each call answered, or waiting with a random approval state, or
    started and cut off; user messages in between."""
    history: list[Message] = [UserMessage("go")]
    approvals: dict[str, Approval] = {}
    started: set[str] = set()
    counter = 0
    for _ in range(draw(st.integers(1, 4))):
        calls = []
        for _ in range(draw(st.integers(1, 3))):
            counter += 1
            calls.append(call(f"c{counter}"))
        history.append(turn(*calls))
        for c in calls:
            fate = draw(st.sampled_from(["answered", "asked", "approved", "denied", "crashed"]))
            if fate == "answered":
                history.append(ok(c.id))
            elif fate == "asked":
                approvals[c.id] = Approval(c.id)
            elif fate in ("approved", "denied"):
                approvals[c.id] = Approval(c.id, fate == "approved", None)
                if fate == "approved" and draw(st.booleans()):
                    started.add(c.id)
            else:
                started.add(c.id)
        if draw(st.booleans()):
            history.append(UserMessage("more"))
    return history, approvals, started


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(approval_histories())
def test_every_call_is_answered_awaited_or_repaired_exactly_once(
    case: tuple[list[Message], dict[str, Approval], set[str]],
) -> None:
    history, approvals, started = case
    plan = plan_resume(history, approvals=approvals, started=started)
    calls = [c for m in plan.conversation if isinstance(m, AssistantMessage) for c in m.tool_calls]
    results = [m.tool_call_id for m in plan.conversation if isinstance(m, ToolResult)]
    awaiting = [c.id for c in plan.awaiting]
    assert len(results) == len(set(results))
    assert sorted(results + awaiting) == sorted(c.id for c in calls)
    assert not set(results) & set(awaiting)
    # Waiting is never mistaken for done, and a crash mid-tool is never re-run unasked.
    if plan.awaiting:
        assert plan.kind == "continue"
    for c in plan.awaiting:
        assert c.id in approvals
        assert not (approvals[c.id].approved and c.id in started)
    # Settling what waits leaves every call answered or still pending, never both.
    settlement = settle(plan.conversation, plan.awaiting, approvals)
    settled = {c.id for c in settlement.run} | {r.tool_call_id for r in settlement.denied}
    assert settled | {c.id for c in settlement.pending} == set(awaiting)
    assert not settled & {c.id for c in settlement.pending}
