"""Resume planning (SPEC section 5, "Resume"): pure, no database.

Example-based tests of every rule, then property tests over generated transcripts that model a
crash at any point (unanswered, reordered, duplicated and orphan tool results, trailing frames
that were cut off).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.agent.conversation import (
    INTERRUPTED_STOPS,
    AssistantMessage,
    Message,
    StopReason,
    ToolCall,
    ToolResult,
    UserMessage,
)
from app.agent.resume import (
    INTERRUPTED_CONTENT,
    ResumePlan,
    completed_turns,
    interrupted_result,
    plan_resume,
    repair,
)
from app.runtime.runner import resume_reason

# --- helpers --------------------------------------------------------------------------------


def user(text: str = "hi") -> UserMessage:
    return UserMessage(text)


def call(id_: str, name: str = "sleep", **arguments: Any) -> ToolCall:
    return ToolCall(id_, name, dict(arguments))


def assistant(text: str = "", *calls: ToolCall, stop: StopReason | None = None) -> AssistantMessage:
    return AssistantMessage(text, tuple(calls), stop or ("tool_use" if calls else "stop"))


def result(
    id_: str,
    name: str = "sleep",
    content: str = "ok",
    *,
    error: bool = False,
    interrupted: bool = False,
) -> ToolResult:
    return ToolResult(id_, name, content, is_error=error, interrupted=interrupted)


def is_synthetic(message: Message) -> bool:
    return (
        isinstance(message, ToolResult)
        and message.interrupted
        and message.is_error
        and message.content == INTERRUPTED_CONTENT
    )


# --- start ----------------------------------------------------------------------------------


def test_empty_history_starts() -> None:
    plan = plan_resume([])
    assert plan.kind == "start"
    assert plan.conversation == ()
    assert plan.repairs == ()
    assert plan.repaired_tool_calls == []


def test_prompt_only_starts_from_the_prompt() -> None:
    prompt = user("do it")
    plan = plan_resume([prompt])
    assert plan.kind == "start"
    assert plan.conversation == (prompt,)
    assert plan.stripped == 0


@pytest.mark.parametrize("stop", ["aborted", "length", "error"])
def test_only_an_interrupted_frame_after_the_prompt_starts(stop: StopReason) -> None:
    prompt = user("do it")
    plan = plan_resume([prompt, assistant("partial", stop=stop)])
    assert plan.kind == "start"
    assert plan.conversation == (prompt,)
    assert plan.stripped == 1


def test_orphan_results_alone_are_no_usable_history() -> None:
    prompt = user("do it")
    plan = plan_resume([prompt, result("nobody-called-me")])
    assert plan.kind == "start"
    assert plan.conversation == (prompt,)
    assert plan.repairs == ()


# --- continue -------------------------------------------------------------------------------


def test_unanswered_calls_are_repaired_in_call_order() -> None:
    a = assistant("", call("c1"), call("c2", "put_note", key="k", text="t"))
    history: list[Message] = [user(), a]
    plan = plan_resume(history)
    assert plan.kind == "continue"
    assert plan.repaired_tool_calls == ["c1", "c2"]
    assert plan.repairs == (
        interrupted_result("c1", "sleep"),
        interrupted_result("c2", "put_note"),
    )
    for repaired in plan.repairs:
        assert repaired.is_error and repaired.interrupted
        assert repaired.content == INTERRUPTED_CONTENT == "worker interrupted"
        assert repaired.wire()["interrupted"] is True
        assert repaired.wire()["isError"] is True
    assert plan.conversation == (history[0], a, *plan.repairs)


def test_only_the_unanswered_calls_are_repaired() -> None:
    a = assistant("", call("c1"), call("c2"), call("c3"))
    r1 = result("c1")
    plan = plan_resume([user(), a, r1])
    assert plan.kind == "continue"
    assert plan.repaired_tool_calls == ["c2", "c3"]
    assert plan.conversation[:3] == (user(), a, r1)
    assert plan.conversation[3:] == plan.repairs


def test_all_calls_answered_continues_without_repairs() -> None:
    a = assistant("", call("c1"))
    history: list[Message] = [user(), a, result("c1")]
    plan = plan_resume(history)
    assert plan.kind == "continue"
    assert plan.repairs == ()
    assert plan.conversation == tuple(history)


def test_tail_user_message_continues() -> None:
    history: list[Message] = [user("one"), assistant("answer"), user("two")]
    plan = plan_resume(history)
    assert plan.kind == "continue"
    assert plan.conversation == tuple(history)
    assert plan.repairs == ()


@pytest.mark.parametrize("stop", ["aborted", "length", "error"])
def test_trailing_interrupted_frame_is_stripped(stop: StopReason) -> None:
    a = assistant("", call("c1"))
    r1 = result("c1")
    plan = plan_resume([user(), a, r1, assistant("half a sent", stop=stop)])
    assert plan.kind == "continue"
    assert plan.stripped == 1
    assert plan.conversation == (user(), a, r1)


def test_trailing_interrupted_frame_with_calls_is_stripped_not_repaired() -> None:
    a = assistant("", call("c1"))
    r1 = result("c1")
    cut = assistant("", call("c2"), stop="length")
    plan = plan_resume([user(), a, r1, cut])
    assert plan.kind == "continue"
    assert plan.stripped == 1
    assert plan.repairs == ()
    assert plan.conversation == (user(), a, r1)


def test_trailing_empty_frame_is_stripped() -> None:
    a = assistant("", call("c1"))
    r1 = result("c1")
    plan = plan_resume([user(), a, r1, assistant("", stop="stop")])
    assert plan.kind == "continue"
    assert plan.stripped == 1
    assert plan.conversation == (user(), a, r1)


def test_several_trailing_frames_are_stripped() -> None:
    a = assistant("", call("c1"))
    r1 = result("c1")
    frames = [assistant("x", stop="error"), assistant(""), assistant("y", stop="aborted")]
    plan = plan_resume([user(), a, r1, *frames])
    assert plan.stripped == 3
    assert plan.conversation == (user(), a, r1)


def test_an_interrupted_frame_that_is_not_trailing_is_kept() -> None:
    # `length` puts the session in `waiting`; the next user message continues it.
    cut = assistant("the first half", stop="length")
    history: list[Message] = [user("one"), cut, user("go on")]
    plan = plan_resume(history)
    assert plan.kind == "continue"
    assert plan.stripped == 0
    assert plan.conversation == tuple(history)


def test_a_completed_frame_is_kept_after_stripping() -> None:
    final = assistant("done")
    plan = plan_resume([user(), final, assistant("", stop="aborted")])
    assert plan.stripped == 1
    assert plan.kind == "already-complete"
    assert plan.outcome == "succeeded"
    assert plan.conversation == (user(), final)


def test_a_tool_use_frame_with_calls_is_kept_and_repaired() -> None:
    a = assistant("let me sleep", call("c1"))
    plan = plan_resume([user(), a])
    assert plan.stripped == 0
    assert plan.kind == "continue"
    assert plan.repaired_tool_calls == ["c1"]


# --- already-complete -----------------------------------------------------------------------


def test_final_answer_is_already_complete() -> None:
    history: list[Message] = [
        user(),
        assistant("", call("c1")),
        result("c1"),
        assistant("all done"),
    ]
    plan = plan_resume(history)
    assert plan.kind == "already-complete"
    assert plan.outcome == "succeeded"
    assert plan.repairs == ()
    assert plan.conversation == tuple(history)


def test_successful_ask_user_at_the_tail_is_already_complete_waiting() -> None:
    a = assistant("", call("c1", "ask_user", question="which?"))
    history: list[Message] = [user(), a, result("c1", "ask_user", "question sent")]
    plan = plan_resume(history)
    assert plan.kind == "already-complete"
    assert plan.outcome == "waiting"
    assert plan.repairs == ()
    assert plan.conversation == tuple(history)


def test_any_tool_that_ends_the_turn_waits_at_the_tail() -> None:
    """Which tools end a turn is the registry's to say (`Tool.ends_turn`), not a name the
    planner knows: a plug-in's tool waits like ask_user, and ask_user only when it is named."""
    a = assistant("", call("c1", "approve", amount=3))
    history: list[Message] = [user(), a, result("c1", "approve", "sent for approval")]
    plan = plan_resume(history, ends_turn={"ask_user", "approve"})
    assert (plan.kind, plan.outcome) == ("already-complete", "waiting")
    assert plan_resume(history).kind == "continue"  # by default only ask_user ends a turn
    b = assistant("", call("c2", "ask_user", question="which?"))
    asked: list[Message] = [user(), b, result("c2", "ask_user", "question sent")]
    assert plan_resume(asked, ends_turn={"approve"}).kind == "continue"


