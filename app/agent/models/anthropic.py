"""Anthropic's Messages API, streamed, with tool use, on the official `anthropic` SDK."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import anthropic
import httpx2
from anthropic import AsyncAnthropic
from anthropic.types import MessageParam, RawMessageStreamEvent

from app.agent.conversation import (
    AssistantMessage,
    Message,
    StopReason,
    Summary,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
    model_visible,
)
from app.agent.models.base import (
    DeltaSink,
    FaultKind,
    ModelFault,
    ModelRequest,
    ModelSettings,
    ToolSpec,
)
from app.agent.models.faults import (
    fault_for_status,
    idle_guarded,
    is_context_overflow,
    retry_after_seconds,
)
from app.agent.models.providers import ProviderConfig

ANTHROPIC_BASE_URL = "https://api.anthropic.com"

STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_use",
    "max_tokens": "length",
}
# `error.type` of an error event sent in the middle of a stream (its HTTP status was 200).
STREAM_ERROR_KINDS: dict[str, FaultKind] = {
    "rate_limit_error": "rate_limited",
    "overloaded_error": "server_error",
    "api_error": "server_error",
    "timeout_error": "server_error",
    "authentication_error": "auth_failed",
    "permission_error": "auth_failed",
    "not_found_error": "not_found",
    "invalid_request_error": "bad_request",
}


def make_client(config: ProviderConfig) -> AsyncAnthropic:
    """One client per worker; base URL and key explicit (never the SDK's own ANTHROPIC_*
    variables or profile files), its retries off (the runner retries, visibly)."""
    return AsyncAnthropic(
        base_url=config.anthropic_base_url or ANTHROPIC_BASE_URL,
        # Without a key the SDK fails every request with a TypeError; with this one the
        # provider answers 401, which fails the session as MODEL_AUTH_FAILED, saying so.
        api_key=config.anthropic_api_key or "unused",
        max_retries=0,
        timeout=httpx2.Timeout(config.idle_timeout, connect=config.connect_timeout),
        open_telemetry=False,
    )


def to_anthropic_messages(conversation: tuple[Message, ...]) -> list[dict[str, Any]]:
    """Messages with content blocks. Tool results travel in the user turn after the call, and
    consecutive user turns are merged, since turns must alternate."""
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for message in model_visible(conversation):
        if isinstance(message, UserMessage):
            add("user", [{"type": "text", "text": message.text}])
        elif isinstance(message, Summary):
            add("user", [{"type": "text", "text": message.prompt_text()}])
        elif isinstance(message, ToolResult):
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.content,
            }
            if message.is_error:
                block["is_error"] = True
            add("user", [block])
        else:
            blocks: list[dict[str, Any]] = []
            if message.text:
                blocks.append({"type": "text", "text": message.text})
            blocks.extend(
                {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
                for call in message.tool_calls
            )
            if blocks:  # an empty assistant turn is refused
                add("assistant", blocks)
    return messages


def to_anthropic_tools(tools: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]


def settings_arguments(
    settings: ModelSettings, *, has_tools: bool, default_max_tokens: int
) -> dict[str, Any]:
    """The request fields a session's model settings become. `max_tokens` is required here."""
    fields: dict[str, Any] = {"max_tokens": settings.max_tokens or default_max_tokens}
    if settings.temperature is not None:
        fields["temperature"] = settings.temperature
    if settings.top_p is not None:
        fields["top_p"] = settings.top_p
    if settings.stop:
        fields["stop_sequences"] = list(settings.stop)
    if settings.reasoning_effort is not None:
        fields["output_config"] = {"effort": settings.reasoning_effort}
    if has_tools and (settings.tool_choice is not None or settings.parallel_tool_calls is False):
        choice = settings.tool_choice or "auto"
        tool_choice: dict[str, Any] = {
            "auto": {"type": "auto"},
            "none": {"type": "none"},
            "required": {"type": "any"},
        }.get(choice, {"type": "tool", "name": choice})
        if settings.parallel_tool_calls is False and tool_choice["type"] != "none":
            tool_choice["disable_parallel_tool_use"] = True
        fields["tool_choice"] = tool_choice
    return fields


