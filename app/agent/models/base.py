"""The model interface every model plugs into, and the faults a model call can end in."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from app.agent.conversation import AssistantMessage, Message
from app.agent.models.redact import redact_provider_text
from app.domain import SessionErrorCode

DeltaSink = Callable[[str], Awaitable[None]]

ToolChoice = str  # "auto" | "none" | "required" | the name of one tool
ReasoningEffort = Literal["low", "medium", "high"]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ModelSettings:
    """A session's sampling and tool-use settings; None means the provider's default."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    stop: tuple[str, ...] | None = None
    reasoning_effort: ReasoningEffort | None = None

    @classmethod
    def from_wire(cls, data: Mapping[str, Any] | None) -> ModelSettings:
        """From a session's `modelSettings` (camelCase, validated by the API)."""
        data = data or {}
        stop = data.get("stop")
        return cls(
            temperature=data.get("temperature"),
            top_p=data.get("topP"),
            max_tokens=data.get("maxTokens"),
            tool_choice=data.get("toolChoice"),
            parallel_tool_calls=data.get("parallelToolCalls"),
            stop=tuple(stop) if stop is not None else None,
            reasoning_effort=data.get("reasoningEffort"),
        )


@dataclass(frozen=True)
class ModelRequest:
    # Everything the session holds, failed turns included (the scripted model counts them);
    # a provider shows the model only `model_visible(conversation)`.
    conversation: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    instructions: str | None = None
    settings: ModelSettings = ModelSettings()
    # For a compaction's call: the messages its summary replaces (the conversation is then
    # their transcript, asked to be summarized). The scripted model answers from them.
    compacting: tuple[Message, ...] = ()


# Faults worth another try, and the word `model_retry.reason` uses for each.
RetryableFault = Literal[
    "rate_limited", "server_error", "connection_error", "idle_timeout", "truncated"
]
# Faults no retry can fix, each with the `error.code` the session fails with.
FatalFault = Literal[
    "bad_request", "auth_failed", "not_found", "context_too_long", "refused", "internal"
]
FaultKind = RetryableFault | FatalFault

RETRYABLE_FAULTS: frozenset[str] = frozenset(
    {"rate_limited", "server_error", "connection_error", "idle_timeout", "truncated"}
)
FAULT_CODES: dict[str, SessionErrorCode] = {
    "bad_request": SessionErrorCode.MODEL_BAD_REQUEST,
    "auth_failed": SessionErrorCode.MODEL_AUTH_FAILED,
    "not_found": SessionErrorCode.MODEL_NOT_FOUND,
    "context_too_long": SessionErrorCode.MODEL_CONTEXT_TOO_LONG,
    "refused": SessionErrorCode.MODEL_REFUSED,
    "internal": SessionErrorCode.MODEL_ERROR,
}


class ModelFault(Exception):
    """A model call that produced no usable turn: a provider error, a dropped or stalled
    stream, a refused request. The runner retries the retryable ones and fails the session
    on the others."""

    def __init__(
        self,
        kind: FaultKind,
        message: str,
        *,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        # What a tenant reads (model_retry, the session's error): nothing of the operator's
        # account at the provider (its keys, organization, request ids: models.redact).
        message = redact_provider_text(message)
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after = retry_after  # seconds the provider asked us to wait, if it did
        self.status = status

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE_FAULTS

    @property
    def code(self) -> SessionErrorCode:
        return FAULT_CODES.get(self.kind, SessionErrorCode.MODEL_UNAVAILABLE)


class Model(Protocol):
    async def complete(self, request: ModelRequest, on_delta: DeltaSink) -> AssistantMessage:
        """One assistant turn. Text is streamed through `on_delta` as it arrives; the call is
        cancellable at any await (cancel and lease loss abort it). Raises ModelFault when the
        turn cannot be had."""
        ...