def test_ask_user_that_errored_is_not_complete() -> None:
    a = assistant("", call("c1", "ask_user"))
    history: list[Message] = [user(), a, result("c1", "ask_user", "invalid arguments", error=True)]
    plan = plan_resume(history)
    assert plan.kind == "continue"
    assert plan.outcome is None
    assert plan.repairs == ()


def test_unanswered_ask_user_is_repaired_not_complete() -> None:
    a = assistant("", call("c1", "ask_user", question="which?"))
    plan = plan_resume([user(), a])
    assert plan.kind == "continue"
    assert plan.repaired_tool_calls == ["c1"]


def test_answered_ask_user_followed_by_a_user_message_continues() -> None:
    a = assistant("", call("c1", "ask_user", question="which?"))
    history: list[Message] = [user(), a, result("c1", "ask_user", "sent"), user("the blue one")]
    plan = plan_resume(history)
    assert plan.kind == "continue"
    assert plan.conversation == tuple(history)


def test_other_tool_result_at_the_tail_continues() -> None:
    plan = plan_resume([user(), assistant("", call("c1", "get_note")), result("c1", "get_note")])
    assert plan.kind == "continue"
    assert plan.outcome is None


# --- placement, duplicates, orphans ---------------------------------------------------------


def test_results_are_re_placed_after_their_call_in_call_order() -> None:
    a = assistant("", call("c1"), call("c2"), call("c3"))
    r1, r2, r3 = result("c1", content="1"), result("c2", content="2"), result("c3", content="3")
    plan = plan_resume([user(), a, r3, r1, r2])
    assert plan.conversation == (user(), a, r1, r2, r3)
    assert plan.repairs == ()


