"""Any OpenAI-compatible chat-completions server (OpenAI, vLLM, Ollama, llama.cpp, LiteLLM,
Azure through a base URL), streamed, with function calling, on the official `openai` SDK."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

import httpx2
import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

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
from app.agent.models.faults import fault_for_status, idle_guarded, is_context_overflow
from app.agent.models.providers import ProviderConfig

OPENAI_BASE_URL = "https://api.openai.com/v1"

FINISH_REASONS: dict[str, StopReason] = {
    "stop": "stop",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "length",
}


def make_client(config: ProviderConfig) -> AsyncOpenAI:
    """One client per worker. Base URL and key are passed explicitly, never taken from the
    SDK's own OPENAI_* variables; its retries are off (the runner retries, visibly)."""
    return AsyncOpenAI(
        base_url=config.openai_base_url or OPENAI_BASE_URL,
        # Keyless servers (llama.cpp, Ollama, vLLM without --api-key) ignore the header, and
        # the SDK refuses to run without one.
        api_key=config.openai_api_key or "unused",
        max_retries=0,
        # The read timeout only backs up the idle guard: no bytes for this long.
        timeout=httpx2.Timeout(config.idle_timeout, connect=config.connect_timeout),
    )


def to_openai_messages(
    conversation: tuple[Message, ...], instructions: str | None = None
) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for message in model_visible(conversation):
        if isinstance(message, UserMessage):
            messages.append({"role": "user", "content": message.text})
        elif isinstance(message, Summary):
            messages.append({"role": "user", "content": message.prompt_text()})
        elif isinstance(message, ToolResult):
            messages.append(
                {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
            )
        else:
            # Always a string: some servers reject `"content": null` beside tool calls.
            entry: dict[str, Any] = {"role": "assistant", "content": message.text}
            if message.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments_text()},
                    }
                    for call in message.tool_calls
                ]
            messages.append(entry)
    return messages


