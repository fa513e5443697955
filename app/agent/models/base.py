"""The model interface every model plugs into."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from app.agent.conversation import AssistantMessage, Message

DeltaSink = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ModelRequest:
    conversation: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]


class ModelError(Exception):
    """The model could not produce a turn (bad configuration, provider error)."""


class Model(Protocol):
    async def complete(self, request: ModelRequest, on_delta: DeltaSink) -> AssistantMessage:
        """One assistant turn. Text is streamed through `on_delta` as it arrives; the call is
        cancellable at any await (cancel and lease loss abort it)."""
        ...
