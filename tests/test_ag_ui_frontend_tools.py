"""AG-UI frontend tools (client tools) against a real server and real worker processes, every
event parsed by `ag-ui-protocol`'s types: the model calls a tool the client declared, the run
ends with the session waiting for the client's `tool` message, which the next input posts and
the loop goes on with; the wait survives a worker SIGKILL, and a takeover mid-turn repairs the
server's interrupted call but leaves the client's waiting (not run, not repaired, the model not
asked); a duplicate result is matched, a result for no waiting call is 409; a call its schema
refuses is answered by the server. And the native API's side of it (`clientTools`, POST
.../tool-calls/{id}/result), the OpenAI adapter offered the client's schema, and the resume
plan's hold on client calls."""

from __future__ import annotations

import asyncio
import signal
import uuid
from typing import Any

import httpx
import pytest
from ag_ui.core import (
    CustomEvent,
    RunFinishedEvent,
    ToolCallArgsEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)

from app.agent.conversation import AssistantMessage, ToolCall, UserMessage
from app.agent.resume import plan_resume
from tests.fake_provider import FakeProvider, text_reply, tool_reply
from tests.support import StartWorker, assert_problem, ready, transcript
from tests.test_ag_ui import http, of, run, run_input, scripted, streamed_text, user

__all__ = ["http"]  # the fixture, used by name

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

WEATHER = {
    "name": "show_weather",
    "description": "Show the weather card for a city in the page.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
SCRIPT = [
    {
        "text": "Let me show it.",
        "toolCalls": [{"name": "show_weather", "arguments": {"city": "Oslo"}}],
    },
    {"text": "Shown."},
]


async def status_of(http: httpx.AsyncClient, tid: str) -> str:
    session = (await http.get(f"/api/agent/{tid}")).json()
    return str(session["status"])


async def first_run(http: httpx.AsyncClient, tid: str) -> tuple[list[Any], list[dict[str, Any]]]:
    """A run whose model calls the client's tool: its events, and the client's history."""
    first = user("weather in Oslo?")
    body = run_input(tid, [first], tools=[WEATHER], forwardedProps=scripted(SCRIPT))
    events = await run(http, "/ag-ui/agent", body)
    [start] = of(events, ToolCallStartEvent)
    assert start.tool_call_name == "show_weather"
    args = "".join(a.delta for a in of(events, ToolCallArgsEvent))
    assert args == '{"city": "Oslo"}'
    assert not of(events, ToolCallResultEvent)  # not run by the server
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.outcome is not None
    assert finished.outcome.type == "success"  # a frontend tool is no interrupt
    assistant = {
        "id": start.parent_message_id,
        "role": "assistant",
        "content": "Let me show it.",
        "toolCalls": [
            {
                "id": start.tool_call_id,
                "type": "function",
                "function": {"name": "show_weather", "arguments": args},
            }
        ],
    }
    return events, [first, assistant]


async def settled(http: httpx.AsyncClient, sid: str, status: str) -> bool:
    for _ in range(200):
        if await status_of(http, sid) == status:
            return True
        await asyncio.sleep(0.1)
    return False


def tool_message(call_id: str, content: str) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "role": "tool", "toolCallId": call_id, "content": content}


