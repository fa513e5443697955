"""Model turns through the whole runtime: real `ferryman worker` processes calling a model that
fails as providers do (the scripted model's `fault`, and the OpenAI adapter against the fake
provider of tests/fake_provider.py). Retries are logged and bounded, faults that retrying
cannot fix fail the session with their code, a failure is never sent back as the model's words,
and the agent definition and usage travel with every turn (SPEC section 6.1)."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from typing import Any

import pytest

from tests.fake_provider import (
    FakeProvider,
    chunk,
    error_reply,
    text_reply,
    tool_reply,
    usage_chunk,
)
from tests.support import (
    TERMINAL,
    ServerProcess,
    StartWorker,
    client,
    create_session,
    fresh_database,
    new_session,
    of_type,
    query,
    ready,
    running,
    sse,
    transcript,
    wait_event,
    wait_for_status,
)

# Quick backoff, so retries show in milliseconds; the idle guard at one second.
FAST_RETRIES = {
    "FERRYMAN_MODEL_RETRY_INITIAL_DELAY": "0.05",
    "FERRYMAN_MODEL_RETRY_MAX_DELAY": "2",
    "FERRYMAN_MODEL_MAX_RETRIES": "3",
    "FERRYMAN_MODEL_IDLE_TIMEOUT": "1",
}


def worker_env(fake: FakeProvider, **more: str) -> dict[str, str]:
    return {**FAST_RETRIES, "FERRYMAN_OPENAI_BASE_URL": fake.openai_url, **more}


async def finished(http: Any, sid: str, timeout: float = 30.0) -> dict[str, Any]:
    return await wait_for_status(http, sid, TERMINAL, timeout=timeout)


# --- retries, with the scripted model ---------------------------------------------------------


async def test_a_transient_fault_is_retried_and_logged(
    api: ServerProcess, key: str, start_worker: StartWorker, fake: FakeProvider
) -> None:
    await ready(start_worker(worker_env(fake)))
    script = [{"text": "partial", "fault": {"kind": "server_error", "times": 2}}]
    async with client(api.url, key) as http:
        sid = await new_session(http, script=script)
        assert (await finished(http, sid))["status"] == "succeeded"
        events = await transcript(http, sid)
    types = [e["type"] for e in events]
    assert types == [
        "user_message",
        "session_start",
        "model_retry",
        "model_retry",
        "assistant_message",
        "session_end",
    ]
    retries = [e["data"] for e in of_type(events, "model_retry")]
    assert [r["attempt"] for r in retries] == [1, 2]
    assert all(r["reason"] == "server_error" for r in retries)
    assert all(0 < r["delayMs"] <= 2000 for r in retries)
    assert all("scripted fault" in r["message"] for r in retries)


async def test_retry_after_is_honoured(
    api: ServerProcess, key: str, start_worker: StartWorker, fake: FakeProvider
) -> None:
    await ready(start_worker(worker_env(fake)))
    script = [{"text": "hi", "fault": {"kind": "rate_limited", "retryAfterMs": 700}}]
    async with client(api.url, key) as http:
        sid = await new_session(http, script=script)
        assert (await finished(http, sid))["status"] == "succeeded"
        events = await transcript(http, sid)
    (retry,) = of_type(events, "model_retry")
    assert retry["data"]["delayMs"] == 700 and retry["data"]["reason"] == "rate_limited"
    answer = of_type(events, "assistant_message")[0]
    waited = _seconds_between(retry["ts"], answer["ts"])
    assert waited >= 0.65, waited


async def test_retries_run_out(
    api: ServerProcess, key: str, start_worker: StartWorker, fake: FakeProvider
) -> None:
    await ready(start_worker(worker_env(fake)))
    script = [{"text": "x", "fault": {"kind": "idle_timeout", "times": 50}}]
    async with client(api.url, key) as http:
        sid = await new_session(http, script=script)
        session = await finished(http, sid)
        events = await transcript(http, sid)
    assert session["status"] == "failed"
    assert session["error"]["code"] == "MODEL_UNAVAILABLE"
    assert "gave up after 3 retries" in session["error"]["message"]
    assert len(of_type(events, "model_retry")) == 3
    assert of_type(events, "assistant_message") == []  # a failure is not the model's words
    assert events[-1]["data"]["status"] == "failed"


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("auth_failed", "MODEL_AUTH_FAILED"),
        ("bad_request", "MODEL_BAD_REQUEST"),
        ("not_found", "MODEL_NOT_FOUND"),
        ("context_too_long", "MODEL_CONTEXT_TOO_LONG"),
    ],
)
async def test_a_fault_retrying_cannot_fix_fails_at_once(
    api: ServerProcess,
    key: str,
    start_worker: StartWorker,
    fake: FakeProvider,
    kind: str,
    code: str,
) -> None:
    await ready(start_worker(worker_env(fake)))
    async with client(api.url, key) as http:
        sid = await new_session(http, script=[{"fault": {"kind": kind}}])
        session = await finished(http, sid)
        events = await transcript(http, sid)
    assert session["status"] == "failed" and session["error"]["code"] == code
    assert of_type(events, "model_retry") == []
    assert of_type(events, "assistant_message") == []


async def test_cancel_stops_a_backoff_wait(
    api: ServerProcess, key: str, start_worker: StartWorker, fake: FakeProvider
) -> None:
    await ready(start_worker(worker_env(fake, FERRYMAN_MODEL_RETRY_MAX_DELAY="120")))
    script = [{"fault": {"kind": "rate_limited", "retryAfterMs": 60_000}}]
    async with client(api.url, key) as http:
        sid = await new_session(http, script=script)
        await wait_event(http, sid, lambda e: e["type"] == "model_retry")
        started = time.monotonic()
        cancelled = await http.post(f"/api/agent/{sid}/cancel", params={"wait": "true"})
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
    assert time.monotonic() - started < 3


async def test_an_unknown_model_fails_the_session(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    """FERRYMAN_MODEL names a provider this version does not have (a rolled-back worker)."""
    await ready(start_worker())
    async with client(api.url, key) as http:
        sid = await new_session(http)
        await query(isolated_db, "SELECT 1")  # the session exists before it is altered
        await query(
            isolated_db,
            "UPDATE sessions SET model = 'mistral:large' WHERE id = %s AND status = 'queued'",
            (uuid.UUID(sid),),
        )
        session = await finished(http, sid)
    if session["model"] == "mistral:large":  # the worker had not claimed it first
        assert session["status"] == "failed"
        assert session["error"]["code"] == "MODEL_NOT_FOUND"


# --- a real HTTP provider -------------------------------------------------------------------


async def test_instructions_settings_and_usage_travel_with_every_turn(
    api: ServerProcess, key: str, start_worker: StartWorker, fake: FakeProvider
) -> None:
    await ready(start_worker(worker_env(fake)))
    call = tool_reply("put_note", {"key": "k", "text": "v"})
    call.frames.insert(-1, usage_chunk(10, 2, cached=1))
    answer = text_reply("Saved.")
    answer.frames.insert(-1, usage_chunk(20, 3, cached=5))
    fake.answer(call, answer)
    async with client(api.url, key) as http:
        sid = await new_session(
            http,
            "save k",
            model="openai:fake-model",
            instructions="Be brief.",
            modelSettings={"temperature": 0.1, "maxTokens": 50, "toolChoice": "auto"},
        )
        session = await finished(http, sid)
        events = await transcript(http, sid)
    assert session["status"] == "succeeded", session
    assert session["usage"] == {"inputTokens": 30, "outputTokens": 5, "cachedTokens": 6}
    usages = [e["data"]["usage"] for e in of_type(events, "assistant_message")]
    assert usages == [
        {"inputTokens": 10, "outputTokens": 2, "cachedTokens": 1},
        {"inputTokens": 20, "outputTokens": 3, "cachedTokens": 5},
    ]
    assert len(fake.requests) == 2
    for seen in fake.requests:
        assert seen.body["messages"][0] == {"role": "system", "content": "Be brief."}
        assert seen.body["temperature"] == 0.1 and seen.body["max_tokens"] == 50
        assert seen.body["tool_choice"] == "auto"
        assert {t["function"]["name"] for t in seen.body["tools"]} >= {"put_note", "get_note"}
    # The second turn carries the call and its result, content never null.
    second = fake.requests[1].body["messages"]
    assert second[2]["role"] == "assistant" and second[2]["content"] == ""
    assert second[3] == {"role": "tool", "tool_call_id": "call_1", "content": "saved note 'k'"}


async def test_provider_faults_are_retried_then_succeed(
    api: ServerProcess, key: str, start_worker: StartWorker, fake: FakeProvider
) -> None:
    await ready(start_worker(worker_env(fake)))
    stalled = text_reply("stal", "led")
    stalled.stall_after, stalled.stall = 2, 5.0
    fake.answer(
        error_reply(429, "slow down", **{"retry-after": "0.2"}),
        error_reply(503, "loading model"),
        text_reply("cut off mid", finish=None),
        stalled,
    )
    fake.answer(text_reply("Finally."))
    async with client(api.url, key) as http:
        sid = await new_session(http, model="openai:fake-model")
        session = await wait_for_status(http, sid, TERMINAL, timeout=30)
        events = await transcript(http, sid)
    assert session["status"] == "failed"  # three retries allowed, four faults
    reasons = [e["data"]["reason"] for e in of_type(events, "model_retry")]
    assert reasons == ["rate_limited", "server_error", "truncated"]
    assert of_type(events, "model_retry")[0]["data"]["delayMs"] == 200
    assert session["error"]["code"] == "MODEL_UNAVAILABLE"
    assert "sent nothing for 1 s" in session["error"]["message"]


async def test_a_failure_is_not_fed_back_to_the_model(
    api: ServerProcess, key: str, start_worker: StartWorker, fake: FakeProvider
) -> None:
    await ready(start_worker(worker_env(fake)))
    fake.answer(error_reply(401, "invalid api key"), text_reply("Hello again."))
    async with client(api.url, key) as http:
        sid = await new_session(http, "hello", model="openai:fake-model")
        failed = await finished(http, sid)
        assert failed["status"] == "failed"
        assert failed["error"]["code"] == "MODEL_AUTH_FAILED"
        assert "invalid api key" in failed["error"]["message"]
        await http.post(f"/api/agent/{sid}/messages", json={"text": "try again"})
        await wait_event(http, sid, lambda e: e["type"] == "assistant_message")
        assert (await finished(http, sid))["status"] == "succeeded"
    assert fake.requests[1].body["messages"] == [
        {"role": "user", "content": "hello"},
        {"role": "user", "content": "try again"},
    ]


async def test_a_token_is_shown_while_the_stream_stalls(
    api: ServerProcess, key: str, start_worker: StartWorker, fake: FakeProvider
) -> None:
    """A delta is sent within the coalescing window even when no next token comes to push it
    out: a viewer sees "Thinking" while the provider pauses."""
    await ready(start_worker(worker_env(fake, FERRYMAN_MODEL_IDLE_TIMEOUT="10")))
    reply = text_reply("Thinking", " done.")
    reply.stall_after, reply.stall = 2, 1.5  # after the role chunk and "Thinking"
    fake.answer(reply)
    async with client(api.url, key) as http:
        sid = await new_session(http, model="openai:fake-model")
        arrivals: list[tuple[float, str]] = []
        async with sse(http, f"/api/agent/{sid}/events") as events:
            async for event in events:
                if event.event == "message_delta":
                    arrivals.append((time.monotonic(), event.json()["data"]["text"]))
                if event.event == "session_end":
                    break
    assert "".join(text for _, text in arrivals) == "Thinking done."
    first_at, first = arrivals[0]
    assert first == "Thinking"
    assert arrivals[-1][0] - first_at >= 1.0  # it came before the stall ended


async def test_token_metrics(fake: FakeProvider) -> None:
    answer = text_reply("ok")
    answer.frames.insert(-1, usage_chunk(7, 3))
    fake.answer(answer)
    env = worker_env(fake)
    with (
        fresh_database("ferryman_test") as url,
        running(ServerProcess(url, env=env, worker=True)) as served,
    ):
        async with client(served.url) as http:
            session = await create_session(http, "hi", model="openai:fake-model")
            await finished(http, session["id"])
            metrics = (await http.get("/metrics")).text
    assert 'ferryman_model_tokens_total{kind="input",model="openai:fake-model"} 7.0' in metrics
    assert 'ferryman_model_tokens_total{kind="output",model="openai:fake-model"} 3.0' in metrics


def _seconds_between(start: str, end: str) -> float:
    from datetime import datetime

    def parse(ts: str) -> datetime:
        return datetime.fromisoformat(ts.replace("Z", "+00:00"))

    return (parse(end) - parse(start)).total_seconds()


async def test_nothing_is_left_running(api: ServerProcess) -> None:
    await asyncio.sleep(0)  # the module's workers stop with their tests


async def test_arguments_that_are_not_json_fail_the_call_not_the_session(
    api: ServerProcess, key: str, start_worker: StartWorker, fake: FakeProvider
) -> None:
    await ready(start_worker(worker_env(fake)))
    broken = tool_reply("get_note", {})
    broken.frames[0] = chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_x",
                    "type": "function",
                    "function": {"name": "get_note", "arguments": '{"key": '},
                }
            ]
        }
    )
    fake.answer(broken, text_reply("Sorry."))
    async with client(api.url, key) as http:
        sid = await new_session(http, model="openai:fake-model")
        assert (await finished(http, sid))["status"] == "succeeded"
        events = await transcript(http, sid)
    (result,) = of_type(events, "tool_result")
    assert result["data"]["isError"] is True
    assert result["data"]["content"].startswith("invalid arguments: not a JSON object")
    assert of_type(events, "assistant_message")[0]["data"]["toolCalls"][0] == {
        "id": "call_x",
        "name": "get_note",
        "arguments": {},
        "invalidArguments": '{"key": ',
    }
    # The model is shown what it wrote, not a re-wrapped object.
    shown = fake.requests[1].body["messages"][1]["tool_calls"][0]["function"]["arguments"]
    assert shown == '{"key": '


async def test_the_definition_survives_a_crash(
    api: ServerProcess, key: str, start_worker: StartWorker, fake: FakeProvider
) -> None:
    """The worker dies while the provider streams; the resumed run asks with the same
    instructions and settings."""
    victim = start_worker(worker_env(fake, FERRYMAN_MODEL_IDLE_TIMEOUT="30"))
    await ready(victim)
    stalled = text_reply("Thinking", " more")
    stalled.stall_after, stalled.stall = 2, 60.0
    fake.answer(stalled, text_reply("Answered."))
    async with client(api.url, key) as http:
        sid = await new_session(
            http,
            model="openai:fake-model",
            instructions="Be brief.",
            modelSettings={"temperature": 0.3, "stop": ["END"]},
        )
        deadline = time.monotonic() + 20
        while not fake.requests:
            assert time.monotonic() < deadline, "the model was never called"
            await asyncio.sleep(0.05)
        victim.signal(signal.SIGKILL)
        await ready(start_worker(worker_env(fake)))
        assert (await finished(http, sid))["status"] == "succeeded"
        events = await transcript(http, sid)
    assert of_type(events, "session_resumed")[0]["data"]["reason"] == "crash"
    assert len(fake.requests) == 2
    for seen in fake.requests:
        assert seen.body["messages"][0] == {"role": "system", "content": "Be brief."}
        assert seen.body["temperature"] == 0.3 and seen.body["stop"] == ["END"]
