"""The conversation a model sees, rebuilt from a session's durable events."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from app.domain import SessionEventType

StopReason = Literal["stop", "tool_use", "length", "error", "aborted"]
INTERRUPTED_STOPS: frozenset[str] = frozenset({"aborted", "length", "error"})


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    # The model's arguments as it wrote them when they are not a JSON object: the call fails
    # with a clear error, and the model is shown exactly what it sent.
    invalid_arguments: str | None = None

    @classmethod
    def from_text(cls, call_id: str, name: str, text: str) -> ToolCall:
        """A call whose arguments a model streamed as JSON text: kept as written when they are
        not a JSON object (the call then fails, and the model sees what it sent)."""
        try:
            arguments = json.loads(text or "{}")
        except json.JSONDecodeError:
            return cls(call_id, name, {}, text)
        if not isinstance(arguments, dict):
            return cls(call_id, name, {}, text)
        return cls(call_id, name, arguments)

    def arguments_text(self) -> str:
        """The arguments as JSON text; as the model wrote them when they were not an object."""
        if self.invalid_arguments is not None:
            return self.invalid_arguments
        return json.dumps(self.arguments)

    def wire(self) -> dict[str, Any]:
        data = {"id": self.id, "name": self.name, "arguments": self.arguments}
        if self.invalid_arguments is not None:
            data["invalidArguments"] = self.invalid_arguments
        return data


@dataclass(frozen=True)
class Usage:
    """Tokens of one model turn, as the provider reported them."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0  # of input_tokens, read from the provider's prompt cache

    def wire(self) -> dict[str, int]:
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "cachedTokens": self.cached_tokens,
        }


@dataclass(frozen=True)
class UserMessage:
    text: str
    seq: int = 0


@dataclass(frozen=True)
class AssistantMessage:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: StopReason = "stop"
    seq: int = 0
    usage: Usage | None = field(default=None, compare=False)

    @property
    def is_empty(self) -> bool:
        return not self.text and not self.tool_calls

    def wire(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "text": self.text,
            "toolCalls": [call.wire() for call in self.tool_calls],
            "stopReason": self.stop_reason,
        }
        if self.usage is not None:
            data["usage"] = self.usage.wire()
        return data


@dataclass(frozen=True)
class ToolResult:
    tool_call_id: str
    name: str
    content: str
    is_error: bool = False
    interrupted: bool = False
    timed_out: bool = False
    denied: bool = False
    seq: int = 0

    def wire(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "toolCallId": self.tool_call_id,
            "name": self.name,
            "isError": self.is_error,
            "content": self.content,
        }
        if self.interrupted:
            data["interrupted"] = True
        if self.timed_out:
            data["timedOut"] = True
        if self.denied:
            data["denied"] = True
        return data


@dataclass(frozen=True)
class Summary:
    """A compaction's summary (`session_compacted`): it stands for every message of the log
    through `through_seq`. `turns`: the completed model turns it covers (the scripted model
    counts them), set by `app.agent.compaction.model_view`."""

    text: str
    through_seq: int
    turns: int = 0
    seq: int = 0

    def prompt_text(self) -> str:
        """How a provider shows it: a user turn, so the tools and instructions stay as they
        are and every provider accepts it first."""
        return f"[Summary of the earlier conversation]\n{self.text}"


def usage_from_wire(data: Mapping[str, Any] | None) -> Usage | None:
    if not data:
        return None
    return Usage(
        int(data.get("inputTokens", 0)),
        int(data.get("outputTokens", 0)),
        int(data.get("cachedTokens", 0)),
    )


Message = UserMessage | AssistantMessage | ToolResult | Summary


def message_from_event(type_: str, data: Mapping[str, Any], seq: int = 0) -> Message | None:
    """The message an event contributes to the conversation, if any."""
    if type_ == SessionEventType.USER_MESSAGE:
        return UserMessage(text=str(data.get("text", "")), seq=seq)
    if type_ == SessionEventType.SESSION_COMPACTED:
        return Summary(str(data.get("summary", "")), int(data["throughSeq"]), seq=seq)
    if type_ == SessionEventType.ASSISTANT_MESSAGE:
        calls = tuple(
            ToolCall(
                str(c["id"]),
                str(c["name"]),
                dict(c.get("arguments") or {}),
                c.get("invalidArguments"),
            )
            for c in data.get("toolCalls") or ()
        )
        return AssistantMessage(
            text=str(data.get("text") or ""),
            tool_calls=calls,
            stop_reason=data.get("stopReason", "stop"),
            seq=seq,
            usage=usage_from_wire(data.get("usage")),
        )
    if type_ == SessionEventType.TOOL_RESULT:
        return ToolResult(
            tool_call_id=str(data["toolCallId"]),
            name=str(data.get("name", "")),
            content=str(data.get("content", "")),
            is_error=bool(data.get("isError", False)),
            interrupted=bool(data.get("interrupted", False)),
            timed_out=bool(data.get("timedOut", False)),
            denied=bool(data.get("denied", False)),
            seq=seq,
        )
    return None


def conversation_from_events(events: Iterable[Mapping[str, Any]]) -> list[Message]:
    """Messages from event rows (`type`, `data`, `seq`), in log order."""
    messages = []
    for event in events:
        message = message_from_event(event["type"], event["data"], int(event.get("seq", 0)))
        if message is not None:
            messages.append(message)
    return messages


TRUNCATED = "\n[… {} more bytes cut: FERRYMAN_MAX_EVENT_BYTES]"


def clip_text(text: str, max_bytes: int) -> str:
    """`text` if its UTF-8 fits in `max_bytes`, else its head and a marker saying how much was
    cut (the marker counted in the bound)."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    room = max(0, max_bytes - len(TRUNCATED.format(len(data)).encode()))
    head = data[:room].decode(errors="ignore")  # never half a character
    return head + TRUNCATED.format(len(data) - len(head.encode()))


def bounded_reply(reply: AssistantMessage, max_bytes: int) -> AssistantMessage:
    """A model turn that fits in one event of about `max_bytes`: half for its text, the rest
    shared by its calls; a call whose arguments do not fit fails as invalid arguments."""
    text = clip_text(reply.text, max_bytes // 2)
    share = max_bytes // 2 // max(1, len(reply.tool_calls))
    calls = tuple(
        call
        if len(call.arguments_text().encode()) <= share
        else ToolCall(call.id, call.name, {}, clip_text(call.arguments_text(), min(share, 1000)))
        for call in reply.tool_calls
    )
    if text == reply.text and calls == reply.tool_calls:
        return reply
    return AssistantMessage(text, calls, reply.stop_reason, reply.seq, reply.usage)


def bounded_result(result: ToolResult, max_bytes: int) -> ToolResult:
    """A tool result whose content fits in one event of about `max_bytes`."""
    content = clip_text(result.content, max_bytes - 1024)
    return result if content == result.content else replace(result, content=content)


def model_visible(conversation: Iterable[Message]) -> list[Message]:
    """What a provider is shown: everything but failed turns. A turn that ended in an error
    (a provider fault, a scripted `error`) is the runtime's business, never words the model
    said; whatever it streamed before failing is not put in its mouth."""
    return [
        m
        for m in conversation
        if not (isinstance(m, AssistantMessage) and m.stop_reason == "error")
    ]


def last_user_text(conversation: Iterable[Message]) -> str:
    text = ""
    for message in conversation:
        if isinstance(message, UserMessage):
            text = message.text
    return text
