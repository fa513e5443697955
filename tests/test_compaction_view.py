"""What the model sees after compactions (app.agent.compaction): property tests over generated
logs of user messages, model turns with tool calls and their results, and compactions, and the
requests both providers' adapters build from the compacted view."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from app.agent.compaction import (
    choose_cut,
    compact,
    estimate_tokens,
    model_view,
    trim_results,
)
from app.agent.conversation import (
    AssistantMessage,
    Message,
    Summary,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from app.agent.models.anthropic import to_anthropic_messages
from app.agent.models.openai import to_openai_messages
from app.agent.resume import completed_turns
from ferryman.fold import Compaction, SessionFold
from tests.test_session_fold import durable


@dataclass
class Log:
    """A generated session log: its messages in log order (summaries where compacted), and
    the calls still waiting (for an approval)."""

    history: list[Message]
    held: set[str]


# Steps: ("user",), ("turn", calls), ("final",), ("compact", keep).
steps = st.lists(
    st.one_of(
        st.tuples(st.just("user")),
        st.tuples(st.just("turn"), st.integers(0, 3)),
        st.tuples(st.just("final")),
        st.tuples(st.just("compact"), st.integers(0, 3)),
    ),
    max_size=40,
)


def build(plan: list[tuple[object, ...]], held_last: bool) -> Log:
    """The log a session writes for `plan`: each compaction cut where `choose_cut` says, from
    the view as it stands (as the runner does)."""
    history: list[Message] = [UserMessage("hello", seq=1)]
    seq = 1
    calls = 0

    def next_seq() -> int:
        nonlocal seq
        seq += 1
        return seq

    for step in plan:
        if step[0] == "user":
            history.append(UserMessage(f"u{seq}", seq=next_seq()))
        elif step[0] == "turn":
            count = int(step[1])  # type: ignore[call-overload]
            ids = [f"c{calls + i}" for i in range(count)]
            calls += count
            turn = AssistantMessage(
                f"t{seq}",
                tuple(ToolCall(i, "get_note", {"key": i}) for i in ids),
                "tool_use" if ids else "stop",
                seq=next_seq(),
            )
            history.append(turn)
            history.extend(ToolResult(i, "get_note", "x" * 50, seq=next_seq()) for i in ids)
        elif step[0] == "final":
            history.append(AssistantMessage(f"done {seq}", seq=next_seq()))
        else:
            view = model_view(history)
            cut = choose_cut(view, int(step[1]))  # type: ignore[call-overload]
            if cut is not None:
                through = max(m.seq for m in view[:cut] if not isinstance(m, Summary))
                history.append(Summary(f"s{seq}", through, seq=next_seq()))
    held: set[str] = set()
    if held_last:  # a call waiting for approval: no result yet
        history.append(
            AssistantMessage("", (ToolCall("wait", "sleep", {}),), "tool_use", seq=next_seq())
        )
        held.add("wait")
    return Log(history, held)


def plain(history: list[Message]) -> list[Message]:
    return [m for m in history if not isinstance(m, Summary)]


@settings(max_examples=300, deadline=None)
@given(steps, st.booleans())
def test_the_view_is_the_latest_summary_and_what_follows_it(
    plan: list[tuple[object, ...]], held_last: bool
) -> None:
    log = build(plan, held_last)
    view = model_view(log.history)
    summaries = [m for m in log.history if isinstance(m, Summary)]
    if not summaries:
        assert view == log.history
        return
    latest = summaries[-1]
    assert isinstance(view[0], Summary) and view[0].text == latest.text
    assert view[1:] == [m for m in plain(log.history) if m.seq > latest.through_seq]
    # The scripted model plays the same turn as it would have without compaction.
    assert completed_turns(view) == completed_turns(plain(log.history))


@settings(max_examples=300, deadline=None)
@given(steps, st.booleans(), st.integers(0, 4))
def test_a_cut_keeps_calls_with_results_and_the_recent_turns(
    plan: list[tuple[object, ...]], held_last: bool, keep: int
) -> None:
    log = build(plan, held_last)
    view = model_view(log.history)
    cut = choose_cut(view, keep, log.held)
    if cut is None:
        return
    prefix, tail = view[:cut], view[cut:]
    assert tail, "the last message always stays"
    prefix_calls = {c.id for m in prefix if isinstance(m, AssistantMessage) for c in m.tool_calls}
    prefix_results = {m.tool_call_id for m in prefix if isinstance(m, ToolResult)}
    assert prefix_calls == prefix_results  # every call in the summary has its result there
    assert not prefix_calls & log.held
    assert not any(isinstance(m, ToolResult) and m.tool_call_id in prefix_calls for m in tail)
    assert not isinstance(prefix[-1], UserMessage)  # a message the model did not answer stays
    turns = [m for m in view if isinstance(m, AssistantMessage)]
    kept = [m for m in tail if isinstance(m, AssistantMessage)]
    assert len(kept) >= min(keep, len(turns))
    assert kept == turns[len(turns) - len(kept) :]  # verbatim, the latest ones
    through = max(m.seq for m in prefix if not isinstance(m, Summary))
    assert all(m.seq > through for m in tail)
    after = compact(view, Summary("s", through))
    assert after[1:] == tail


@settings(max_examples=200, deadline=None)
@given(steps)
def test_the_providers_requests_after_compaction_pair_every_call(
    plan: list[tuple[object, ...]],
) -> None:
    view = tuple(model_view(build(plan, False).history))
    anthropic = to_anthropic_messages(view)
    assert anthropic[0]["role"] == "user"
    for index, message in enumerate(anthropic):
        uses = [b["id"] for b in message["content"] if b["type"] == "tool_use"]
        if uses:  # Anthropic refuses a tool_use without its tool_result in the next turn
            following = anthropic[index + 1]["content"]
            answered = [b["tool_use_id"] for b in following if b["type"] == "tool_result"]
            assert answered[: len(uses)] == uses
        results = [b for b in message["content"] if b["type"] == "tool_result"]
        if results:
            previous = anthropic[index - 1]["content"]
            assert {b["tool_use_id"] for b in results} <= {
                b["id"] for b in previous if b["type"] == "tool_use"
            }
    openai = to_openai_messages(view, "be brief")
    offered: set[str] = set()
    for message in openai:
        if message["role"] == "assistant":
            offered = {c["id"] for c in message.get("tool_calls", [])}
        elif message["role"] == "tool":
            assert message["tool_call_id"] in offered
        else:
            offered = set()


def test_a_cut_never_takes_a_message_whose_seq_is_not_known_yet() -> None:
    fresh = [UserMessage("a", seq=1), AssistantMessage("b", seq=2), UserMessage("c", seq=0)]
    # Not logged yet (seq 0): newer than every logged message, so a cut may leave it.
    assert choose_cut(fresh, 0) == 2
    # One not logged yet among those a cut would take: no cut passes it.
    unknown = [UserMessage("a", seq=1), AssistantMessage("b", seq=0), UserMessage("c", seq=4)]
    assert choose_cut([*unknown, AssistantMessage("d", seq=5)], 0) is None


def test_the_summary_goes_to_the_model_as_a_user_turn_with_the_instructions() -> None:
    view = (
        Summary("we looked up a and b", 9, seq=12),
        AssistantMessage("", (ToolCall("c1", "get_note", {"key": "a"}),), "tool_use", seq=10),
        ToolResult("c1", "get_note", "A", seq=11),
    )
    openai = to_openai_messages(view, "be brief")
    assert openai[0] == {"role": "system", "content": "be brief"}
    assert openai[1]["role"] == "user" and "we looked up a and b" in openai[1]["content"]
    anthropic = to_anthropic_messages(view)
    assert [m["role"] for m in anthropic] == ["user", "assistant", "user"]


def test_the_estimate_counts_the_last_usage_and_what_came_after() -> None:
    reply = AssistantMessage("ok", seq=5, usage=Usage(1000, 20))
    assert estimate_tokens([UserMessage("x" * 400, seq=1), reply], None, ()) == 1020
    later = [reply, UserMessage("y" * 400, seq=6)]
    assert estimate_tokens(later, None, ()) == 1120
    # A count made before the latest summary is of a request that is no more.
    compacted = [Summary("short", 4, seq=7), reply]
    assert estimate_tokens(compacted, None, ()) < 100


def test_a_long_tool_result_is_shown_cut_with_a_marker() -> None:
    result = ToolResult("c1", "get_note", "z" * 5000, seq=3)
    shown = trim_results([result], 1000)[0]
    assert isinstance(shown, ToolResult)
    assert shown.content.startswith("z" * 1000) and "4000 more characters" in shown.content
    assert "FERRYMAN_MODEL_TOOL_RESULT_MAX_CHARS" in shown.content
    assert result.content == "z" * 5000


def test_the_sdk_fold_keeps_every_message_and_marks_the_compaction() -> None:
    fold = SessionFold()
    fold.apply_all(
        [
            durable(1, "user_message", {"text": "hi", "delivery": "queued"}),
            durable(
                2, "assistant_message", {"text": "hello", "toolCalls": [], "stopReason": "stop"}
            ),
            durable(
                3,
                "session_compacted",
                {
                    "throughSeq": 2,
                    "summary": "greeted",
                    "tokensBefore": 9,
                    "tokensAfter": 3,
                    "model": "scripted",
                },
            ),
        ]
    )
    snapshot = fold.snapshot()
    assert [m.text for m in snapshot.messages] == ["hi", "hello"]
    assert snapshot.compactions == (Compaction(3, 2, "greeted"),)