def test_a_result_logged_after_later_messages_moves_back_to_its_call() -> None:
    # A durable repair appended to the log after the fact.
    a1 = assistant("", call("c1"))
    a2 = assistant("", call("c2"))
    r1, r2 = result("c1"), result("c2")
    plan = plan_resume([user(), a1, a2, r2, r1])
    assert plan.conversation == (user(), a1, r1, a2, r2)


def test_duplicate_results_are_dropped_first_one_wins() -> None:
    a = assistant("", call("c1"))
    first = result("c1", content="first")
    again = result("c1", content="again")
    plan = plan_resume([user(), a, first, again])
    assert plan.conversation == (user(), a, first)
    assert plan.repairs == ()


def test_orphan_results_are_dropped() -> None:
    a = assistant("", call("c1"))
    r1 = result("c1")
    plan = plan_resume([user(), result("ghost"), a, r1, result("ghost2")])
    assert plan.conversation == (user(), a, r1)
    assert plan.repairs == ()


def test_orphan_result_does_not_hide_a_final_answer() -> None:
    final = assistant("done")
    plan = plan_resume([user(), final, result("ghost")])
    assert plan.kind == "already-complete"
    assert plan.outcome == "succeeded"
    assert plan.conversation == (user(), final)


def test_orphan_result_does_not_shield_an_interrupted_frame() -> None:
    a = assistant("", call("c1"))
    r1 = result("c1")
    plan = plan_resume([user(), a, r1, assistant("cut", stop="aborted"), result("ghost")])
    assert plan.stripped == 1
    assert plan.conversation == (user(), a, r1)


def test_repair_returns_the_synthetic_results() -> None:
    a = assistant("", call("c1"), call("c2"))
    r2 = result("c2")
    conversation, synthetic = repair([user(), a, r2])
    assert synthetic == [interrupted_result("c1", "sleep")]
    assert conversation == [user(), a, synthetic[0], r2]


