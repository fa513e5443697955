"""The Anthropic adapter (on the `anthropic` SDK) against a real local HTTP server that speaks
the Messages API's event stream, and fails as the real one does (tests/fake_provider.py)."""

from __future__ import annotations

from typing import Any

import pytest

from app.agent.conversation import AssistantMessage, ToolCall, ToolResult, Usage, UserMessage
from app.agent.models import ModelFault, ModelRequest, ModelSettings, ProviderConfig, Providers
from app.agent.models.anthropic import AnthropicModel, settings_arguments, to_anthropic_messages
from app.agent.models.base import ToolSpec
from tests.fake_provider import (
    Deltas,
    FakeProvider,
    Reply,
    event,
    message_end,
    message_start,
    text_block,
    tool_use_block,
)

PROMPT = ModelRequest((UserMessage("hello"),), ())
TOOLS = (ToolSpec("get_note", "Read a note.", {"type": "object", "properties": {}}),)


def model(fake: FakeProvider, *, idle: float = 10.0, max_tokens: int = 1024) -> AnthropicModel:
    config = ProviderConfig(
        anthropic_base_url=fake.root,
        anthropic_api_key="sk-ant-test",
        anthropic_max_tokens=max_tokens,
        idle_timeout=idle,
    )
    built = Providers(config).model("anthropic:claude-test", None)
    assert isinstance(built, AnthropicModel)
    return built


async def complete(
    fake: FakeProvider, request: ModelRequest = PROMPT, **options: Any
) -> tuple[AssistantMessage, Deltas]:
    deltas = Deltas()
    return await model(fake, **options).complete(request, deltas), deltas


async def fault(fake: FakeProvider, **options: Any) -> ModelFault:
    with pytest.raises(ModelFault) as raised:
        await complete(fake, **options)
    return raised.value


def answer(*frames_lists: Any, stop: str | None = "end_turn") -> Reply:
    frames = [message_start(input_tokens=20, cache_read=12)]
    for frames_list in frames_lists:
        frames.extend(frames_list)
    if stop is not None:
        frames.extend(message_end(stop, output_tokens=7))
    return Reply(frames)


async def test_text_streams_with_usage(fake: FakeProvider) -> None:
    fake.answer(answer(text_block(0, "Hel", "lo.")))
    reply, deltas = await complete(fake)
    assert deltas.pieces == ["Hel", "lo."]
    assert reply == AssistantMessage("Hello.", (), "stop")
    # Input counts every prompt token, cache reads included; cached says how many of them.
    assert reply.usage == Usage(32, 7, 12)
    seen = fake.requests[0]
    assert seen.path == "/v1/messages"
    assert seen.body["model"] == "claude-test"
    assert seen.body["max_tokens"] == 1024
    assert seen.body["stream"] is True
    assert "system" not in seen.body and "tools" not in seen.body
    assert seen.headers["authorization"] == "Bearer sk-ant-test"


async def test_tool_use_is_assembled(fake: FakeProvider) -> None:
    fake.answer(
        answer(
            text_block(0, "Let me look."),
            tool_use_block(1, "toolu_1", "get_note", '{"ke', 'y": "k"}'),
            tool_use_block(2, "toolu_2", "get_note"),
            stop="tool_use",
        )
    )
    reply, _ = await complete(fake, ModelRequest((UserMessage("hi"),), TOOLS))
    assert reply.stop_reason == "tool_use"
    assert reply.text == "Let me look."
    assert reply.tool_calls == (
        ToolCall("toolu_1", "get_note", {"key": "k"}),
        ToolCall("toolu_2", "get_note", {}),
    )


async def test_the_request_carries_instructions_tools_settings_and_history(
    fake: FakeProvider,
) -> None:
    conversation = (
        UserMessage("save it"),
        AssistantMessage("On it.", (ToolCall("t1", "get_note", {"key": "k"}),), "tool_use"),
        ToolResult("t1", "get_note", "no such note", is_error=True),
        UserMessage("and then?"),
    )
    settings = ModelSettings(
        temperature=0.3,
        top_p=0.8,
        max_tokens=99,
        tool_choice="required",
        parallel_tool_calls=False,
        stop=("END",),
        reasoning_effort="high",
    )
    fake.answer(answer(text_block(0, "ok")))
    await complete(fake, ModelRequest(conversation, TOOLS, "Be terse.", settings))
    body = fake.requests[0].body
    assert body["system"] == "Be terse."
    assert body["max_tokens"] == 99
    assert body["temperature"] == 0.3 and body["top_p"] == 0.8
    assert body["stop_sequences"] == ["END"]
    assert body["output_config"] == {"effort": "high"}
    assert body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert body["tools"] == [
        {"name": "get_note", "description": "Read a note.", "input_schema": TOOLS[0].parameters}
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "save it"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "On it."},
                {"type": "tool_use", "id": "t1", "name": "get_note", "input": {"key": "k"}},
            ],
        },
        # The result and the next words share one user turn: turns alternate.
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": "no such note",
                    "is_error": True,
                },
                {"type": "text", "text": "and then?"},
            ],
        },
    ]