async def test_a_frontend_tool_call_waits_for_the_clients_result(
    http: httpx.AsyncClient, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    tid = str(uuid.uuid4())
    events, history = await first_run(http, tid)
    call_id = of(events, ToolCallStartEvent)[0].tool_call_id
    assert await status_of(http, tid) == "waiting"
    session = (await http.get(f"/api/agent/{tid}")).json()
    assert [t["name"] for t in session["clientTools"]] == ["show_weather"]
    # The model was offered the client's tool; the worker ran nothing.
    log = await transcript(http, tid)
    assert "tool_call_start" not in [e["type"] for e in log]
    assert [e["data"]["toolCallId"] for e in log if e["type"] == "client_tool_call"] == [call_id]
    # A tool message for no waiting call: 409, nothing written.
    stray = tool_message("call-that-is-not", "x")
    body = run_input(tid, [*history, stray], tools=[WEATHER])
    assert_problem(await http.post("/ag-ui/agent", json=body), 409, "CLIENT_TOOL_NOT_PENDING")
    assert await status_of(http, tid) == "waiting"
    # The client's result: posted, and the loop goes on.
    result = tool_message(call_id, "sunny, 21 C")
    history.append(result)
    events = await run(http, "/ag-ui/agent", run_input(tid, history, tools=[WEATHER]))
    assert not of(events, ToolCallResultEvent)  # the client holds its result already
    assert streamed_text(events) == "Shown."
    assert events[-1].outcome.type == "success"
    assert await status_of(http, tid) == "succeeded"
    log = await transcript(http, tid)
    results = [e["data"] for e in log if e["type"] == "tool_result"]
    assert results == [
        {
            "toolCallId": call_id,
            "name": "show_weather",
            "isError": False,
            "content": "sunny, 21 C",
            "client": True,
        }
    ]
    # The history resent with the result (and a new message): the result is matched, once.
    events = await run(http, "/ag-ui/agent", run_input(tid, [*history, user("thanks")]))
    assert streamed_text(events) == "You said: thanks"
    log = await transcript(http, tid)
    assert [e["type"] for e in log].count("client_tool_result") == 1
    assert [e["type"] for e in log].count("tool_result") == 1


async def test_the_wait_survives_a_worker_sigkill(
    http: httpx.AsyncClient, start_worker: StartWorker
) -> None:
    worker = start_worker()
    await ready(worker)
    tid = str(uuid.uuid4())
    events, history = await first_run(http, tid)
    call_id = of(events, ToolCallStartEvent)[0].tool_call_id
    worker.stop(signal.SIGKILL)
    await ready(start_worker())
    await asyncio.sleep(1.5)  # a worker that would take the session over had the time to
    assert await status_of(http, tid) == "waiting"
    log = await transcript(http, tid)
    assert "tool_result" not in [e["type"] for e in log]  # not repaired, not run
    assert "session_resumed" not in [e["type"] for e in log]
    history.append(tool_message(call_id, "rainy"))
    events = await run(http, "/ag-ui/agent", run_input(tid, history, tools=[WEATHER]))
    assert streamed_text(events) == "Shown."
    assert await status_of(http, tid) == "succeeded"
    log = await transcript(http, tid)
    assert [e["data"]["content"] for e in log if e["type"] == "tool_result"] == ["rainy"]
    assert [e["type"] for e in log].count("assistant_message") == 2  # no turn played twice


async def test_a_takeover_mid_turn_leaves_the_client_call_waiting(
    http: httpx.AsyncClient, start_worker: StartWorker
) -> None:
    worker = start_worker()
    await ready(worker)
    tid = str(uuid.uuid4())
    calls = [
        {"name": "sleep", "arguments": {"seconds": 3}},
        {"name": "show_weather", "arguments": {"city": "Oslo"}},
    ]
    script = [{"toolCalls": calls}, {"text": "Shown."}]

    async def crash(event: Any) -> None:
        if isinstance(event, CustomEvent) and event.name == "tool_call_start":
            worker.stop(signal.SIGKILL)  # mid-sleep: the client's call is in the log already
            await ready(start_worker())

    body = run_input(tid, [user("go")], tools=[WEATHER], forwardedProps=scripted(script))
    events = await run(http, "/ag-ui/agent", body, crash)
    [resumed] = [c for c in of(events, CustomEvent) if c.name == "session_resumed"]
    sleep_id, client_id = (s.tool_call_id for s in of(events, ToolCallStartEvent))
    # The takeover repaired the interrupted sleep, and left the client's call to its client.
    assert resumed.value["repairedToolCalls"] == [sleep_id]
    assert [r.tool_call_id for r in of(events, ToolCallResultEvent)] == [sleep_id]
    assert await status_of(http, tid) == "waiting"
    log = await transcript(http, tid)
    assert [e["type"] for e in log].count("assistant_message") == 1  # the model not asked
    history = [body["messages"][0], tool_message(client_id, "sunny")]
    # The scripted model replays the turn whose sleep was interrupted (SPEC 6): its new call
    # of the client's tool waits again, and its result ends the run.
    events = await run(http, "/ag-ui/agent", run_input(tid, history, tools=[WEATHER]))
    again = [s.tool_call_id for s in of(events, ToolCallStartEvent)][1]
    assert await status_of(http, tid) == "waiting"
    history.append(tool_message(again, "still sunny"))
    events = await run(http, "/ag-ui/agent", run_input(tid, history, tools=[WEATHER]))
    assert streamed_text(events) == "Shown."
    assert await status_of(http, tid) == "succeeded"
    log = await transcript(http, tid)
    client_results = [
        e["data"] for e in log if e["type"] == "tool_result" and e["data"].get("client")
    ]
    assert [(r["toolCallId"], r["content"]) for r in client_results] == [
        (client_id, "sunny"),
        (again, "still sunny"),
    ]


async def test_the_native_api_posts_a_result_once(
    http: httpx.AsyncClient, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    made = await http.post(
        "/api/agent", json={"prompt": "weather?", "script": SCRIPT, "clientTools": [WEATHER]}
    )
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    assert await settled(http, sid, "waiting")
    [call] = [e["data"] for e in await transcript(http, sid) if e["type"] == "client_tool_call"]
    assert call["name"] == "show_weather" and call["arguments"] == {"city": "Oslo"}
    path = f"/api/agent/{sid}/tool-calls/{call['toolCallId']}/result"
    posted = await http.post(path, json={"content": "cloudy"})
    assert posted.status_code == 202, posted.text
    assert posted.json()["duplicate"] is False
    again = await http.post(path, json={"content": "cloudy"})  # a retry: matched
    assert again.status_code == 202 and again.json()["duplicate"] is True
    assert again.json()["seq"] == posted.json()["seq"]
    other = await http.post(path, json={"content": "snow"})
    assert_problem(other, 409, "CLIENT_TOOL_NOT_PENDING")
    unknown = await http.post(f"/api/agent/{sid}/tool-calls/nope/result", json={"content": "x"})
    assert_problem(unknown, 409, "CLIENT_TOOL_NOT_PENDING")
    assert await settled(http, sid, "succeeded")
    log = await transcript(http, sid)
    assert [e["data"]["content"] for e in log if e["type"] == "tool_result"] == ["cloudy"]


async def test_client_tools_are_validated(
    http: httpx.AsyncClient, start_worker: StartWorker
) -> None:
    bad_schema = {"name": "t", "parameters": {"type": 12}}
    taken = {"name": "put_note", "parameters": {"type": "object"}}
    bad_name = {"name": "has space"}
    twice = [WEATHER, WEATHER]
    for tools in ([bad_schema], [taken], [bad_name], twice, [WEATHER] * 65):
        made = await http.post("/api/agent", json={"prompt": "x", "clientTools": tools})
        assert_problem(made, 422, "VALIDATION_ERROR")
    huge = [{"name": f"t{i}", "description": "d" * 2000} for i in range(40)]
    made = await http.post("/api/agent", json={"prompt": "x", "clientTools": huge})
    assert_problem(made, 422, "VALIDATION_ERROR")
    # A session without client tools shows no such field.
    plain = await http.post("/api/agent", json={"prompt": "x"})
    assert "clientTools" not in plain.json()
    body = run_input(str(uuid.uuid4()), [user("x")], tools=[bad_schema])
    assert_problem(await http.post("/ag-ui/agent", json=body), 422, "VALIDATION_ERROR")


async def test_a_call_its_schema_refuses_never_reaches_the_client(
    http: httpx.AsyncClient, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    tid = str(uuid.uuid4())
    script = [
        {"toolCalls": [{"name": "show_weather", "arguments": {"town": "Oslo"}}]},
        {"text": "Sorry."},
    ]
    body = run_input(tid, [user("weather?")], tools=[WEATHER], forwardedProps=scripted(script))
    events = await run(http, "/ag-ui/agent", body)
    [start] = of(events, ToolCallStartEvent)
    [result] = of(events, ToolCallResultEvent)  # answered by the server, with the error
    assert result.tool_call_id == start.tool_call_id
    assert result.content.startswith("invalid arguments: ") and "city" in result.content
    assert streamed_text(events) == "Sorry."
    assert await status_of(http, tid) == "succeeded"
    log = await transcript(http, tid)
    assert "client_tool_call" not in [e["type"] for e in log]


async def test_the_openai_adapter_offers_the_clients_schema_and_sends_its_result(
    http: httpx.AsyncClient, start_worker: StartWorker, fake: FakeProvider
) -> None:
    await ready(start_worker({"FERRYMAN_OPENAI_BASE_URL": fake.openai_url}))
    fake.answer(tool_reply("show_weather", {"city": "Oslo"}), text_reply("Shown."))
    body = {"prompt": "weather?", "model": "openai:fake-model", "clientTools": [WEATHER]}
    made = await http.post("/api/agent", json=body)
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    assert await settled(http, sid, "waiting")
    offered = {t["function"]["name"]: t for t in fake.requests[0].body["tools"]}
    assert offered["show_weather"] == {
        "type": "function",
        "function": {
            "name": "show_weather",
            "description": WEATHER["description"],
            "parameters": WEATHER["parameters"],
        },
    }
    assert "put_note" in offered  # beside the server's tools
    posted = await http.post(
        f"/api/agent/{sid}/tool-calls/call_1/result", json={"content": "sunny"}
    )
    assert posted.status_code == 202, posted.text
    assert await settled(http, sid, "succeeded")
    assert len(fake.requests) == 2
    told = fake.requests[1].body["messages"][-1]
    assert told == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}


def test_the_resume_plan_holds_client_calls() -> None:
    calls = (ToolCall("a", "sleep", {"seconds": 1}), ToolCall("b", "show_weather", {}))
    history = [UserMessage("go"), AssistantMessage("", calls, "tool_use")]
    plan = plan_resume(history, client_calls={"b"})
    assert plan.kind == "continue"
    assert plan.repaired_tool_calls == ["a"]  # the server's call, interrupted
    assert [c.id for c in plan.awaiting] == ["b"]  # the client's, waiting for its result
    assert plan_resume(history).repaired_tool_calls == ["a", "b"]  # as before without it


async def test_a_message_instead_of_the_result_answers_the_call(
    http: httpx.AsyncClient, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    made = await http.post(
        "/api/agent", json={"prompt": "weather?", "script": SCRIPT, "clientTools": [WEATHER]}
    )
    sid = made.json()["id"]
    assert await settled(http, sid, "waiting")
    [call] = [e["data"] for e in await transcript(http, sid) if e["type"] == "client_tool_call"]
    sent = await http.post(f"/api/agent/{sid}/messages", json={"text": "skip it"})
    assert sent.status_code == 202, sent.text
    assert await settled(http, sid, "succeeded")
    log = await transcript(http, sid)
    [result] = [e["data"] for e in log if e["type"] == "tool_result"]
    assert result["toolCallId"] == call["toolCallId"] and result["isError"] is True
    assert "instead of the client's result" in result["content"] and "client" not in result
    late = await http.post(
        f"/api/agent/{sid}/tool-calls/{call['toolCallId']}/result", json={"content": "sunny"}
    )
    assert_problem(late, 409, "CLIENT_TOOL_NOT_PENDING")