def test_durable_repairs_appended_to_the_log_replan_to_the_same_conversation() -> None:
    a = assistant("", call("c1"), call("c2"))
    history: list[Message] = [user(), a, result("c1")]
    first = plan_resume(history)
    second = plan_resume([*history, *first.repairs])
    assert second.kind == "continue"
    assert second.repairs == ()
    assert second.conversation == first.conversation


# --- completed turns ------------------------------------------------------------------------


def test_completed_turns() -> None:
    a1 = assistant("", call("c1"))
    a2 = assistant("", call("c2"), call("c3"))
    assert completed_turns([]) == 0
    assert completed_turns([user()]) == 0
    assert completed_turns([user(), assistant("hello")]) == 1
    assert completed_turns([user(), a1]) == 0
    assert completed_turns([user(), a1, result("c1")]) == 1
    assert completed_turns([user(), a1, result("c1", error=True)]) == 1
    assert completed_turns([user(), a1, interrupted_result("c1", "sleep")]) == 0
    assert completed_turns([user(), a1, result("c1"), a2, result("c2")]) == 1
    assert completed_turns([user(), a1, result("c1"), a2, result("c2"), result("c3")]) == 2


# --- resume reason --------------------------------------------------------------------------


def rows(*types: str) -> list[dict[str, Any]]:
    return [{"type": t, "data": {}, "seq": i + 1} for i, t in enumerate(types)]


@pytest.mark.parametrize(
    ("types", "expected"),
    [
        ((), "crash"),
        (("user_message",), "crash"),
        (("user_message", "session_start", "assistant_message", "session_end"), "follow_up"),
        (
            ("user_message", "session_start", "assistant_message", "session_end", "user_message"),
            "follow_up",
        ),
        (("user_message", "session_start", "assistant_message"), "crash"),
        (("user_message", "session_start", "assistant_message", "tool_call_start"), "crash"),
        (("user_message", "session_start", "tool_result"), "crash"),
        (("user_message", "session_start", "session_interrupted"), "crash"),
        (("session_start", "session_end", "session_resumed"), "crash"),
        (("session_start", "session_end", "session_resumed", "assistant_message"), "crash"),
        (
            (
                "session_start",
                "session_end",
                "user_message",
                "session_resumed",
                "session_end",
                "user_message",
            ),
            "follow_up",
        ),
    ],
)
def test_resume_reason(types: tuple[str, ...], expected: str) -> None:
    assert resume_reason(rows(*types)) == expected


def test_a_handover_on_shutdown_is_not_a_crash() -> None:
    handed_over = [*rows("user_message", "session_start"), _interrupted("shutdown")]
    assert resume_reason(handed_over) == "shutdown"
    assert resume_reason([*handed_over, *rows("tool_call_start")]) == "crash"


def _interrupted(reason: str) -> dict[str, Any]:
    return {"type": "session_interrupted", "data": {"reason": reason}}


# --- property tests over generated transcripts ----------------------------------------------

TOOL_NAMES = ["sleep", "put_note", "get_note", "ask_user", "custom"]
STOP_REASONS: list[StopReason] = ["stop", "tool_use", "length", "error", "aborted"]