@dataclass
class _Turn:
    text: list[str] = field(default_factory=list)
    tool_uses: dict[int, dict[str, str]] = field(default_factory=dict)  # block index → id, name
    inputs: dict[int, list[str]] = field(default_factory=dict)  # block index → JSON pieces
    stop_reason: str | None = None
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0

    def reply(self) -> AssistantMessage:
        if self.stop_reason is None:
            raise ModelFault("truncated", "the model stream ended without a stop reason (cut off)")
        if self.stop_reason == "refusal":
            raise ModelFault("refused", "the model refused to answer")
        if self.stop_reason == "model_context_window_exceeded":
            raise ModelFault("context_too_long", "the conversation no longer fits the model")
        stop = STOP_REASONS.get(self.stop_reason)
        if stop is None:
            raise ModelFault("internal", f"the provider ended the turn with {self.stop_reason!r}")
        calls = tuple(
            ToolCall.from_text(use["id"], use["name"], "".join(self.inputs.get(index, ())))
            for index, use in sorted(self.tool_uses.items())
        )
        usage = Usage(self.input_tokens, self.output_tokens, self.cached_tokens)
        return AssistantMessage("".join(self.text), calls, stop, usage=usage)


class AnthropicModel:
    def __init__(
        self, client: AsyncAnthropic, model: str, *, idle_timeout: float, default_max_tokens: int
    ) -> None:
        self.client = client
        self.model = model
        self.idle_timeout = idle_timeout
        self.default_max_tokens = default_max_tokens

    async def complete(self, request: ModelRequest, on_delta: DeltaSink) -> AssistantMessage:
        try:
            return await self._complete(request, on_delta)
        except anthropic.APIStatusError as exc:
            raise _status_fault(exc) from exc
        except (anthropic.APITimeoutError, httpx2.TimeoutException) as exc:
            raise ModelFault(
                "idle_timeout", f"the model server sent nothing for {self.idle_timeout:g} s"
            ) from exc
        # The SDK does not wrap transport errors raised while a stream is read.
        except (anthropic.APIConnectionError, httpx2.TransportError) as exc:
            raise ModelFault(
                "connection_error", f"could not talk to the model server ({exc!r})"
            ) from exc
        except ValueError as exc:  # a data line that is not JSON
            raise ModelFault("server_error", f"the model stream is malformed: {exc}") from exc

    async def _complete(self, request: ModelRequest, on_delta: DeltaSink) -> AssistantMessage:
        tools = to_anthropic_tools(request.tools)
        fields = settings_arguments(
            request.settings, has_tools=bool(tools), default_max_tokens=self.default_max_tokens
        )
        max_tokens = fields.pop("max_tokens")
        stream = await self.client.messages.create(
            model=self.model,
            max_tokens=max_tokens,
            system=request.instructions or anthropic.omit,
            messages=cast(list[MessageParam], to_anthropic_messages(request.conversation)),
            tools=cast(Any, tools) if tools else anthropic.omit,
            stream=True,
            # Fields this SDK version has no parameter for (temperature, top_p) go as is.
            extra_body=fields or None,
        )
        turn = _Turn()
        async with stream:
            async for event in idle_guarded(stream, self.idle_timeout):
                await _take(event, turn, on_delta)
        return turn.reply()


async def _take(event: RawMessageStreamEvent, turn: _Turn, on_delta: DeltaSink) -> None:
    if event.type == "message_start":
        usage = event.message.usage
        cached = usage.cache_read_input_tokens or 0
        # Our input counts every prompt token; Anthropic counts cache reads and writes apart.
        turn.input_tokens = usage.input_tokens + cached + (usage.cache_creation_input_tokens or 0)
        turn.cached_tokens = cached
        turn.output_tokens = usage.output_tokens
    elif event.type == "content_block_start" and event.content_block.type == "tool_use":
        block = event.content_block
        turn.tool_uses[event.index] = {"id": block.id, "name": block.name}
    elif event.type == "content_block_delta":
        if event.delta.type == "text_delta":
            turn.text.append(event.delta.text)
            await on_delta(event.delta.text)
        elif event.delta.type == "input_json_delta":
            turn.inputs.setdefault(event.index, []).append(event.delta.partial_json)
    elif event.type == "message_delta":
        turn.stop_reason = event.delta.stop_reason or turn.stop_reason
        turn.output_tokens = event.usage.output_tokens  # cumulative


def _status_fault(exc: anthropic.APIStatusError) -> ModelFault:
    detail = exc.api_message or exc.message
    if exc.status_code != 200:
        return fault_for_status(exc.status_code, detail, exc.response.headers)
    # An error event in a stream that had started fine: classified by its type.
    kind = STREAM_ERROR_KINDS.get(exc.type or "", "server_error")
    if kind == "bad_request" and is_context_overflow(detail):
        kind = "context_too_long"
    retry_after = retry_after_seconds(exc.response.headers)
    return ModelFault(
        kind, f"the model stream failed: {exc.type}: {detail}", retry_after=retry_after
    )