def test_tool_choice_mapping() -> None:
    def choice(**settings: Any) -> Any:
        fields = settings_arguments(ModelSettings(**settings), has_tools=True, default_max_tokens=1)
        return fields.get("tool_choice")

    assert choice() is None
    assert choice(tool_choice="auto") == {"type": "auto"}
    assert choice(tool_choice="none") == {"type": "none"}
    assert choice(tool_choice="get_note") == {"type": "tool", "name": "get_note"}
    assert choice(parallel_tool_calls=False) == {"type": "auto", "disable_parallel_tool_use": True}
    assert choice(tool_choice="none", parallel_tool_calls=False) == {"type": "none"}


def test_an_empty_assistant_turn_is_left_out() -> None:
    messages = to_anthropic_messages(
        (UserMessage("a"), AssistantMessage("", (), "aborted"), UserMessage("b"))
    )
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]


@pytest.mark.parametrize(
    ("stop", "expected"),
    [("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length")],
)
async def test_stop_reasons(fake: FakeProvider, stop: str, expected: str) -> None:
    fake.answer(answer(text_block(0, "x"), stop=stop))
    reply, _ = await complete(fake)
    assert reply.stop_reason == expected


@pytest.mark.parametrize(
    ("stop", "kind"),
    [("refusal", "refused"), ("model_context_window_exceeded", "context_too_long")],
)
async def test_stops_that_are_faults(fake: FakeProvider, stop: str, kind: str) -> None:
    fake.answer(answer(text_block(0, "x"), stop=stop))
    assert (await fault(fake)).kind == kind


async def test_a_stream_without_a_stop_reason_is_cut_off(fake: FakeProvider) -> None:
    fake.answer(answer(text_block(0, "half"), stop=None))
    assert (await fault(fake)).kind == "truncated"


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (429, "rate_limited"),
        (500, "server_error"),
        (529, "server_error"),
        (401, "auth_failed"),
        (404, "not_found"),
        (400, "bad_request"),
    ],
)
async def test_http_errors(fake: FakeProvider, status: int, kind: str) -> None:
    body = {"type": "error", "error": {"type": "some_error", "message": "no"}}
    fake.answer(Reply(status=status, body=body, headers={"retry-after": "4"}))
    raised = await fault(fake)
    assert raised.kind == kind and raised.status == status
    if raised.retryable:
        assert raised.retry_after == 4


async def test_a_prompt_too_long(fake: FakeProvider) -> None:
    error = {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens"}
    fake.answer(Reply(status=400, body={"type": "error", "error": error}))
    raised = await fault(fake)
    assert raised.kind == "context_too_long" and raised.code == "MODEL_CONTEXT_TOO_LONG"


async def test_an_overloaded_event_mid_stream_is_retryable(fake: FakeProvider) -> None:
    error = event("error", error={"type": "overloaded_error", "message": "Overloaded"})
    fake.answer(Reply([message_start(), *text_block(0, "par"), error]))
    raised = await fault(fake)
    assert raised.kind == "server_error" and raised.retryable
    assert "Overloaded" in raised.message


async def test_a_dropped_connection_is_retryable(fake: FakeProvider) -> None:
    reply = answer(text_block(0, "a", "b"))
    reply.drop_after = 2
    fake.answer(reply)
    assert (await fault(fake)).kind == "connection_error"


async def test_a_stall_is_retryable(fake: FakeProvider) -> None:
    reply = answer(text_block(0, "a", "b"))
    reply.stall_after, reply.stall = 2, 3.0
    fake.answer(reply)
    assert (await fault(fake, idle=0.3)).kind == "idle_timeout"


def test_a_failed_turn_is_never_shown_to_the_model() -> None:
    messages = to_anthropic_messages(
        (UserMessage("a"), AssistantMessage("model error: 500", (), "error"), UserMessage("b"))
    )
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