@st.composite
def transcripts(draw: st.DrawFn) -> list[Message]:
    """A realistic-to-hostile message log cut off at any point.

    User messages and assistant turns with 0..3 calls (ids unique across the log), each call
    answered zero, one or two times (results placed anywhere after the call, so possibly out of
    order or after later messages), orphan results sprinkled in, then a random truncation.
    """
    counter = 0
    log: list[Message] = []
    log.append(UserMessage(draw(st.sampled_from(["hi", "do it", "again"]))))
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.integers(0, 4)) == 0:
            log.append(UserMessage(draw(st.sampled_from(["more", "stop that", "ok"]))))
            continue
        n_calls = draw(st.integers(0, 3))
        calls = []
        for _ in range(n_calls):
            counter += 1
            calls.append(ToolCall(f"c{counter}", draw(st.sampled_from(TOOL_NAMES)), {"n": counter}))
        default: StopReason = "tool_use" if calls else "stop"
        stop = draw(st.one_of(st.just(default), st.sampled_from(STOP_REASONS)))
        text = draw(st.sampled_from(["", "", "thinking", "the answer"]))
        log.append(AssistantMessage(text, tuple(calls), stop))
        pending: list[ToolResult] = []
        for c in calls:
            copies = draw(st.sampled_from([0, 1, 1, 1, 1, 2]))
            for copy in range(copies):
                kind = draw(st.sampled_from(["ok", "ok", "error", "interrupted"]))
                pending.append(
                    ToolResult(
                        c.id,
                        c.name,
                        f"{kind}-{c.id}-{copy}",
                        is_error=kind != "ok",
                        interrupted=kind == "interrupted",
                    )
                )
        if draw(st.booleans()):
            pending = draw(st.permutations(pending))
        log.extend(pending)
    # Some results land late (after later messages): move a few forward.
    for _ in range(draw(st.integers(0, 2))):
        indices = [i for i, m in enumerate(log) if isinstance(m, ToolResult)]
        if not indices:
            break
        i = draw(st.sampled_from(indices))
        moved = log.pop(i)
        j = draw(st.integers(i, len(log)))
        log.insert(j, moved)
    # Orphans: results whose call is nowhere.
    for k in range(draw(st.integers(0, 2))):
        j = draw(st.integers(0, len(log)))
        log.insert(j, ToolResult(f"orphan{k}", "sleep", "lost", is_error=False))
    # The crash: the log ends at any point.
    cut = draw(st.integers(0, len(log)))
    return log[:cut] if draw(st.booleans()) else log


def call_ids(messages: Sequence[Message]) -> set[str]:
    return {c.id for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls}


def non_results(messages: Sequence[Message]) -> list[Message]:
    return [m for m in messages if not isinstance(m, ToolResult)]


def discardable(message: Message) -> bool:
    return isinstance(message, AssistantMessage) and (
        message.is_empty or message.stop_reason in INTERRUPTED_STOPS
    )


def assert_well_formed(conversation: Sequence[Message]) -> None:
    index = 0
    seen_results: set[str] = set()
    calls = call_ids(conversation)
    while index < len(conversation):
        message = conversation[index]
        assert not isinstance(message, ToolResult), f"result without its call at {index}"
        index += 1
        if isinstance(message, AssistantMessage):
            for c in message.tool_calls:
                assert index < len(conversation), f"call {c.id} has no result"
                answer = conversation[index]
                assert isinstance(answer, ToolResult), f"call {c.id} has no result"
                assert answer.tool_call_id == c.id, "results not in call order"
                assert answer.tool_call_id not in seen_results
                seen_results.add(answer.tool_call_id)
                index += 1
    assert seen_results == calls


def is_subsequence(small: Sequence[Any], big: Sequence[Any]) -> bool:
    it = iter(big)
    return all(any(x is y for y in it) for x in small)


# Generating a transcript costs more than checking it: every property is checked on each one.


def check_plan_is_always_well_formed(history: list[Message]) -> None:
    plan = plan_resume(history)
    assert_well_formed(plan.conversation)
    assert plan.kind in ("start", "continue", "already-complete")
    assert (plan.outcome is not None) == (plan.kind == "already-complete")
    if plan.kind == "start":
        assert all(isinstance(m, UserMessage) for m in plan.conversation)
        assert plan.repairs == ()


def check_plan_is_idempotent(history: list[Message]) -> None:
    plan = plan_resume(history)
    again = plan_resume(plan.conversation)
    assert again.repairs == ()
    assert again.stripped == 0
    assert again.conversation == plan.conversation
    assert again.kind == plan.kind
    assert again.outcome == plan.outcome


def check_replanning_the_durable_log_is_stable(history: list[Message]) -> None:
    """What the runner really does: repairs are appended to the log, then a later resume plans
    the whole log again."""
    plan = plan_resume(history)
    again = plan_resume([*history, *plan.repairs])
    assert again.repairs == ()
    assert again.conversation == plan.conversation
    assert again.kind == plan.kind


