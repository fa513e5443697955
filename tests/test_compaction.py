"""Compaction through the whole runtime (docs/compaction.md): real `ferryman worker` processes,
the scripted model (which scripts a summary) and the OpenAI adapter against the fake provider.
A long session compacts and goes on, the log keeps every event, the request after a compaction
pairs every call with its result, POST /compact, a context-too-long answer compacts and retries
once, long tool results are shown cut, a compaction's call counts in usage, and a worker
SIGKILLed during a compaction leaves the previous view or a whole new one. Last, a 30-turn
session against llama.cpp's server with a 512-token context fails without compaction and
succeeds with it."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from ferryman import AsyncFerryman
from tests.fake_provider import (
    FakeProvider,
    Reply,
    message_end,
    message_start,
    text_block,
    text_reply,
    tool_reply,
    tool_use_block,
    usage_chunk,
)
from tests.llm.server import LlamaServer, llama_server, require_xllamacpp
from tests.llm.tiny_model import PLAIN_ANSWER, write_tiny_model
from tests.support import (
    TERMINAL,
    ServerProcess,
    StartWorker,
    assert_problem,
    client,
    new_session,
    of_type,
    ready,
    transcript,
    wait_event,
    wait_for_status,
)

FAST = {"FERRYMAN_MODEL_RETRY_INITIAL_DELAY": "0.05", "FERRYMAN_MODEL_RETRY_MAX_DELAY": "1"}
LONG = "x" * 600  # a note's text: each turn adds about 150 tokens to the conversation


def note_turns(count: int) -> list[dict[str, Any]]:
    return [
        {
            "text": f"turn {i}",
            "toolCalls": [{"name": "put_note", "arguments": {"key": f"k{i}", "text": LONG}}],
            "summary": f"notes k0..k{i} are saved",
        }
        for i in range(count)
    ]


async def finished(http: Any, sid: str, timeout: float = 60.0) -> dict[str, Any]:
    return await wait_for_status(http, sid, TERMINAL, timeout=timeout)


async def test_a_long_session_compacts_and_goes_on_with_every_event_kept(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker(FAST))
    script = [*note_turns(12), {"text": "all saved"}]
    async with client(api.url, key) as http:
        sid = await new_session(
            http,
            "save twelve notes",
            script=script,
            compaction={"triggerTokens": 600, "keepRecentTurns": 1},
        )
        session = await finished(http, sid)
        events = await transcript(http, sid)
    assert session["status"] == "succeeded", session
    assert session["compaction"] == {"triggerTokens": 600, "keepRecentTurns": 1}
    compactions = of_type(events, "session_compacted")
    assert len(compactions) >= 2, [e["type"] for e in events]
    # Every turn played once, in order: the summary counts the turns it stands for.
    texts = [e["data"]["text"] for e in of_type(events, "assistant_message")]
    assert texts == [f"turn {i}" for i in range(12)] + ["all saved"]
    assert [e["data"]["name"] for e in of_type(events, "tool_call_start")] == ["put_note"] * 12
    assert len(of_type(events, "tool_result")) == 12  # the log keeps every event
    for event in compactions:
        data = event["data"]
        assert data["throughSeq"] < event["seq"]
        assert data["tokensAfter"] < data["tokensBefore"]
        assert data["model"] == "scripted"
        assert data["summary"].startswith("notes k0..k")
        # The cut never separates a call from its result: the call at throughSeq's turn
        # has its result at or before throughSeq.
        through = data["throughSeq"]
        calls = {
            c["id"]
            for e in events
            if e["type"] == "assistant_message" and e["seq"] <= through
            for c in e["data"]["toolCalls"]
        }
        results = {
            e["data"]["toolCallId"]
            for e in events
            if e["type"] == "tool_result" and e["seq"] <= through
        }
        assert calls == results
    # Usage counts each compaction's own call.
    spent = sum(e["data"]["usage"]["inputTokens"] for e in compactions)
    assert session["usage"]["inputTokens"] == spent > 0


async def test_the_request_after_a_compaction_pairs_every_call_with_its_result(
    api: ServerProcess, key: str, start_worker: StartWorker, fake: FakeProvider
) -> None:
    await ready(start_worker({**FAST, "FERRYMAN_OPENAI_BASE_URL": fake.openai_url}))
    first = tool_reply("put_note", {"key": "a", "text": LONG}, call_id="call_a")
    first.frames.insert(-1, usage_chunk(400, 150))
    second = tool_reply("put_note", {"key": "b", "text": LONG}, call_id="call_b")
    second.frames.insert(-1, usage_chunk(700, 150))
    fake.answer(first, second, text_reply("Both saved."))
    async with client(api.url, key) as http:
        sid = await new_session(
            http,
            "save a and b",
            model="openai:fake-model",
            instructions="Be brief.",
            compaction={"triggerTokens": 800, "keepRecentTurns": 1, "model": "scripted"},
        )
        session = await finished(http, sid)
        events = await transcript(http, sid)
    assert session["status"] == "succeeded", session
    [compacted] = of_type(events, "session_compacted")
    assert compacted["data"]["model"] == "scripted"
    assert len(fake.requests) == 3  # the summary came from the scripted model
    last = fake.requests[2].body
    messages = last["messages"]
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1]["role"] == "user" and "Summary" in messages[1]["content"]
    assert messages[2]["role"] == "assistant"
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["call_b"]
    assert messages[3]["role"] == "tool" and messages[3]["tool_call_id"] == "call_b"
    assert len(messages) == 4
    assert {t["function"]["name"] for t in last["tools"]} >= {"put_note"}  # tools stay offered


def anthropic_call(call_id: str, key: str, input_tokens: int) -> Reply:
    arguments = json.dumps({"key": key, "text": LONG})
    return Reply(
        [
            message_start(input_tokens),
            *tool_use_block(0, call_id, "put_note", arguments),
            *message_end("tool_use", 150),
        ]
    )


async def test_the_anthropic_request_after_a_compaction_answers_every_tool_use(
    api: ServerProcess, key: str, start_worker: StartWorker, fake: FakeProvider
) -> None:
    await ready(start_worker({**FAST, "FERRYMAN_ANTHROPIC_BASE_URL": fake.root}))
    fake.answer(
        anthropic_call("toolu_a", "a", 400),
        anthropic_call("toolu_b", "b", 700),
        Reply([message_start(), *text_block(0, "Both saved."), *message_end("end_turn")]),
    )
    async with client(api.url, key) as http:
        sid = await new_session(
            http,
            "save a and b",
            model="anthropic:fake-model",
            compaction={"triggerTokens": 800, "keepRecentTurns": 1, "model": "scripted"},
        )
        session = await finished(http, sid)
        events = await transcript(http, sid)
    assert session["status"] == "succeeded", session
    assert len(of_type(events, "session_compacted")) == 1
    messages = fake.requests[2].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert "Summary" in messages[0]["content"][0]["text"]
    [use] = [b for b in messages[1]["content"] if b["type"] == "tool_use"]
    [answer] = messages[2]["content"]
    assert use["id"] == "toolu_b" and answer["tool_use_id"] == "toolu_b"
    assert answer["type"] == "tool_result"


async def test_compact_on_a_finished_session_then_a_follow_up_sees_the_summary(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker(FAST))
    async with client(api.url, key) as http:
        sid = await new_session(http, "save two", script=[*note_turns(2), {"text": "saved"}])
        assert (await finished(http, sid))["status"] == "succeeded"
        asked = await http.post(f"/api/agent/{sid}/compact")
        assert asked.status_code == 202, asked.text
        assert asked.json()["status"] == "queued"
        compacted = await wait_event(http, sid, lambda e: e["type"] == "session_compacted")
        session = await finished(http, sid)
        assert session["status"] == "succeeded"
        # keepRecentTurns defaults to 2: the first turn is summarized.
        assert compacted["data"]["summary"] == "notes k0..k0 are saved"
        follow = await http.post(f"/api/agent/{sid}/messages", json={"text": "and now?"})
        assert follow.status_code == 202
        await wait_event(
            http, sid, lambda e: e["data"].get("text") == "You said: and now?", timeout=30
        )
        events = await transcript(http, sid)
        assert len(of_type(events, "session_compacted")) == 1
        idle = await http.post("/api/agent", json={"title": "idle"})
        assert_problem(
            await http.post(f"/api/agent/{idle.json()['id']}/compact"),
            409,
            "SESSION_NOT_COMPACTABLE",
        )


async def test_compact_on_a_session_cut_by_the_output_limit_does_not_take_the_turn_up(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker(FAST))
    script = [*note_turns(2), {"text": "cut sho", "stopReason": "length"}, {"text": "rest"}]
    compaction = {"triggerTokens": 50_000, "keepRecentTurns": 1}
    async with client(api.url, key) as http:
        sid = await new_session(http, "go", script=script, compaction=compaction)
        await wait_for_status(http, sid, {"waiting"})
        assert (await http.post(f"/api/agent/{sid}/compact")).status_code == 202
        await wait_event(http, sid, lambda e: e["type"] == "session_compacted")
        session = await wait_for_status(http, sid, {"waiting"})
        events = await transcript(http, sid)
        assert [e["data"]["text"] for e in of_type(events, "assistant_message")] == [
            "turn 0",
            "turn 1",
            "cut sho",
        ]
        assert events[-1]["type"] == "session_end"
        assert events[-1]["data"]["note"].startswith("output limit reached")
        sent = await http.post(f"/api/agent/{sid}/messages", json={"text": "go on"})
        assert sent.status_code == 202
        session = await finished(http, sid)
        events = await transcript(http, sid)
    assert session["status"] == "succeeded", session
    assert of_type(events, "assistant_message")[-1]["data"]["text"] == "rest"


async def test_compact_while_an_approval_waits_keeps_it_pending(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker(FAST))
    gated = {"text": "gated", "toolCalls": [{"name": "sleep", "arguments": {"seconds": 0}}]}
    script = [*note_turns(3), gated, {"text": "done"}]
    async with client(api.url, key) as http:
        sid = await new_session(
            http,
            "go",
            script=script,
            approvalRequired=["sleep"],
            compaction={"triggerTokens": 5000},
        )
        asked = await wait_event(http, sid, lambda e: e["type"] == "tool_approval_requested")
        await wait_for_status(http, sid, {"waiting"})
        async with AsyncFerryman(api.url, api_key=key) as sdk:
            accepted = await sdk.compact_session(sid)
        assert (accepted.id, accepted.status) == (sid, "queued")
        compacted = await wait_event(http, sid, lambda e: e["type"] == "session_compacted")
        assert compacted["seq"] > accepted.seq
        assert (await wait_for_status(http, sid, {"waiting"}))["status"] == "waiting"
        call_id = asked["data"]["toolCallId"]
        assert compacted["data"]["throughSeq"] < asked["seq"]
        decided = await http.post(
            f"/api/agent/{sid}/tool-calls/{call_id}/approval", json={"approved": True}
        )
        assert decided.status_code == 202, decided.text
        session = await finished(http, sid)
        events = await transcript(http, sid)
    assert session["status"] == "succeeded", session
    [result] = [e for e in of_type(events, "tool_result") if e["data"]["toolCallId"] == call_id]
    assert not result["data"]["isError"]
    assert of_type(events, "assistant_message")[-1]["data"]["text"] == "done"


async def test_a_context_too_long_answer_compacts_and_retries_once(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker(FAST))
    too_long = {"kind": "context_too_long"}
    once = [*note_turns(3), {"text": "fits now", "fault": too_long}]
    twice = [*note_turns(3), {"text": "never", "fault": {**too_long, "times": 2}}]
    async with client(api.url, key) as http:
        saved = await new_session(http, "go", script=once)
        failing = await new_session(http, "go", script=twice)
        session = await finished(http, saved)
        events = await transcript(http, saved)
        assert session["status"] == "succeeded", session
        assert len(of_type(events, "session_compacted")) == 1
        assert of_type(events, "assistant_message")[-1]["data"]["text"] == "fits now"
        session = await finished(http, failing)
        events = await transcript(http, failing)
        assert session["status"] == "failed"
        assert session["error"]["code"] == "MODEL_CONTEXT_TOO_LONG"
        assert len(of_type(events, "session_compacted")) == 1


async def test_a_long_tool_result_is_shown_cut_and_logged_whole(
    api: ServerProcess, key: str, start_worker: StartWorker, fake: FakeProvider
) -> None:
    env = {
        **FAST,
        "FERRYMAN_OPENAI_BASE_URL": fake.openai_url,
        "FERRYMAN_MODEL_TOOL_RESULT_MAX_CHARS": "1000",
    }
    await ready(start_worker(env))
    text = "y" * 3000
    fake.answer(
        tool_reply("put_note", {"key": "big", "text": text}, call_id="call_put"),
        tool_reply("get_note", {"key": "big"}, call_id="call_get"),
        text_reply("Read it."),
    )
    async with client(api.url, key) as http:
        sid = await new_session(http, "store and read", model="openai:fake-model")
        assert (await finished(http, sid))["status"] == "succeeded"
        events = await transcript(http, sid)
    logged = [e for e in of_type(events, "tool_result") if e["data"]["name"] == "get_note"]
    whole = logged[0]["data"]["content"]
    assert text in whole
    shown = fake.requests[2].body["messages"][-1]
    assert shown["role"] == "tool" and shown["content"].startswith(whole[:1000])
    assert f"{len(whole) - 1000} more characters not shown" in shown["content"]


async def test_a_worker_killed_during_a_compaction_leaves_no_half_of_one(
    api: ServerProcess, key: str, start_worker: StartWorker, fake: FakeProvider
) -> None:
    env = {**FAST, "FERRYMAN_OPENAI_BASE_URL": fake.openai_url, "FERRYMAN_LEASE_TTL": "3"}
    stalled = text_reply("the summary", "of it all")
    stalled.stall_after, stalled.stall = 1, 60.0
    fake.answer(stalled, text_reply("notes k0..k3 are summarized"))
    first = start_worker(env)
    await ready(first)
    async with client(api.url, key) as http:
        sid = await new_session(
            http,
            "save four",
            script=[*note_turns(4), {"text": "done"}],
            compaction={"triggerTokens": 500, "keepRecentTurns": 1, "model": "openai:fake-model"},
        )
        for _ in range(400):  # the summary is being written
            if fake.requests:
                break
            await asyncio.sleep(0.05)
        assert fake.requests, "no compaction started"
        first.signal(signal.SIGKILL)
        events = await transcript(http, sid)
        assert of_type(events, "session_compacted") == []  # the previous view, whole
        await ready(start_worker(env))
        session = await finished(http, sid)
        events = await transcript(http, sid)
    assert session["status"] == "succeeded", session
    compactions = of_type(events, "session_compacted")
    assert compactions and compactions[0]["data"]["summary"] == "notes k0..k3 are summarized"
    texts = [e["data"]["text"] for e in of_type(events, "assistant_message")]
    assert texts[-1] == "done"
    assert len(of_type(events, "session_resumed")) == 1


async def test_a_run_resumed_after_a_compaction_goes_on_from_the_compacted_view(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    env = {**FAST, "FERRYMAN_LEASE_TTL": "3"}
    first = start_worker(env)
    await ready(first)
    sleep = {"text": "sleeping", "toolCalls": [{"name": "sleep", "arguments": {"seconds": 2}}]}
    script = [*note_turns(4), sleep, {"text": "done"}]
    async with client(api.url, key) as http:
        sid = await new_session(
            http, "go", script=script, compaction={"triggerTokens": 500, "keepRecentTurns": 1}
        )
        await wait_event(http, sid, lambda e: e["type"] == "session_compacted")
        await wait_event(http, sid, lambda e: e["data"].get("name") == "sleep")
        first.signal(signal.SIGKILL)
        await ready(start_worker(env))
        session = await finished(http, sid)
        events = await transcript(http, sid)
    assert session["status"] == "succeeded", session
    assert len(of_type(events, "session_resumed")) == 1
    texts = [e["data"]["text"] for e in of_type(events, "assistant_message")]
    # The interrupted turn is replayed (the summary counts the turns before it), then the end.
    assert texts == [*(f"turn {i}" for i in range(4)), "sleeping", "sleeping", "done"]


async def test_a_session_takes_its_assistants_compaction_unless_it_gives_its_own(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker(FAST))
    own = {"triggerTokens": 5000, "keepRecentTurns": 0}
    async with client(api.url, key) as http:
        made = await http.post(
            "/api/assistants",
            json={
                "name": "noter",
                "model": "scripted",
                "compaction": {"triggerTokens": 600, "keepRecentTurns": 1},
            },
        )
        assert made.status_code == 201, made.text
        assistant = made.json()
        assert assistant["compaction"] == {"triggerTokens": 600, "keepRecentTurns": 1}
        script = [*note_turns(6), {"text": "saved"}]
        taken = await new_session(http, "go", assistantId=assistant["id"], script=script)
        overridden = await new_session(
            http, "go", assistantId=assistant["id"], script=script, compaction=own
        )
        patched = await http.patch(f"/api/assistants/{assistant['id']}", json={"compaction": None})
        assert patched.status_code == 200 and patched.json()["compaction"] is None
        session = await finished(http, taken)
        assert session["compaction"] == assistant["compaction"]  # the pinned version's
        assert of_type(await transcript(http, taken), "session_compacted")
        session = await finished(http, overridden)
        assert session["compaction"] == own
        assert of_type(await transcript(http, overridden), "session_compacted") == []
        bad = await http.post(
            "/api/agent", json={"prompt": "x", "compaction": {"triggerTokens": 5}}
        )
        assert_problem(bad, 422, "VALIDATION_ERROR")


# --- a real model server with a small context --------------------------------------------------


@pytest.fixture(scope="module")
def small_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """llama.cpp's server on the tiny model with a 512-token context (one slot, so the whole
    context is that session's)."""
    require_xllamacpp()
    model = write_tiny_model(tmp_path_factory.mktemp("llm") / "tiny.gguf")
    with llama_server(model, n_ctx=512, n_parallel=1) as server:
        yield server


