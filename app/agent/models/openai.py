"""Any OpenAI-compatible chat-completions endpoint, streamed, with function calling."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from app.agent.conversation import (
    AssistantMessage,
    Message,
    StopReason,
    ToolCall,
    ToolResult,
    UserMessage,
)
from app.agent.models.base import DeltaSink, ModelError, ModelRequest, ToolSpec

FINISH_REASONS: dict[str, StopReason] = {
    "stop": "stop",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "length",
}


def to_openai_messages(conversation: tuple[Message, ...]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for message in conversation:
        if isinstance(message, UserMessage):
            messages.append({"role": "user", "content": message.text})
        elif isinstance(message, ToolResult):
            messages.append(
                {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
            )
        else:
            entry: dict[str, Any] = {"role": "assistant", "content": message.text or None}
            if message.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
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


def _parse_arguments(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        # Passed on as is: the tool call then fails argument validation with a clear error.
        return {"_unparsed": raw}
    return value if isinstance(value, dict) else {"_value": value}


class OpenAIModel:
    def __init__(self, model: str, base_url: str, api_key: str | None) -> None:
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key

    async def complete(self, request: ModelRequest, on_delta: DeltaSink) -> AssistantMessage:
        body: dict[str, Any] = {
            "model": self.model,
            "stream": True,
            "messages": to_openai_messages(request.conversation),
        }
        if request.tools:
            body["tools"] = to_openai_tools(request.tools)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        finish = "stop"
        timeout = httpx.Timeout(60.0, read=300.0)
        async with (
            httpx.AsyncClient(timeout=timeout) as client,
            aconnect_sse(
                client, "POST", f"{self.base_url}/chat/completions", json=body, headers=headers
            ) as source,
        ):
            if source.response.status_code >= 400:
                detail = (await source.response.aread()).decode(errors="replace")[:500]
                raise ModelError(f"model endpoint answered {source.response.status_code}: {detail}")
            content_type = source.response.headers.get("content-type", "")
            if "text/event-stream" not in content_type:
                detail = (await source.response.aread()).decode(errors="replace")[:500]
                raise ModelError(f"model endpoint did not stream ({content_type}): {detail}")
            async for event in source.aiter_sse():
                if event.data.strip() == "[DONE]":
                    break
                chunk = json.loads(event.data)
                if chunk.get("error"):
                    raise ModelError(f"model endpoint failed mid-stream: {chunk['error']}")
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        text.append(delta["content"])
                        await on_delta(delta["content"])
                    for call in delta.get("tool_calls") or ():
                        slot = calls.setdefault(
                            int(call.get("index", 0)), {"id": "", "name": "", "arguments": ""}
                        )
                        slot["id"] = call.get("id") or slot["id"]
                        function = call.get("function") or {}
                        slot["name"] += function.get("name") or ""
                        slot["arguments"] += function.get("arguments") or ""
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
        tool_calls = tuple(
            ToolCall(
                # Unique when the endpoint sends none: results are matched to calls by id.
                slot["id"] or f"call_{uuid.uuid4().hex[:12]}",
                slot["name"],
                _parse_arguments(slot["arguments"]),
            )
            for index, slot in sorted(calls.items())
        )
        stop = FINISH_REASONS.get(finish, "error")
        return AssistantMessage(text="".join(text), tool_calls=tool_calls, stop_reason=stop)
