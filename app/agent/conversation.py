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

    def wire(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


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

    @property
    def is_empty(self) -> bool:
        return not self.text and not self.tool_calls

    def wire(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "toolCalls": [call.wire() for call in self.tool_calls],
            "stopReason": self.stop_reason,
        }


@dataclass(frozen=True)
class ToolResult:
    tool_call_id: str
    name: str
    content: str
    is_error: bool = False
    interrupted: bool = False
    timed_out: bool = False
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
        return data


Message = UserMessage | AssistantMessage | ToolResult


def message_from_event(type_: str, data: Mapping[str, Any], seq: int = 0) -> Message | None:
    """The message an event contributes to the conversation, if any."""
    if type_ == "user_message":
        return UserMessage(text=str(data.get("text", "")), seq=seq)
    if type_ == "assistant_message":
        calls = tuple(
            ToolCall(str(c["id"]), str(c["name"]), dict(c.get("arguments") or {}))
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


def last_user_text(conversation: Iterable[Message]) -> str:
    text = ""
    for message in conversation:
        if isinstance(message, UserMessage):
            text = message.text
    return text
