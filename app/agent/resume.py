"""Resume planning and tool-call repair: pure functions over a transcript.

A new lease holder plans before it calls the model:
- `start`: no usable history: run from the prompt.
- `continue`: strip trailing assistant frames that are empty or interrupted, answer every tool
  call left without a result (the ids come back as `repaired_tool_calls`, and the runner makes
  each answer durable), then call the model.
- `already-complete`: the transcript ends in a final answer, or in a successful call of a tool
  that ends the turn (`ask_user`): settle without calling the model.

A call waiting for a person's approval (or approved and not started yet), or for the result of
the client whose tool it calls, is not an orphan: it is left unanswered, in `awaiting`, for the
runner to settle (`app.agent.approvals`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from app.agent.approvals import Approval
from app.agent.conversation import (
    INTERRUPTED_STOPS,
    AssistantMessage,
    Message,
    Summary,
    ToolCall,
    ToolResult,
    UserMessage,
)

ASK_USER = "ask_user"
INTERRUPTED_CONTENT = "worker interrupted"

PlanKind = Literal["start", "continue", "already-complete"]
Outcome = Literal["succeeded", "waiting"]


@dataclass(frozen=True)
class ResumePlan:
    kind: PlanKind
    # The conversation to give the model: well-formed, every call answered once, in order.
    conversation: tuple[Message, ...]
    # Synthetic results to write durably before the model is called, in call order.
    repairs: tuple[ToolResult, ...] = ()
    # How many trailing assistant frames were set aside.
    stripped: int = 0
    # For `already-complete`: how the session settles.
    outcome: Outcome | None = None
    # Calls left unanswered because they wait for approval (or were approved and never
    # started), in call order.
    awaiting: tuple[ToolCall, ...] = ()

    @property
    def repaired_tool_calls(self) -> list[str]:
        return [r.tool_call_id for r in self.repairs]


def interrupted_result(call_id: str, name: str) -> ToolResult:
    return ToolResult(
        tool_call_id=call_id,
        name=name,
        content=INTERRUPTED_CONTENT,
        is_error=True,
        interrupted=True,
    )


def _is_discardable(message: Message) -> bool:
    return isinstance(message, AssistantMessage) and (
        message.is_empty or message.stop_reason in INTERRUPTED_STOPS
    )


def repair(
    conversation: Sequence[Message], held: Collection[str] = ()
) -> tuple[list[Message], list[ToolResult]]:
    """Place each call's result right after its assistant message, in call order; answer
    unanswered calls with a synthetic interrupted result, except the `held` ones, which stay
    unanswered; drop duplicate and orphan results.

    Returns the well-formed conversation and the synthetic results it added.
    """
    results: dict[str, ToolResult] = {}
    for message in conversation:
        if isinstance(message, ToolResult) and message.tool_call_id not in results:
            results[message.tool_call_id] = message
    repaired: list[Message] = []
    synthetic: list[ToolResult] = []
    answered: set[str] = set()
    for message in conversation:
        if isinstance(message, ToolResult):
            continue
        repaired.append(message)
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                if call.id in answered:
                    continue  # a duplicate call id: answered once already
                answered.add(call.id)
                result = results.get(call.id)
                if result is None and call.id in held:
                    continue
                if result is None:
                    result = interrupted_result(call.id, call.name)
                    synthetic.append(result)
                repaired.append(result)
    return repaired, synthetic


def plan_resume(
    history: Sequence[Message],
    ends_turn: Collection[str] = (ASK_USER,),
    *,
    approvals: Mapping[str, Approval] | None = None,
    started: Collection[str] = (),
    client_calls: Collection[str] = (),
) -> ResumePlan:
    """`ends_turn`: names of the tools after whose successful result the session waits for the
    user (the registry's `Tool.ends_turn`), as the runner does after running one.
    `approvals`: the approvals requested so far, by call id; `started`: ids of the calls whose
    tool began to run (`tool_call_start`); `client_calls`: ids of the calls of client tools
    (`client_tool_call`), which wait for their client's result, never repaired."""
    approvals = approvals or {}
    messages = list(history)
    # Trailing frames are judged as they stand once results are in place: a result logged
    # later (a durable repair, a reordering) or an orphan result neither shields nor exposes one.
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolResult)}
    frames = [i for i, m in enumerate(messages) if not isinstance(m, ToolResult)]
    stripped = 0
    while frames:
        last = messages[frames[-1]]
        if not isinstance(last, AssistantMessage) or not _is_discardable(last):
            break
        if any(c.id in answered for c in last.tool_calls):
            break  # its results follow it: not a trailing frame
        del messages[frames.pop()]
        stripped += 1
    if not any(isinstance(m, AssistantMessage) for m in messages):
        users = tuple(m for m in messages if isinstance(m, (UserMessage, Summary)))
        return ResumePlan("start", users, stripped=stripped)
    held = {
        call_id
        for call_id, approval in approvals.items()
        if call_id not in answered and not (approval.approved and call_id in started)
    } | {call_id for call_id in client_calls if call_id not in answered}
    conversation, synthetic = repair(messages, held)
    awaiting = tuple(
        call
        for m in conversation
        if isinstance(m, AssistantMessage)
        for call in m.tool_calls
        if call.id in held
    )
    tail = conversation[-1]
    outcome: Outcome | None
    if awaiting:
        outcome = None
    elif isinstance(tail, AssistantMessage):
        outcome = "succeeded"
    elif (
        isinstance(tail, ToolResult)
        and tail.name in ends_turn
        and not tail.is_error
        and not tail.interrupted
    ):
        outcome = "waiting"
    else:
        outcome = None
    return ResumePlan(
        "continue" if outcome is None else "already-complete",
        tuple(conversation),
        repairs=tuple(synthetic),
        stripped=stripped,
        outcome=outcome,
        awaiting=awaiting,
    )


def completed_turns(conversation: Sequence[Message]) -> int:
    """Assistant messages all of whose tool calls have a result that is not `interrupted`:
    the scripted model's turn index, so a crash replays the interrupted turn. A summary
    counts the turns it stands for."""
    done = {m.tool_call_id for m in conversation if isinstance(m, ToolResult) and not m.interrupted}
    return sum(m.turns for m in conversation if isinstance(m, Summary)) + sum(
        1
        for m in conversation
        if isinstance(m, AssistantMessage) and all(c.id in done for c in m.tool_calls)
    )


__all__ = [
    "ResumePlan",
    "UserMessage",
    "completed_turns",
    "interrupted_result",
    "plan_resume",
    "repair",
]
