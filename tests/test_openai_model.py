"""The OpenAI-compatible adapter (on the `openai` SDK) against a real local HTTP server that
answers as OpenAI does, and misbehaves as real servers do (tests/fake_provider.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from app.agent.conversation import AssistantMessage, ToolCall, ToolResult, Usage, UserMessage
from app.agent.models import ModelFault, ModelRequest, ModelSettings, ProviderConfig, Providers
from app.agent.models.base import ToolSpec
from app.agent.models.openai import (
    FINISH_REASONS,
    OpenAIModel,
    max_tokens_field,
    settings_arguments,
    to_openai_messages,
    to_openai_tools,
)
from tests.fake_provider import (
    DONE,
    Deltas,
    FakeProvider,
    Frame,
    Reply,
    chunk,
    error_reply,
    text_reply,
    usage_chunk,
)

PROMPT = ModelRequest((UserMessage("hello"),), ())


def model(fake: FakeProvider, *, api_key: str | None = None, idle: float = 10.0) -> OpenAIModel:
    config = ProviderConfig(openai_base_url=fake.openai_url, openai_api_key=api_key)
    built = Providers(config).model("openai:fake-model", None)
    assert isinstance(built, OpenAIModel)
    built.idle_timeout = idle
    return built


async def complete(
    fake: FakeProvider, request: ModelRequest = PROMPT, **options: Any
) -> tuple[AssistantMessage, Deltas]:
    deltas = Deltas()
    reply = await model(fake, **options).complete(request, deltas)
    return reply, deltas


async def fault(fake: FakeProvider, request: ModelRequest = PROMPT, **options: Any) -> ModelFault:
    with pytest.raises(ModelFault) as raised:
        await complete(fake, request, **options)
    return raised.value


# --- text -----------------------------------------------------------------------------------


async def test_text_is_streamed_and_returned_with_usage(fake: FakeProvider) -> None:
    reply = text_reply("Hel", "lo, ", "world", "!")
    reply.frames.insert(-1, usage_chunk(12, 4, cached=8))
    fake.answer(reply)
    answer, deltas = await complete(fake)
    assert deltas.pieces == ["Hel", "lo, ", "world", "!"]
    assert answer == AssistantMessage("Hello, world!", (), "stop")
    assert answer.usage == Usage(12, 4, 8)
    assert answer.wire()["usage"] == {"inputTokens": 12, "outputTokens": 4, "cachedTokens": 8}


async def test_deltas_arrive_while_the_stream_is_open(fake: FakeProvider) -> None:
    reply = text_reply("a", "b", "c")
    reply.pause = 0.1
    fake.answer(reply)
    stamps: list[float] = []

    async def on_delta(text: str) -> None:
        stamps.append(time.monotonic())

    await model(fake).complete(PROMPT, on_delta)
    finished = time.monotonic()
    assert len(stamps) == 3
    assert finished - stamps[0] >= 0.15  # the first delta is handed on before the end


async def test_request_basics(fake: FakeProvider) -> None:
    fake.answer(text_reply("ok"))
    await complete(fake, ModelRequest((UserMessage("hello"),), (), "Be brief."))
    (seen,) = fake.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.body["model"] == "fake-model"
    assert seen.body["stream"] is True
    assert seen.body["stream_options"] == {"include_usage": True}
    assert seen.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
    ]
    assert "tools" not in seen.body and "tool_choice" not in seen.body
    # No retries of the SDK's own: the runner retries, and says so.
    assert seen.headers.get("x-stainless-retry-count") in (None, "0")


async def test_the_api_key_is_a_bearer_token(fake: FakeProvider) -> None:
    fake.answer(text_reply("ok"), text_reply("ok"))
    await complete(fake, api_key="sk-test-123")
    await complete(fake)
    assert fake.requests[0].headers["authorization"] == "Bearer sk-test-123"
    # A keyless server still gets a request (the SDK insists on some key).
    assert fake.requests[1].headers["authorization"] == "Bearer unused"


async def test_model_settings_are_passed_through(fake: FakeProvider) -> None:
    settings = ModelSettings(
        temperature=0.2,
        top_p=0.9,
        max_tokens=64,
        tool_choice="get_note",
        parallel_tool_calls=False,
        stop=("END",),
        reasoning_effort="low",
    )
    fake.answer(text_reply("ok"))
    await complete(fake, ModelRequest((UserMessage("hi"),), TOOLS, None, settings))
    body = fake.requests[0].body
    assert body["temperature"] == 0.2
    assert body["top_p"] == 0.9
    assert body["max_tokens"] == 64 and "max_completion_tokens" not in body
    assert body["stop"] == ["END"]
    assert body["reasoning_effort"] == "low"
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_note"}}
    assert body["parallel_tool_calls"] is False


def test_settings_without_tools_leave_tool_options_out() -> None:
    settings = ModelSettings(tool_choice="required", parallel_tool_calls=True)
    assert settings_arguments(settings, has_tools=False, max_tokens_field="max_tokens") == {}
    assert settings_arguments(settings, has_tools=True, max_tokens_field="max_tokens") == {
        "tool_choice": "required",
        "parallel_tool_calls": True,
    }


def test_openai_itself_gets_max_completion_tokens() -> None:
    assert max_tokens_field("https://api.openai.com/v1") == "max_completion_tokens"
    assert max_tokens_field("http://127.0.0.1:8080/v1") == "max_tokens"
    assert max_tokens_field("http://localhost:11434/v1") == "max_tokens"


@pytest.mark.parametrize(
    ("finish", "expected"), [("stop", "stop"), ("tool_calls", "tool_use"), ("length", "length")]
)
async def test_finish_reasons(fake: FakeProvider, finish: str, expected: str) -> None:
    fake.answer(text_reply("x", finish=finish))
    reply, _ = await complete(fake)
    assert reply.stop_reason == expected
    assert FINISH_REASONS[finish] == expected


# --- tool calls -----------------------------------------------------------------------------


def tool_call_reply() -> Reply:
    """Two calls, split across chunks the way OpenAI streams them."""
    frames = [
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
        DONE,
    ]
    return Reply(frames)


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
    frames = [
        chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "get_note"}}]}),
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "sleep"}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"key":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"seconds": 1}'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": ' "n"}'}}]}),
        chunk(finish="tool_calls"),
        DONE,
    ]
    fake.answer(Reply(frames))
    reply, deltas = await complete(fake)
    assert deltas.pieces == [] and reply.text == ""
    assert reply.tool_calls == (
        ToolCall("a", "sleep", {"seconds": 1}),
        ToolCall("b", "get_note", {"key": "n"}),
    )


async def test_a_name_repeated_in_every_chunk_is_one_name(fake: FakeProvider) -> None:
    """llama-cpp-python repeats the whole name in each chunk of a call."""
    frames = [
        chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "get_note"}}]}),
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "function": {"name": "get_note", "arguments": '{"key": '}}
                ]
            }
        ),
        chunk(
            {"tool_calls": [{"index": 0, "function": {"name": "get_note", "arguments": '"k"}'}}]}
        ),
        chunk(finish="tool_calls"),
        DONE,
    ]
    fake.answer(Reply(frames))
    reply, _ = await complete(fake)
    assert reply.tool_calls == (ToolCall("c", "get_note", {"key": "k"}),)


async def test_a_name_streamed_in_pieces_is_joined(fake: FakeProvider) -> None:
    frames = [
        chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "get_"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"name": "note", "arguments": "{}"}}]}),
        chunk(finish="tool_calls"),
        DONE,
    ]
    fake.answer(Reply(frames))
    reply, _ = await complete(fake)
    assert reply.tool_calls == (ToolCall("c", "get_note", {}),)


async def test_arguments_that_are_not_an_object_are_kept_as_written(fake: FakeProvider) -> None:
    frames = [
        chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "sleep"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"seconds": 1'}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "get_note"}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": "[1, 2]"}}]}),
        chunk({"tool_calls": [{"index": 2, "id": "c3", "function": {"name": "ask_user"}}]}),
        chunk(finish="tool_calls"),
        DONE,
    ]
    fake.answer(Reply(frames))
    reply, _ = await complete(fake)
    assert [(c.arguments, c.invalid_arguments) for c in reply.tool_calls] == [
        ({}, '{"seconds": 1'),
        ({}, "[1, 2]"),
        ({}, None),  # no arguments at all: an empty object
    ]
    assert reply.tool_calls[0].wire()["invalidArguments"] == '{"seconds": 1'


async def test_calls_without_ids_get_unique_ids(fake: FakeProvider) -> None:
    def no_ids() -> Reply:
        return Reply(
            [
                chunk({"tool_calls": [{"index": 0, "function": {"name": "sleep"}}]}),
                chunk({"tool_calls": [{"index": 1, "function": {"name": "sleep"}}]}),
                chunk(finish="tool_calls"),
                DONE,
            ]
        )

    fake.answer(no_ids(), no_ids())
    first, _ = await complete(fake)
    second, _ = await complete(fake)
    ids = [c.id for c in (*first.tool_calls, *second.tool_calls)]
    assert all(ids) and len(set(ids)) == 4


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
                ToolCall("c2", "sleep", {}, '{"seconds": one}'),
            ),
            "tool_use",
        ),
        ToolResult("c1", "put_note", "saved note 'k'"),
        ToolResult("c2", "sleep", "invalid arguments", is_error=True),
        AssistantMessage("Done, I saved it.", (), "stop"),
        UserMessage("thanks"),
    )
    fake.answer(text_reply("you're welcome"))
    await complete(fake, ModelRequest(conversation, TOOLS))
    body = fake.requests[0].body
    assert body["messages"] == [
        {"role": "user", "content": "save a note"},
        {
            # Never `null`: some servers (llama-cpp-python) answer 500 to that.
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "put_note", "arguments": '{"key": "k", "text": "v"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    # The model is shown what it wrote, not a re-wrapped object.
                    "function": {"name": "sleep", "arguments": '{"seconds": one}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "saved note 'k'"},
        {"role": "tool", "tool_call_id": "c2", "content": "invalid arguments"},
        {"role": "assistant", "content": "Done, I saved it."},
        {"role": "user", "content": "thanks"},
    ]
    assert body["tools"] == to_openai_tools(TOOLS)
    assert body["tools"][0] == {
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
    }


def test_converters_are_pure() -> None:
    assert to_openai_messages(()) == []
    assert to_openai_tools(()) == []
    message = AssistantMessage("text and a call", (ToolCall("c", "sleep", {}),), "tool_use")
    (converted,) = to_openai_messages((message,))
    assert converted["content"] == "text and a call"
    assert converted["tool_calls"][0]["function"]["arguments"] == "{}"


# --- faults ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind", "code"),
    [
        (429, "rate_limited", "MODEL_UNAVAILABLE"),
        (500, "server_error", "MODEL_UNAVAILABLE"),
        (503, "server_error", "MODEL_UNAVAILABLE"),
        (400, "bad_request", "MODEL_BAD_REQUEST"),
        (401, "auth_failed", "MODEL_AUTH_FAILED"),
        (403, "auth_failed", "MODEL_AUTH_FAILED"),
        (404, "not_found", "MODEL_NOT_FOUND"),
    ],
)
async def test_http_errors_become_faults(
    fake: FakeProvider, status: int, kind: str, code: str
) -> None:
    fake.answer(error_reply(status, "the provider is unhappy"))
    deltas = Deltas()
    with pytest.raises(ModelFault) as raised:
        await model(fake).complete(PROMPT, deltas)
    assert raised.value.kind == kind and raised.value.code == code
    assert raised.value.status == status
    assert "the provider is unhappy" in raised.value.message
    assert deltas.pieces == []


async def test_retry_after_is_read(fake: FakeProvider) -> None:
    fake.answer(error_reply(429, "slow down", **{"retry-after": "7"}))
    assert (await fault(fake)).retry_after == 7
    fake.answer(error_reply(429, "slow down", **{"retry-after-ms": "1500", "retry-after": "9"}))
    assert (await fault(fake)).retry_after == 1.5


async def test_context_overflow_is_its_own_fault(fake: FakeProvider) -> None:
    body = {
        "error": {
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
        }
    }
    fake.answer(Reply(status=400, body=body))
    raised = await fault(fake)
    assert raised.kind == "context_too_long" and raised.code == "MODEL_CONTEXT_TOO_LONG"


async def test_a_stream_cut_off_without_a_finish_reason_is_a_fault(fake: FakeProvider) -> None:
    """A bare `[DONE]` after half an answer is not a finished turn."""
    fake.answer(text_reply("half of the ans", finish=None))
    deltas = Deltas()
    with pytest.raises(ModelFault) as raised:
        await model(fake).complete(PROMPT, deltas)
    assert raised.value.kind == "truncated" and raised.value.retryable
    assert deltas.pieces == ["half of the ans"]


async def test_an_empty_answer_is_a_fault(fake: FakeProvider) -> None:
    """llama-cpp-python answers a context overflow with an empty 200 stream."""
    fake.answer(Reply([]))
    assert (await fault(fake)).kind == "truncated"


async def test_a_dropped_connection_is_a_fault(fake: FakeProvider) -> None:
    reply = text_reply("a", "b", "c")
    reply.drop_after = 2
    fake.answer(reply)
    assert (await fault(fake)).kind == "connection_error"


async def test_a_refused_connection_is_a_fault() -> None:
    config = ProviderConfig(openai_base_url="http://127.0.0.1:9/v1")
    broken = Providers(config).model("openai:m", None)
    with pytest.raises(ModelFault) as raised:
        await broken.complete(PROMPT, Deltas())
    assert raised.value.kind == "connection_error" and raised.value.retryable


async def test_a_stalled_stream_is_a_fault(fake: FakeProvider) -> None:
    reply = text_reply("a", "b")
    reply.stall_after, reply.stall = 2, 3.0
    fake.answer(reply)
    started = time.monotonic()
    raised = await fault(fake, idle=0.3)
    assert raised.kind == "idle_timeout" and raised.retryable
    assert time.monotonic() - started < 2.5


async def test_an_error_chunk_mid_stream_is_a_fault(fake: FakeProvider) -> None:
    frames = [
        chunk({"content": "partial"}),
        Frame('{"error": {"message": "upstream overloaded", "type": "server_error"}}'),
    ]
    fake.answer(Reply(frames))
    raised = await fault(fake)
    assert raised.kind == "server_error" and "upstream overloaded" in raised.message


async def test_a_bare_error_object_mid_stream_is_a_fault(fake: FakeProvider) -> None:
    """Older vLLM sends `{"object": "error", ...}` as a chunk."""
    frames = [Frame('{"object": "error", "message": "bad tool schema", "code": 400}')]
    fake.answer(Reply(frames))
    raised = await fault(fake)
    assert raised.kind == "bad_request" and "bad tool schema" in raised.message


async def test_a_non_streaming_answer_is_a_fault(fake: FakeProvider) -> None:
    fake.answer(Reply(body='{"choices": []}', content_type="application/json"))
    raised = await fault(fake)
    assert raised.kind == "bad_request" and "application/json" in raised.message


async def test_a_content_filter_is_a_refusal(fake: FakeProvider) -> None:
    fake.answer(text_reply("I will not", finish="content_filter"))
    raised = await fault(fake)
    assert raised.kind == "refused" and raised.code == "MODEL_REFUSED"


async def test_chunks_without_choices_are_ignored(fake: FakeProvider) -> None:
    fake.answer(Reply([chunk({"content": "hi"}), chunk(finish="stop"), usage_chunk(3, 1), DONE]))
    reply, _ = await complete(fake)
    assert reply == AssistantMessage("hi", (), "stop")


async def test_a_failed_turn_is_never_shown_to_the_model(fake: FakeProvider) -> None:
    conversation = (
        UserMessage("hello"),
        AssistantMessage("model error: endpoint answered 500", (), "error"),
        UserMessage("try again"),
    )
    fake.answer(text_reply("ok"))
    await complete(fake, ModelRequest(conversation, ()))
    assert fake.requests[0].body["messages"] == [
        {"role": "user", "content": "hello"},
        {"role": "user", "content": "try again"},
    ]
