"""Whole sessions against a real model server: llama.cpp's own server (the `xllamacpp` wheel) on
a tiny deterministic model the tests write themselves (tests/llm). Real workers, the OpenAI
adapter, real streaming: a text answer, a tool loop, cancel mid-generation, and a worker
SIGKILLed mid-generation whose session another worker resumes.

Without xllamacpp these tests skip, except under CI=true, where they fail."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx

from tests.llm.server import LlamaServer, require_xllamacpp
from tests.llm.tiny_model import PLAIN_ANSWER, TICK, TOOL_ANSWER, write_tiny_model
from tests.support import (
    TERMINAL,
    ServerProcess,
    StartWorker,
    client,
    first_delta,
    new_session,
    of_type,
    ready,
    sse,
    transcript,
    wait_event,
    wait_for_status,
)

MODEL = "openai:tiny"


def env(llm: LlamaServer) -> dict[str, str]:
    return {"FERRYMAN_OPENAI_BASE_URL": llm.base_url, "FERRYMAN_MODEL_IDLE_TIMEOUT": "20"}


async def deltas_until_end(http: httpx.AsyncClient, sid: str) -> list[str]:
    texts: list[str] = []
    async with sse(http, f"/api/agent/{sid}/events") as events:
        async for event in events:
            if event.event == "message_delta":
                texts.append(event.json()["data"]["text"])
            if event.event == "session_end":
                return texts
    raise AssertionError("the stream ended before the session did")


async def test_a_text_answer(
    llm: LlamaServer, api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker(env(llm)))
    async with client(api.url, key) as http:
        sid = await new_session(http, "hi", model=MODEL, tools=[], instructions="Be friendly.")
        streamed = await deltas_until_end(http, sid)
        session = await wait_for_status(http, sid, TERMINAL)
        events = await transcript(http, sid)
    assert session["status"] == "succeeded", session
    (answer,) = of_type(events, "assistant_message")
    assert answer["data"]["text"] == PLAIN_ANSWER
    assert answer["data"]["stopReason"] == "stop"
    assert "".join(streamed) == PLAIN_ANSWER and len(streamed) >= 1
    usage = answer["data"]["usage"]
    assert usage["inputTokens"] > 0 and usage["outputTokens"] > 0
    assert session["usage"]["outputTokens"] == usage["outputTokens"]


async def test_a_tool_loop(
    llm: LlamaServer, api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker(env(llm)))
    async with client(api.url, key) as http:
        sid = await new_session(http, "read my note", model=MODEL, tools=["get_note"])
        session = await wait_for_status(http, sid, TERMINAL, timeout=60)
        events = await transcript(http, sid)
    assert session["status"] == "succeeded", session
    assert [e["type"] for e in events] == [
        "user_message",
        "session_start",
        "assistant_message",
        "tool_call_start",
        "tool_result",
        "assistant_message",
        "session_end",
    ]
    call = events[2]["data"]
    assert call["stopReason"] == "tool_use"
    ((tool_call),) = call["toolCalls"]
    assert tool_call["name"] == "get_note" and tool_call["arguments"] == {"key": "k"}
    assert events[4]["data"]["toolCallId"] == tool_call["id"]
    assert events[5]["data"]["text"] == TOOL_ANSWER


async def test_cancel_mid_generation(
    llm: LlamaServer, api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker(env(llm)))
    async with client(api.url, key) as http:
        sid = await new_session(
            http, TICK, model=MODEL, tools=[], modelSettings={"maxTokens": 200_000}
        )
        await first_delta(http, sid)
        started = time.monotonic()
        cancelled = await http.post(f"/api/agent/{sid}/cancel", params={"wait": "true"})
        took = time.monotonic() - started
        events_ = await transcript(http, sid)
    assert cancelled.json()["status"] == "cancelled"
    assert took < 3, took
    (partial,) = of_type(events_, "assistant_message")
    assert partial["data"]["stopReason"] == "aborted"
    assert partial["data"]["text"].startswith(TICK)
    # The server stopped generating too: a new request is answered at once.
    async with httpx.AsyncClient(timeout=10) as plain:
        reply = await plain.post(
            llm.base_url + "/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16},
        )
    assert reply.json()["choices"][0]["message"]["content"] == PLAIN_ANSWER


async def test_a_worker_killed_mid_generation_is_resumed(
    llm: LlamaServer, api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    victim = start_worker(env(llm))
    await ready(victim)
    async with client(api.url, key) as http:
        sid = await new_session(
            http, TICK, model=MODEL, tools=[], modelSettings={"maxTokens": 3000}
        )
        await first_delta(http, sid)
        victim.signal(signal.SIGKILL)
        await ready(start_worker(env(llm)))
        resumed = await wait_event(http, sid, lambda e: e["type"] == "session_resumed", timeout=30)
        session = await wait_for_status(http, sid, {"waiting", *TERMINAL}, timeout=60)
        events = await transcript(http, sid)
    assert resumed["data"]["reason"] == "crash" and resumed["attempt"] == 2
    # The killed turn left nothing durable; the new holder generated the whole answer again,
    # up to the output limit, and waits for a message to go on.
    answers = of_type(events, "assistant_message")
    assert [a["attempt"] for a in answers] == [2]
    assert answers[0]["data"]["stopReason"] == "length"
    assert answers[0]["data"]["text"].startswith(TICK)
    assert session["status"] == "waiting"
    end: dict[str, Any] = events[-1]["data"]
    assert end["status"] == "waiting" and "output limit" in end["note"]


def test_the_model_file_is_small(tmp_path: Path) -> None:
    require_xllamacpp()
    assert write_tiny_model(tmp_path / "m.gguf").stat().st_size < 5_000_000
