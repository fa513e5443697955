"""The scripted model (SPEC section 6) and the tool registry with its built-in tools: pure."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema.exceptions import SchemaError

from app.agent.conversation import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResult,
    UserMessage,
)
from app.agent.models import ModelFault, ModelRequest, ProviderConfig, Providers
from app.agent.models.scripted import ScriptedModel, split_chunks
from app.agent.resume import interrupted_result, plan_resume
from app.agent.tools import Tool, ToolContext, ToolError, ToolRegistry, default_registry
from app.agent.tools.builtin import ASK_USER_CONTENT, BUILTIN_TOOLS, MAX_SLEEP_SECONDS

# --- helpers --------------------------------------------------------------------------------


class Deltas:
    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.times: list[float] = []

    async def __call__(self, text: str) -> None:
        self.pieces.append(text)
        self.times.append(time.monotonic())


async def play(
    script: list[dict[str, Any]], conversation: list[Message]
) -> tuple[AssistantMessage, Deltas]:
    deltas = Deltas()
    reply = await ScriptedModel(script).complete(ModelRequest(tuple(conversation), ()), deltas)
    return reply, deltas


SCRIPT: list[dict[str, Any]] = [
    {"text": "first", "toolCalls": [{"name": "sleep", "arguments": {"seconds": 1}}]},
    {
        "text": "second",
        "toolCalls": [
            {"name": "put_note", "arguments": {"key": "k", "text": "v"}},
            {"name": "get_note", "arguments": {"key": "k"}},
        ],
    },
    {"text": "done"},
]


def answered(reply: AssistantMessage, *, interrupted: bool = False) -> list[Message]:
    return [
        ToolResult(c.id, c.name, "x", is_error=interrupted, interrupted=interrupted)
        for c in reply.tool_calls
    ]


# --- turn choice ----------------------------------------------------------------------------


async def test_plays_the_script_turn_by_turn() -> None:
    conversation: list[Message] = [UserMessage("go")]
    texts = []
    for _ in SCRIPT:
        reply, _ = await play(SCRIPT, conversation)
        texts.append(reply.text)
        conversation += [reply, *answered(reply)]
    assert texts == ["first", "second", "done"]
    first, second = (m for m in conversation if isinstance(m, AssistantMessage) and m.tool_calls)
    assert [(c.name, c.arguments) for c in first.tool_calls] == [("sleep", {"seconds": 1})]
    assert [(c.name, c.arguments) for c in second.tool_calls] == [
        ("put_note", {"key": "k", "text": "v"}),
        ("get_note", {"key": "k"}),
    ]
    assert conversation[-1] == AssistantMessage("done", (), "stop")


async def test_call_ids_are_fresh_and_unique() -> None:
    conversation: list[Message] = [UserMessage("go")]
    a, _ = await play(SCRIPT[1:], conversation)
    b, _ = await play(SCRIPT[1:], conversation)
    ids = [c.id for c in (*a.tool_calls, *b.tool_calls)]
    assert len(set(ids)) == len(ids) == 4
    assert all(i for i in ids)


async def test_interrupted_turn_is_replayed_with_the_same_calls_and_new_ids() -> None:
    conversation: list[Message] = [UserMessage("go")]
    first, _ = await play(SCRIPT, conversation)
    conversation += [first, *answered(first)]
    second, _ = await play(SCRIPT, conversation)
    # A crash during the second turn's tools: the first result landed, the second did not.
    conversation += [second, answered(second)[0]]
    plan = plan_resume(conversation)
    assert plan.kind == "continue"
    assert plan.repaired_tool_calls == [second.tool_calls[1].id]
    replay, _ = await play(SCRIPT, list(plan.conversation))
    assert replay.text == "second"
    assert [(c.name, c.arguments) for c in replay.tool_calls] == [
        (c.name, c.arguments) for c in second.tool_calls
    ]
    assert not {c.id for c in replay.tool_calls} & {c.id for c in second.tool_calls}
    # Once the replayed turn is answered, the script moves on.
    after = [*plan.conversation, replay, *answered(replay)]
    reply, _ = await play(SCRIPT, after)
    assert reply.text == "done"


async def test_an_interrupted_result_does_not_complete_a_turn() -> None:
    reply = AssistantMessage("", (ToolCall("c1", "sleep", {"seconds": 1}),), "tool_use")
    conversation: list[Message] = [UserMessage("go"), reply, interrupted_result("c1", "sleep")]
    replay, _ = await play(SCRIPT, conversation)
    assert replay.text == "first"
    # An error result that is not `interrupted` does complete it.
    failed = ToolResult("c1", "sleep", "boom", is_error=True)
    nxt, _ = await play(SCRIPT, [UserMessage("go"), reply, failed])
    assert nxt.text == "second"


async def test_turns_without_calls_count() -> None:
    script = [{"text": "a"}, {"text": "b"}, {"text": "c"}]
    conversation: list[Message] = [UserMessage("1"), AssistantMessage("a"), UserMessage("2")]
    reply, _ = await play(script, conversation)
    assert reply.text == "b"


async def test_past_the_end_echoes_the_last_user_message() -> None:
    conversation: list[Message] = [UserMessage("hello")]
    for turn in SCRIPT:
        reply, _ = await play(SCRIPT, conversation)
        conversation += [reply, *answered(reply)]
        assert reply.text == turn["text"]
    conversation.append(UserMessage("and then?"))
    reply, deltas = await play(SCRIPT, conversation)
    assert reply == AssistantMessage("You said: and then?", (), "stop")
    assert "".join(deltas.pieces) == "You said: and then?"


async def test_no_script_echoes_the_prompt() -> None:
    reply, deltas = await play([], [UserMessage("ping")])
    assert reply.text == "You said: ping"
    assert reply.stop_reason == "stop"
    assert reply.tool_calls == ()
    assert deltas.pieces == ["You said: ping"]


async def test_providers_build_the_scripted_model() -> None:
    providers = Providers(ProviderConfig())
    model = providers.model("scripted", None)
    reply = await model.complete(ModelRequest((UserMessage("yo"),), ()), Deltas())
    assert reply.text == "You said: yo"
    for unknown in ("gpt", "openai:", "mistral:large"):
        with pytest.raises(ModelFault, match="unknown model") as raised:
            providers.model(unknown, None)
        assert raised.value.code == "MODEL_NOT_FOUND"
        assert not raised.value.retryable


async def test_a_scripted_fault_fires_its_first_plays_after_the_text() -> None:
    model = ScriptedModel(
        [{"text": "partial", "fault": {"kind": "rate_limited", "times": 2, "retryAfterMs": 250}}]
    )
    request = ModelRequest((UserMessage("go"),), ())
    for _ in range(2):
        deltas = Deltas()
        with pytest.raises(ModelFault) as raised:
            await model.complete(request, deltas)
        assert deltas.pieces == ["partial"]
        assert raised.value.kind == "rate_limited" and raised.value.retry_after == 0.25
        assert raised.value.retryable
    reply = await model.complete(request, Deltas())
    assert reply.text == "partial" and reply.stop_reason == "stop"


# --- stop reasons ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("turn", "expected"),
    [
        ({"text": "hi"}, "stop"),
        ({"toolCalls": [{"name": "sleep", "arguments": {"seconds": 0}}]}, "tool_use"),
        ({"text": "hi", "stopReason": "length"}, "length"),
        ({"text": "", "stopReason": "error"}, "error"),
        ({"toolCalls": [{"name": "sleep"}], "stopReason": "stop"}, "stop"),
        ({"text": "cut", "stopReason": "aborted"}, "aborted"),
    ],
)
async def test_stop_reason(turn: dict[str, Any], expected: str) -> None:
    reply, _ = await play([turn], [UserMessage("go")])
    assert reply.stop_reason == expected


async def test_call_without_arguments_gets_an_empty_dict() -> None:
    reply, _ = await play([{"toolCalls": [{"name": "sleep"}]}], [UserMessage("go")])
    assert reply.tool_calls[0].name == "sleep"
    assert reply.tool_calls[0].arguments == {}
    assert reply.text == ""


# --- streaming ------------------------------------------------------------------------------


async def test_text_streams_in_chunks_over_the_delay() -> None:
    text = "The quick brown fox jumps over the lazy dog"
    started = time.monotonic()
    reply, deltas = await play([{"text": text, "chunks": 5, "delayMs": 300}], [UserMessage("go")])
    elapsed = time.monotonic() - started
    assert reply.text == text
    assert len(deltas.pieces) == 5
    assert "".join(deltas.pieces) == text
    assert elapsed >= 0.27
    # Spread over the delay, not bunched at the end.
    assert deltas.times[0] - started >= 0.03
    assert deltas.times[-1] - deltas.times[0] >= 0.15


async def test_more_chunks_than_characters() -> None:
    reply, deltas = await play([{"text": "abc", "chunks": 10}], [UserMessage("go")])
    assert deltas.pieces == ["a", "b", "c"]
    assert reply.text == "abc"


async def test_default_is_one_chunk_without_delay() -> None:
    started = time.monotonic()
    _, deltas = await play([{"text": "all at once"}], [UserMessage("go")])
    assert deltas.pieces == ["all at once"]
    assert time.monotonic() - started < 0.5


async def test_delay_without_text_still_waits() -> None:
    started = time.monotonic()
    reply, deltas = await play(
        [{"toolCalls": [{"name": "sleep"}], "delayMs": 150}], [UserMessage("go")]
    )
    assert time.monotonic() - started >= 0.13
    assert deltas.pieces == []
    assert reply.tool_calls


async def test_streaming_is_cancellable() -> None:
    deltas = Deltas()
    model = ScriptedModel([{"text": "x" * 10, "chunks": 10, "delayMs": 10_000}])
    task = asyncio.create_task(model.complete(ModelRequest((UserMessage("go"),), ()), deltas))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert deltas.pieces == []


# --- split_chunks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "chunks", "expected"),
    [
        ("", 3, []),
        ("", 0, []),
        ("abc", 0, ["abc"]),
        ("abc", -2, ["abc"]),
        ("abc", 1, ["abc"]),
        ("abcd", 2, ["ab", "cd"]),
        ("abcde", 2, ["abc", "de"]),
        ("abcde", 3, ["ab", "cd", "e"]),
        ("ab", 5, ["a", "b"]),
        ("héllo wörld", 11, list("héllo wörld")),
    ],
)
def test_split_chunks_examples(text: str, chunks: int, expected: list[str]) -> None:
    assert split_chunks(text, chunks) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), st.integers(min_value=-5, max_value=300))
def test_split_chunks_properties(text: str, chunks: int) -> None:
    pieces = split_chunks(text, chunks)
    assert "".join(pieces) == text
    if not text:
        assert pieces == []
        return
    assert len(pieces) == min(max(chunks, 1), len(text))
    assert all(pieces)
    sizes = [len(p) for p in pieces]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


# --- tool registry --------------------------------------------------------------------------


async def _noop(arguments: dict[str, Any], context: ToolContext) -> str:
    return "ok"


def make_tool(name: str, **kwargs: Any) -> Tool:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1}, "s": {"type": "string"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    return Tool(name=name, description=f"the {name} tool", parameters=schema, run=_noop, **kwargs)


def test_argument_errors_are_listed_with_their_path() -> None:
    tool = make_tool("t")
    assert tool.argument_errors({"n": 3}) == []
    assert tool.argument_errors({"n": 3, "s": "x"}) == []
    missing = tool.argument_errors({})
    assert len(missing) == 1
    assert missing[0].startswith("(root): ")
    assert "'n' is a required property" in missing[0]
    several = tool.argument_errors({"n": 0, "s": 5, "extra": True})
    assert len(several) == 3
    assert any(e.startswith("n: ") and "minimum" in e for e in several)
    assert any(e.startswith("s: ") and "is not of type 'string'" in e for e in several)
    assert any(e.startswith("(root): ") and "extra" in e for e in several)


def test_invalid_schema_is_refused_at_definition() -> None:
    with pytest.raises(SchemaError):
        Tool(name="bad", description="", parameters={"type": "nonsense"}, run=_noop)


def test_tool_spec_and_defaults() -> None:
    tool = make_tool("t")
    spec = tool.spec()
    assert (spec.name, spec.description, spec.parameters) == ("t", "the t tool", tool.parameters)
    assert tool.idempotent is False
    assert tool.timeout is None
    assert tool.ends_turn is False


def test_registry_select_get_and_names() -> None:
    b, a, c = make_tool("b"), make_tool("a"), make_tool("c")
    registry = ToolRegistry([b, a, c])
    assert registry.names() == ["a", "b", "c"]
    assert registry.get("a") is a
    assert registry.get("nope") is None
    assert registry.select(None) == [a, b, c]
    assert registry.select(["c", "a"]) == [c, a]
    assert registry.select(["unknown", "b"]) == [b]
    assert registry.select([]) == []


def test_registry_refuses_a_name_twice() -> None:
    registry = ToolRegistry([make_tool("a")])
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(make_tool("a"))


def test_default_registry_has_the_builtins() -> None:
    registry = default_registry()
    assert {"sleep", "put_note", "get_note", "ask_user"} <= set(registry.names())
    assert registry.get("sleep") is BUILTIN_TOOLS[0]


# --- built-in tools -------------------------------------------------------------------------


def builtin(name: str) -> Tool:
    tool = ToolRegistry(BUILTIN_TOOLS).get(name)
    assert tool is not None
    return tool


def test_builtin_flags() -> None:
    for tool in BUILTIN_TOOLS:
        assert tool.idempotent, tool.name
        assert tool.ends_turn == (tool.name == "ask_user")
    sleep = builtin("sleep")
    assert sleep.timeout is not None and sleep.timeout > MAX_SLEEP_SECONDS


@pytest.mark.parametrize(
    ("name", "arguments", "ok"),
    [
        ("sleep", {"seconds": 0}, True),
        ("sleep", {"seconds": 0.5}, True),
        ("sleep", {"seconds": 3600}, True),
        ("sleep", {"seconds": 3600.5}, False),
        ("sleep", {"seconds": 3601}, False),
        ("sleep", {"seconds": -1}, False),
        ("sleep", {"seconds": "5"}, False),
        ("sleep", {}, False),
        ("sleep", {"seconds": 1, "extra": 1}, False),
        ("put_note", {"key": "k", "text": "t"}, True),
        ("put_note", {"key": "k", "text": ""}, True),
        ("put_note", {"key": "k"}, False),
        ("put_note", {"text": "t"}, False),
        ("put_note", {"key": "", "text": "t"}, False),
        ("put_note", {"key": "k" * 201, "text": "t"}, False),
        ("put_note", {"key": "k", "text": 3}, False),
        ("get_note", {"key": "k"}, True),
        ("get_note", {}, False),
        ("ask_user", {"question": "which?"}, True),
        ("ask_user", {"question": "which?", "options": ["a", "b"]}, True),
        ("ask_user", {"question": ""}, False),
        ("ask_user", {"options": ["a"]}, False),
        ("ask_user", {"question": "q", "options": [1]}, False),
        ("ask_user", {"question": "q", "options": ["o"] * 21}, False),
    ],
)
def test_builtin_argument_schemas(name: str, arguments: dict[str, Any], ok: bool) -> None:
    errors = builtin(name).argument_errors(arguments)
    assert (errors == []) == ok, errors


def test_missing_put_note_arguments_are_both_reported() -> None:
    errors = builtin("put_note").argument_errors({})
    assert len(errors) == 2
    assert any("'key'" in e for e in errors)
    assert any("'text'" in e for e in errors)


class MemoryNotes:
    def __init__(self) -> None:
        self.notes: dict[str, str] = {}

    async def put(self, key: str, text: str) -> None:
        self.notes[key] = text

    async def get(self, key: str) -> str | None:
        return self.notes.get(key)


def context(notes: MemoryNotes) -> ToolContext:
    return ToolContext(
        session_id=uuid.uuid4(), call_id="c1", idempotency_key="k", attempt=1, notes=notes
    )


async def test_builtin_tools_run() -> None:
    notes = MemoryNotes()
    ctx = context(notes)
    assert await builtin("sleep").run({"seconds": 0}, ctx) == "slept 0 s"
    assert json.loads(await builtin("get_note").run({"key": "k"}, ctx)) == {
        "key": "k",
        "found": False,
        "text": None,
    }
    await builtin("put_note").run({"key": "k", "text": "one"}, ctx)
    await builtin("put_note").run({"key": "k", "text": "two"}, ctx)  # an upsert
    assert notes.notes == {"k": "two"}
    assert json.loads(await builtin("get_note").run({"key": "k"}, ctx)) == {
        "key": "k",
        "found": True,
        "text": "two",
    }
    assert await builtin("ask_user").run({"question": "?"}, ctx) == ASK_USER_CONTENT


def _bounds(schema: Any) -> list[int]:
    """Every maxLength / maxItems in a JSON schema, however deep."""
    if isinstance(schema, dict):
        found = [v for k, v in schema.items() if k in ("maxLength", "maxItems")]
        return found + [b for v in schema.values() for b in _bounds(v)]
    if isinstance(schema, list):
        return [b for v in schema for b in _bounds(v)]
    return []


def test_schemas_offered_to_models_have_no_huge_bounds() -> None:
    """A `maxLength` of 100,000 made llama-cpp-python's grammar compiler overflow its stack when
    `put_note` was forced; such bounds are checked by the tools themselves."""
    for tool in BUILTIN_TOOLS:
        assert all(bound <= 1000 for bound in _bounds(tool.parameters)), tool.name


async def test_big_notes_and_questions_are_refused_by_the_tools() -> None:
    ctx = context(MemoryNotes())
    with pytest.raises(ToolError, match="at most 100000 characters"):
        await builtin("put_note").run({"key": "k", "text": "x" * 100_001}, ctx)
    with pytest.raises(ToolError, match="at most 10000 characters"):
        await builtin("ask_user").run({"question": "?" * 10_001}, ctx)
    await builtin("put_note").run({"key": "k", "text": "x" * 100_000}, ctx)


async def test_sleep_honours_cancel() -> None:
    async def sleep() -> str:
        return await builtin("sleep").run({"seconds": 60}, context(MemoryNotes()))

    task = asyncio.create_task(sleep())
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