async def talk(http: Any, sid: str, turns: int) -> dict[str, Any]:
    """Send follow-ups until `turns` exchanges were made or the session failed."""
    session = await finished(http, sid)
    for turn in range(1, turns):
        if session["status"] != "succeeded":
            return session
        sent = await http.post(f"/api/agent/{sid}/messages", json={"text": f"message {turn}"})
        assert sent.status_code == 202, sent.text
        session = await finished(http, sid)
    return session


async def test_a_30_turn_session_outgrows_a_512_token_context_only_with_compaction(
    small_llm: LlamaServer, api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    env = {"FERRYMAN_OPENAI_BASE_URL": small_llm.base_url, "FERRYMAN_MODEL_IDLE_TIMEOUT": "20"}
    await ready(start_worker(env))
    async with client(api.url, key) as http:
        # Its summarizer is the session's own tiny model, whose request cannot fit either.
        plain = await new_session(http, "message 0", model="openai:tiny", tools=[])
        failed = await talk(http, plain, 30)
        assert failed["status"] == "failed"
        assert failed["error"]["code"] == "MODEL_CONTEXT_TOO_LONG"
        # The tiny model cannot summarize; the scripted model does, and the real one goes on.
        compacting = await new_session(
            http,
            "message 0",
            model="openai:tiny",
            tools=[],
            compaction={"triggerTokens": 300, "keepRecentTurns": 1, "model": "scripted"},
        )
        session = await talk(http, compacting, 30)
        events = await transcript(http, compacting)
    assert session["status"] == "succeeded", session
    answers = of_type(events, "assistant_message")
    assert len(answers) == 30 and {a["data"]["text"] for a in answers} == {PLAIN_ANSWER}
    assert len(of_type(events, "session_compacted")) >= 5
    assert all(a["data"]["usage"]["inputTokens"] < 512 for a in answers)


async def test_a_fork_after_compactions_goes_on_from_the_compacted_view(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    """A fork copies the log with its `session_compacted` events, so the fork's model sees the
    summary too: a follow-up to a fork of a compacted session needs no compaction of its own,
    as it would if the copied events were read as a conversation never compacted."""
    await ready(start_worker(FAST))
    script = [*note_turns(12), {"text": "all saved"}]
    compaction = {"triggerTokens": 600, "keepRecentTurns": 1}
    async with client(api.url, key) as http:
        sid = await new_session(http, "save twelve notes", script=script, compaction=compaction)
        assert (await finished(http, sid))["status"] == "succeeded"
        events = await transcript(http, sid)
        assert len(of_type(events, "session_compacted")) >= 2
        answer = of_type(events, "assistant_message")[-1]["seq"]
        made = await http.post(f"/api/agent/{sid}/fork", json={"atSeq": answer})
        assert made.status_code == 201, made.text
        fork = made.json()["id"]
        assert made.json()["status"] == "idle"
        sent = await http.post(f"/api/agent/{fork}/messages", json={"text": "and now?"})
        assert sent.status_code == 202, sent.text
        assert (await finished(http, fork))["status"] == "succeeded"
        forked = await transcript(http, fork)
    copied = [e for e in forked if e["seq"] <= answer]
    assert [e["type"] for e in copied] == [e["type"] for e in events if e["seq"] <= answer]
    after = [e for e in forked if e["seq"] > answer]
    assert [e["data"]["text"] for e in of_type(after, "assistant_message")] == [
        "You said: and now?"
    ]
    assert of_type(after, "session_compacted") == []