def check_nothing_durable_is_lost(history: list[Message]) -> None:
    plan = plan_resume(history)
    out = plan.conversation
    kept = non_results(out)
    everything = non_results(history)
    # Only a tail of discardable assistant frames is set aside; the rest keeps its order.
    assert len(kept) + plan.stripped == len(everything)
    assert all(a is b for a, b in zip(kept, everything, strict=False))
    stripped = everything[len(kept) :]
    assert all(discardable(m) for m in stripped)
    assert all(isinstance(m, AssistantMessage) for m in stripped)
    # Every user message survives.
    assert [m for m in out if isinstance(m, UserMessage)] == [
        m for m in history if isinstance(m, UserMessage)
    ]
    # Every existing result for a kept call is kept: the original, first one.
    kept_calls = call_ids(kept)
    first: dict[str, ToolResult] = {}
    for m in history:
        if isinstance(m, ToolResult) and m.tool_call_id in kept_calls:
            first.setdefault(m.tool_call_id, m)
    out_results = {m.tool_call_id: m for m in out if isinstance(m, ToolResult)}
    for call_id, original in first.items():
        assert out_results[call_id] is original
    # Anything else in the output is a synthetic repair, and every repair is in the output.
    for call_id, r in out_results.items():
        if call_id not in first:
            assert is_synthetic(r)
            assert r in plan.repairs


def check_repaired_calls_are_exactly_the_unanswered_ones(history: list[Message]) -> None:
    plan = plan_resume(history)
    kept = [m for m in plan.conversation if isinstance(m, AssistantMessage)]
    answered = {m.tool_call_id for m in history if isinstance(m, ToolResult)}
    unanswered = [c.id for m in kept for c in m.tool_calls if c.id not in answered]
    assert plan.repaired_tool_calls == unanswered  # as a list: in call order
    names = {c.id: c.name for m in kept for c in m.tool_calls}
    for r in plan.repairs:
        assert is_synthetic(r)
        assert r.name == names[r.tool_call_id]


def check_kind_matches_the_tail(history: list[Message]) -> None:
    plan = plan_resume(history)
    out = plan.conversation
    if not any(isinstance(m, AssistantMessage) for m in out):
        assert plan.kind == "start"
        return
    tail = out[-1]
    if isinstance(tail, AssistantMessage):
        assert not tail.tool_calls
        assert (plan.kind, plan.outcome) == ("already-complete", "succeeded")
    elif (
        isinstance(tail, ToolResult)
        and tail.name == "ask_user"
        and not tail.is_error
        and not tail.interrupted
    ):
        assert (plan.kind, plan.outcome) == ("already-complete", "waiting")
    else:
        assert plan.kind == "continue"
    # Nothing to strip is left at the tail once results are in place.
    assert not discardable(non_results(out)[-1]) or isinstance(tail, ToolResult)


def check_completed_turns_matches_its_definition(history: list[Message]) -> None:
    for conversation in (history, plan_resume(history).conversation):
        good = {
            m.tool_call_id for m in conversation if isinstance(m, ToolResult) and not m.interrupted
        }
        expected = 0
        for m in conversation:
            if isinstance(m, AssistantMessage) and all(c.id in good for c in m.tool_calls):
                expected += 1
        assert completed_turns(conversation) == expected
    # After planning, a turn whose calls were repaired is never counted as done.
    plan = plan_resume(history)
    repaired = set(plan.repaired_tool_calls)
    for m in plan.conversation:
        if isinstance(m, AssistantMessage) and repaired & {c.id for c in m.tool_calls}:
            assert completed_turns(plan.conversation) < len(
                [x for x in plan.conversation if isinstance(x, AssistantMessage)]
            )


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transcripts())
def test_properties_of_generated_transcripts(history: list[Message]) -> None:
    assert isinstance(plan_resume(history), ResumePlan)
    check_plan_is_always_well_formed(history)
    check_plan_is_idempotent(history)
    check_replanning_the_durable_log_is_stable(history)
    check_nothing_durable_is_lost(history)
    check_repaired_calls_are_exactly_the_unanswered_ones(history)
    check_kind_matches_the_tail(history)
    check_completed_turns_matches_its_definition(history)
