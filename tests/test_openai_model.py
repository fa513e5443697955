"""The OpenAI-compatible adapter against a real local HTTP server.

A tiny fake chat-completions endpoint runs under uvicorn in a background thread on an ephemeral
127.0.0.1 port and streams `data: {...}` chunks the way OpenAI does.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.agent.conversation import AssistantMessage, ToolCall, ToolResult, UserMessage
from app.agent.models import ModelError, ModelRequest, make_model
from app.agent.models.base import ToolSpec
from app.agent.models.openai import (
    FINISH_REASONS,
    OpenAIModel,
    to_openai_messages,
    to_openai_tools,
)

# --- the fake provider ----------------------------------------------------------------------


@dataclass
class Reply:
    """One scripted answer: SSE lines (each sent as `data: <line>`), or an HTTP error."""

    lines: list[str] = field(default_factory=list)
    status: int = 200
    body: str = ""
    content_type: str = "text/event-stream"
    pause: float = 0.0  # between chunks, so the client reads them one by one


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeProvider:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Seen] = []
        self.url = ""

    def reset(self) -> None:
        self.replies.clear()
        self.requests.clear()

    def answer(self, reply: Reply) -> None:
        self.replies.append(reply)

    async def completions(self, request: Request) -> Response:
        self.requests.append(
            Seen(request.url.path, dict(request.headers), json.loads(await request.body()))
        )
        reply = self.replies.popleft() if self.replies else Reply(status=503, body="no reply")
        if reply.status != 200:
            return JSONResponse({"error": {"message": reply.body}}, status_code=reply.status)
        if reply.content_type != "text/event-stream":
            return Response(reply.body, media_type=reply.content_type)

        async def stream() -> AsyncIterator[str]:
            import asyncio

            for line in reply.lines:
                yield f"data: {line}\n\n"
                if reply.pause:
                    await asyncio.sleep(reply.pause)

        return StreamingResponse(stream(), media_type="text/event-stream")

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.completions, methods=["POST"])])


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    fake = FakeProvider()
    config = uvicorn.Config(
        fake.app(), host="127.0.0.1", port=0, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="fake-openai", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive(), "fake provider failed to start"
        assert time.monotonic() < deadline, "fake provider did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    fake.url = f"http://127.0.0.1:{port}/v1"
    yield fake
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def fake(provider: FakeProvider) -> FakeProvider:
    provider.reset()
    return provider


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> str:
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": "fake",
            "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
        }
    )


def text_reply(*pieces: str, finish: str = "stop") -> Reply:
    lines = [chunk({"role": "assistant", "content": ""})]
    lines += [chunk({"content": p}) for p in pieces]
    lines += [chunk(finish=finish), "[DONE]"]
    return Reply(lines)


class Deltas:
    def __init__(self) -> None:
        self.pieces: list[str] = []

    async def __call__(self, text: str) -> None:
        self.pieces.append(text)


PROMPT = ModelRequest((UserMessage("hello"),), ())


async def complete(
    fake: FakeProvider, request: ModelRequest = PROMPT, api_key: str | None = None
) -> tuple[AssistantMessage, Deltas]:
    deltas = Deltas()
    reply = await OpenAIModel("fake-model", fake.url, api_key).complete(request, deltas)
    return reply, deltas


# --- text -----------------------------------------------------------------------------------


async def test_text_is_streamed_and_returned(fake: FakeProvider) -> None:
    fake.answer(text_reply("Hel", "lo, ", "world", "!"))
    reply, deltas = await complete(fake)
    assert deltas.pieces == ["Hel", "lo, ", "world", "!"]
    assert reply == AssistantMessage("Hello, world!", (), "stop")


async def test_deltas_arrive_while_the_stream_is_open(fake: FakeProvider) -> None:
    reply = text_reply("a", "b", "c")
    reply.pause = 0.1
    fake.answer(reply)
    stamps: list[float] = []

    async def on_delta(text: str) -> None:
        stamps.append(time.monotonic())

    started = time.monotonic()
    await OpenAIModel("m", fake.url, None).complete(PROMPT, on_delta)
    finished = time.monotonic()
    assert len(stamps) == 3
    # The first delta is handed on before the stream ends.
    assert finished - stamps[0] >= 0.15
    assert finished - started >= 0.3


async def test_request_basics(fake: FakeProvider) -> None:
    fake.answer(text_reply("ok"))
    await complete(fake)
    (seen,) = fake.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.body["model"] == "fake-model"
    assert seen.body["stream"] is True
    assert seen.body["messages"] == [{"role": "user", "content": "hello"}]
    assert "tools" not in seen.body
    assert "authorization" not in seen.headers
    assert seen.headers["content-type"] == "application/json"
    assert "text/event-stream" in seen.headers["accept"]


async def test_api_key_is_sent_as_a_bearer_token(fake: FakeProvider) -> None:
    fake.answer(text_reply("ok"))
    await complete(fake, api_key="sk-test-123")
    assert fake.requests[0].headers["authorization"] == "Bearer sk-test-123"


async def test_trailing_slash_in_the_base_url(fake: FakeProvider) -> None:
    fake.answer(text_reply("ok"))
    reply = await OpenAIModel("m", fake.url + "/", None).complete(PROMPT, Deltas())
    assert reply.text == "ok"
    assert fake.requests[0].path == "/v1/chat/completions"


async def test_make_model_builds_the_adapter(fake: FakeProvider) -> None:
    fake.answer(text_reply("via make_model"))
    model = make_model("openai:gpt-test", None, openai_base_url=fake.url, openai_api_key="k")
    assert isinstance(model, OpenAIModel)
    reply = await model.complete(PROMPT, Deltas())
    assert reply.text == "via make_model"
    assert fake.requests[0].body["model"] == "gpt-test"
    assert fake.requests[0].headers["authorization"] == "Bearer k"


# --- finish reasons -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("finish", "expected"),
    [
        ("stop", "stop"),
        ("tool_calls", "tool_use"),
        ("function_call", "tool_use"),
        ("length", "length"),
        ("content_filter", "error"),
        ("something_new", "error"),
    ],
)
async def test_finish_reason_mapping(fake: FakeProvider, finish: str, expected: str) -> None:
    fake.answer(text_reply("x", finish=finish))
    reply, _ = await complete(fake)
    assert reply.stop_reason == expected


def test_finish_reason_table_matches_the_spec() -> None:
    assert FINISH_REASONS["stop"] == "stop"
    assert FINISH_REASONS["tool_calls"] == "tool_use"
    assert FINISH_REASONS["length"] == "length"


# --- tool calls -----------------------------------------------------------------------------


def tool_call_reply() -> Reply:
    """Two calls, split across chunks the way OpenAI streams them."""
    lines = [
        chunk({"role": "assistant", "content": None}),
        chunk({"content": "Let me check."}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_abc",
                        "type": "function",
                        "function": {"name": "put_note", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"ke'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'y": "k", '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"text": "v"}'}}]}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_def",
                        "type": "function",
                        "function": {"name": "sleep", "arguments": '{"seconds"'},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": ": 2.5}"}}]}),
        chunk(finish="tool_calls"),
        "[DONE]",
    ]
    return Reply(lines)


async def test_tool_calls_are_assembled(fake: FakeProvider) -> None:
    fake.answer(tool_call_reply())
    reply, deltas = await complete(fake)
    assert reply.stop_reason == "tool_use"
    assert reply.text == "Let me check."
    assert deltas.pieces == ["Let me check."]
    assert reply.tool_calls == (
        ToolCall("call_abc", "put_note", {"key": "k", "text": "v"}),
        ToolCall("call_def", "sleep", {"seconds": 2.5}),
    )


async def test_interleaved_tool_call_chunks_are_sorted_by_index(fake: FakeProvider) -> None:
    lines = [
        chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "get_note"}}]}),
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "sleep"}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"key":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"seconds": 1}'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": ' "n"}'}}]}),
        chunk(finish="tool_calls"),
        "[DONE]",
    ]
    fake.answer(Reply(lines))
    reply, deltas = await complete(fake)
    assert deltas.pieces == []
    assert reply.text == ""
    assert reply.tool_calls == (
        ToolCall("a", "sleep", {"seconds": 1}),
        ToolCall("b", "get_note", {"key": "n"}),
    )


async def test_invalid_json_arguments_do_not_crash(fake: FakeProvider) -> None:
    lines = [
        chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "sleep"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"seconds": 1'}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "get_note"}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": "[1, 2]"}}]}),
        chunk({"tool_calls": [{"index": 2, "id": "c3", "function": {"name": "ask_user"}}]}),
        chunk(finish="tool_calls"),
        "[DONE]",
    ]
    fake.answer(Reply(lines))
    reply, _ = await complete(fake)
    assert reply.stop_reason == "tool_use"
    assert [c.arguments for c in reply.tool_calls] == [
        {"_unparsed": '{"seconds": 1'},
        {"_value": [1, 2]},
        {},  # no arguments at all
    ]


async def test_calls_without_ids_get_unique_ids(fake: FakeProvider) -> None:
    # Some OpenAI-compatible servers leave ids out. Ids must still be unique across turns, or
    # results would be matched to the wrong call when the transcript is rebuilt.
    def no_ids() -> Reply:
        return Reply(
            [
                chunk({"tool_calls": [{"index": 0, "function": {"name": "sleep"}}]}),
                chunk({"tool_calls": [{"index": 1, "function": {"name": "sleep"}}]}),
                chunk(finish="tool_calls"),
                "[DONE]",
            ]
        )

    fake.answer(no_ids())
    fake.answer(no_ids())
    first, _ = await complete(fake)
    second, _ = await complete(fake)
    ids = [c.id for c in (*first.tool_calls, *second.tool_calls)]
    assert all(ids)
    assert len(set(ids)) == 4


# --- what is sent ---------------------------------------------------------------------------

TOOLS = (
    ToolSpec(
        "sleep",
        "Wait.",
        {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": []},
    ),
    ToolSpec("get_note", "Read a note.", {"type": "object", "properties": {}}),
)


async def test_conversation_and_tools_are_converted(fake: FakeProvider) -> None:
    conversation = (
        UserMessage("save a note"),
        AssistantMessage(
            "",
            (
                ToolCall("c1", "put_note", {"key": "k", "text": "v"}),
                ToolCall("c2", "sleep", {"seconds": 1}),
            ),
            "tool_use",
        ),
        ToolResult("c1", "put_note", "saved note 'k'"),
        ToolResult("c2", "sleep", "worker interrupted", is_error=True, interrupted=True),
        AssistantMessage("Done, I saved it.", (), "stop"),
        UserMessage("thanks"),
    )
    fake.answer(text_reply("you're welcome"))
    await complete(fake, ModelRequest(conversation, TOOLS))
    body = fake.requests[0].body
    assert body["messages"] == [
        {"role": "user", "content": "save a note"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "put_note", "arguments": '{"key": "k", "text": "v"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "sleep", "arguments": '{"seconds": 1}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "saved note 'k'"},
        {"role": "tool", "tool_call_id": "c2", "content": "worker interrupted"},
        {"role": "assistant", "content": "Done, I saved it."},
        {"role": "user", "content": "thanks"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "sleep",
                "description": "Wait.",
                "parameters": {
                    "type": "object",
                    "properties": {"seconds": {"type": "number"}},
                    "required": [],
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "get_note",
                "description": "Read a note.",
                "parameters": {"type": "object", "properties": {}},
            },
        },
    ]


def test_converters_are_pure() -> None:
    assert to_openai_messages(()) == []
    assert to_openai_tools(()) == []
    message = AssistantMessage("text and a call", (ToolCall("c", "sleep", {}),), "tool_use")
    (converted,) = to_openai_messages((message,))
    assert converted["content"] == "text and a call"
    assert converted["tool_calls"][0]["function"]["arguments"] == "{}"


# --- failures -------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 429, 500, 503])
async def test_http_error_raises_model_error_with_the_status(
    fake: FakeProvider, status: int
) -> None:
    fake.answer(Reply(status=status, body="the provider is unhappy"))
    deltas = Deltas()
    with pytest.raises(ModelError) as raised:
        await OpenAIModel("m", fake.url, None).complete(PROMPT, deltas)
    assert str(status) in str(raised.value)
    assert "the provider is unhappy" in str(raised.value)
    assert deltas.pieces == []


async def test_error_chunk_in_the_stream_raises_model_error(fake: FakeProvider) -> None:
    lines = [
        chunk({"content": "partial"}),
        json.dumps({"error": {"message": "upstream overloaded", "type": "server_error"}}),
    ]
    fake.answer(Reply(lines))
    with pytest.raises(ModelError, match="upstream overloaded"):
        await complete(fake)


async def test_non_streaming_answer_raises_model_error(fake: FakeProvider) -> None:
    fake.answer(Reply(body='{"choices": []}', content_type="application/json"))
    with pytest.raises(ModelError, match="application/json"):
        await complete(fake)


async def test_unreachable_endpoint_raises() -> None:
    model = OpenAIModel("m", "http://127.0.0.1:9/v1", None)
    with pytest.raises((httpx.HTTPError, ModelError)):
        await model.complete(PROMPT, Deltas())


async def test_chunks_without_choices_are_ignored(fake: FakeProvider) -> None:
    usage = json.dumps({"id": "x", "choices": [], "usage": {"total_tokens": 3}})
    fake.answer(Reply([chunk({"content": "hi"}), chunk(finish="stop"), usage, "[DONE]"]))
    reply, _ = await complete(fake)
    assert reply == AssistantMessage("hi", (), "stop")