def to_openai_tools(tools: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def settings_arguments(
    settings: ModelSettings, *, has_tools: bool, max_tokens_field: str
) -> dict[str, Any]:
    """The request fields a session's model settings become (unset ones are left out)."""
    fields: dict[str, Any] = {}
    if settings.temperature is not None:
        fields["temperature"] = settings.temperature
    if settings.top_p is not None:
        fields["top_p"] = settings.top_p
    if settings.max_tokens is not None:
        fields[max_tokens_field] = settings.max_tokens
    if settings.stop:
        fields["stop"] = list(settings.stop)
    if settings.reasoning_effort is not None:
        fields["reasoning_effort"] = settings.reasoning_effort
    # Tool settings without tools are refused by OpenAI itself.
    if has_tools and settings.tool_choice is not None:
        choice = settings.tool_choice
        fields["tool_choice"] = (
            choice
            if choice in ("auto", "none", "required")
            else {"type": "function", "function": {"name": choice}}
        )
    if has_tools and settings.parallel_tool_calls is not None:
        fields["parallel_tool_calls"] = settings.parallel_tool_calls
    return fields


def max_tokens_field(base_url: str) -> str:
    """OpenAI itself wants `max_completion_tokens` (`max_tokens` is deprecated there and refused
    by reasoning models); compatible servers read `max_tokens` (Ollama reads nothing else)."""
    host = urlsplit(base_url).hostname or ""
    return "max_completion_tokens" if host.endswith("openai.com") else "max_tokens"


@dataclass
class _CallSlot:
    id: str = ""
    name: str = ""
    arguments: str = ""

    def add_name(self, name: str) -> None:
        # Most servers send the name once; some (llama-cpp-python) repeat the whole name in
        # every chunk. A piece that starts with what we have is the whole name again.
        if self.name and name.startswith(self.name):
            self.name = name
        else:
            self.name += name

    def call(self) -> ToolCall:
        # Unique when the server sends none: results are matched to calls by id.
        call_id = self.id or f"call_{uuid.uuid4().hex[:12]}"
        return ToolCall.from_text(call_id, self.name, self.arguments)


@dataclass
class _Turn:
    """A turn as its chunks arrive."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, _CallSlot] = field(default_factory=dict)
    finish: str | None = None
    usage: Usage | None = None

    def reply(self) -> AssistantMessage:
        if self.finish is None:
            raise ModelFault(
                "truncated", "the model stream ended without a finish reason (cut off)"
            )
        if self.finish == "content_filter":
            raise ModelFault("refused", "the provider's content filter stopped the answer")
        stop = FINISH_REASONS.get(self.finish)
        if stop is None:
            raise ModelFault("internal", f"the provider ended the turn with {self.finish!r}")
        calls = tuple(slot.call() for _, slot in sorted(self.calls.items()))
        return AssistantMessage("".join(self.text), calls, stop, usage=self.usage)


class OpenAIModel:
    def __init__(self, client: AsyncOpenAI, model: str, idle_timeout: float) -> None:
        self.client = client
        self.model = model
        self.idle_timeout = idle_timeout

    async def complete(self, request: ModelRequest, on_delta: DeltaSink) -> AssistantMessage:
        try:
            return await self._complete(request, on_delta)
        except openai.APIStatusError as exc:
            detail = _error_detail(exc.body, exc.message)
            raise fault_for_status(exc.status_code, detail, exc.response.headers) from exc
        except openai.APITimeoutError as exc:
            raise ModelFault(
                "idle_timeout", f"the model server sent nothing for {self.idle_timeout:g} s"
            ) from exc
        except openai.APIConnectionError as exc:
            raise ModelFault("connection_error", _connection_detail(exc)) from exc
        except openai.APIError as exc:  # an error event in the middle of the stream
            kind: FaultKind = (
                "context_too_long" if is_context_overflow(exc.message) else "server_error"
            )
            raise ModelFault(kind, f"the model stream failed: {exc.message}") from exc
        except ValueError as exc:  # a data line that is not JSON
            raise ModelFault("server_error", f"the model stream is malformed: {exc}") from exc

    async def _complete(self, request: ModelRequest, on_delta: DeltaSink) -> AssistantMessage:
        tools = to_openai_tools(request.tools)
        arguments = settings_arguments(
            request.settings,
            has_tools=bool(tools),
            max_tokens_field=max_tokens_field(str(self.client.base_url)),
        )
        body: dict[str, Any] = {
            "model": self.model,
            "messages": cast(
                list[ChatCompletionMessageParam],
                to_openai_messages(request.conversation, request.instructions),
            ),
            "tools": cast(Any, tools) if tools else openai.omit,
            "stream": True,
            "stream_options": {"include_usage": True},
            "extra_body": arguments or None,
        }
        try:
            stream = await self.client.chat.completions.create(**body)
        except openai.APITimeoutError:
            raise
        except openai.APIConnectionError:
            # A pooled connection the server closed as we reused it: llama.cpp closes each one
            # after a streamed answer while announcing keep-alive. Nothing was answered, so one
            # immediate second try is safe; a server that is really down fails it too.
            stream = await self.client.chat.completions.create(**body)
        turn = _Turn()
        async with stream:
            content_type = stream.response.headers.get("content-type", "")
            if "text/event-stream" not in content_type:
                # The SDK reads such an answer as an empty stream.
                raise ModelFault(
                    "bad_request", f"the model server did not stream (it sent {content_type!r})"
                )
            async for chunk in idle_guarded(stream, self.idle_timeout):
                await self._take(chunk, turn, on_delta)
        return turn.reply()

    async def _take(self, chunk: ChatCompletionChunk, turn: _Turn, on_delta: DeltaSink) -> None:
        if chunk.usage is not None:
            details = chunk.usage.prompt_tokens_details
            turn.usage = Usage(
                chunk.usage.prompt_tokens,
                chunk.usage.completion_tokens,
                (details.cached_tokens or 0) if details is not None else 0,
            )
        if chunk.choices is None:
            # Some servers (older vLLM) send a bare error object as a chunk.
            extra = chunk.model_extra or {}
            status = extra.get("code")
            detail = str(extra.get("message") or extra)
            if isinstance(status, int) and 400 <= status < 600:
                raise fault_for_status(status, detail)
            raise ModelFault("server_error", f"the model stream failed: {detail}")
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                turn.text.append(delta.content)
                await on_delta(delta.content)
            for piece in delta.tool_calls or ():
                slot = turn.calls.setdefault(piece.index, _CallSlot())
                slot.id = piece.id or slot.id
                if piece.function is not None:
                    if piece.function.name:
                        slot.add_name(piece.function.name)
                    slot.arguments += piece.function.arguments or ""
            if choice.finish_reason:
                turn.finish = choice.finish_reason


def _error_detail(body: object, fallback: str) -> str:
    """The provider's own words: `message`, with `type` and `code` when it gives them."""
    if not isinstance(body, dict) or not body.get("message"):
        return fallback
    tags = [str(body[key]) for key in ("type", "code") if body.get(key)]
    return f"{body['message']} ({', '.join(tags)})" if tags else str(body["message"])


def _connection_detail(exc: openai.APIConnectionError) -> str:
    cause = exc.__cause__
    reason = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
    return f"could not talk to the model server ({reason})"
