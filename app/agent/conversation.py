"""The conversation a model sees, rebuilt from a session's durable events."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

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


Message = UserMessage | AssistantMessage | ToolResult


def message_from_event(type_: str, data: Mapping[str, Any], seq: int = 0) -> Message | None:
    """The message an event contributes to the conversation, if any."""
    if type_ == "user_message":
        return UserMessage(text=str(data.get("text", "")), seq=seq)
    if type_ == "assistant_message":
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
        )
    if type_ == "tool_result":
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
