"""Tool approval (human in the loop), pure: which calls wait for a person, and what each
decision does to them.

A call of a tool that requires approval is not run when the model makes it: the run writes
`tool_approval_requested` and the session waits. A decision (`tool_approval_decided`) re-queues
it: an approved call runs, a denied one is answered with a denied result. A user message that
arrives instead of a decision denies what is still pending, so the model always sees every call
answered before the person's next words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.agent.conversation import AssistantMessage, Message, ToolCall, ToolResult, UserMessage
from app.domain import SessionEventType

SUPERSEDED_REASON = "the user sent a message instead of deciding"


@dataclass(frozen=True)
class Approval:
    """A requested approval and, once made, its decision."""

    call_id: str
    approved: bool | None = None  # None: not decided yet
    reason: str | None = None


def approvals_from_events(events: Iterable[Mapping[str, Any]]) -> dict[str, Approval]:
    """Approvals by call id, from event rows (`type`, `data`) in log order."""
    approvals: dict[str, Approval] = {}
    for event in events:
        record_approval_event(approvals, event["type"], event["data"])
    return approvals


def record_approval_event(
    approvals: dict[str, Approval], type_: str, data: Mapping[str, Any]
) -> None:
    """Fold one event into `approvals` (events of other types change nothing)."""
    if type_ == SessionEventType.TOOL_APPROVAL_REQUESTED:
        call_id = str(data["toolCallId"])
        approvals.setdefault(call_id, Approval(call_id))
    elif type_ == SessionEventType.TOOL_APPROVAL_DECIDED:
        call_id = str(data["toolCallId"])
        if approvals.get(call_id, Approval(call_id)).approved is None:  # the first one counts
            approvals[call_id] = Approval(call_id, bool(data["approved"]), data.get("reason"))


def denied_result(call: ToolCall, reason: str | None) -> ToolResult:
    content = f"denied: {reason}" if reason else "denied: no reason given"
    return ToolResult(call.id, call.name, content, is_error=True, denied=True)


@dataclass(frozen=True)
class Settlement:
    run: tuple[ToolCall, ...] = ()  # approved: run them now
    denied: tuple[ToolResult, ...] = ()  # write these results
    pending: tuple[ToolCall, ...] = ()  # still waiting for a decision (or for the request)


def settle(
    conversation: Sequence[Message], awaiting: Sequence[ToolCall], approvals: Mapping[str, Approval]
) -> Settlement:
    """What to do with the calls that wait for approval, given the decisions so far."""
    superseded = _superseded_calls(conversation)
    run: list[ToolCall] = []
    denied: list[ToolResult] = []
    pending: list[ToolCall] = []
    for call in awaiting:
        approval = approvals.get(call.id)
        decision = approval.approved if approval is not None else None
        if decision is True:
            run.append(call)
        elif decision is False:
            denied.append(denied_result(call, approval.reason if approval else None))
        elif call.id in superseded:
            denied.append(denied_result(call, SUPERSEDED_REASON))
        else:
            pending.append(call)
    return Settlement(tuple(run), tuple(denied), tuple(pending))


def _superseded_calls(conversation: Sequence[Message]) -> set[str]:
    """Ids of the calls of assistant messages that a user message follows."""
    superseded: set[str] = set()
    calls_so_far: set[str] = set()
    for message in conversation:
        if isinstance(message, AssistantMessage):
            calls_so_far.update(call.id for call in message.tool_calls)
        elif isinstance(message, UserMessage):
            superseded |= calls_so_far
    return superseded


# What a call of a client tool is answered with when the user spoke instead of its client.
CLIENT_SUPERSEDED = "no result: the user sent a message instead of the client's result"


@dataclass(frozen=True)
class ClientResult:
    """The result a client posted for a call of one of its tools (`client_tool_result`)."""

    call_id: str
    content: str
    is_error: bool = False


def record_client_result(
    results: dict[str, ClientResult], type_: str, data: Mapping[str, Any]
) -> None:
    """Fold one event into `results` (the first result posted for a call counts)."""
    if type_ == SessionEventType.CLIENT_TOOL_RESULT:
        call_id = str(data["toolCallId"])
        content = data.get("content", "")
        results.setdefault(
            call_id, ClientResult(call_id, str(content), bool(data.get("isError", False)))
        )


def settle_client(
    conversation: Sequence[Message],
    awaiting: Sequence[ToolCall],
    results: Mapping[str, ClientResult],
) -> tuple[tuple[ToolResult, ...], tuple[ToolCall, ...]]:
    """The results of the client calls that have one (the client's, or the error of one the
    user's next message superseded), and the calls still waiting for their client."""
    superseded = _superseded_calls(conversation)
    answered: list[ToolResult] = []
    pending: list[ToolCall] = []
    for call in awaiting:
        posted = results.get(call.id)
        if posted is not None:
            answered.append(ToolResult(call.id, call.name, posted.content, posted.is_error))
        elif call.id in superseded:
            answered.append(ToolResult(call.id, call.name, CLIENT_SUPERSEDED, is_error=True))
        else:
            pending.append(call)
    return tuple(answered), tuple(pending)
