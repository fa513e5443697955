"""AG-UI against a real server (uvicorn) and real worker processes, every streamed event parsed
by the protocol's own Python types (`ag-ui-protocol`): text streamed token by token, a tool call
with its result, an approval ending the run as an interrupt and answered through `resume`, a
provider retry as a CUSTOM event, the history AG-UI resends matched rather than posted again
(and sent to a client that lacks it),
a worker crash taken over mid-run, a stored assistant's endpoint, and what is refused."""

from __future__ import annotations

import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from ag_ui.core import (
    CustomEvent,
    Event,
    EventType,
    MessagesSnapshotEvent,
    RunFinishedEvent,
    RunStartedEvent,
    SubagentErrorEvent,
    SubagentFinishedEvent,
    SubagentStartedEvent,
    TextMessageContentEvent,
    ToolCallArgsEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from httpx_sse import aconnect_sse
from pydantic import TypeAdapter

from tests.support import (
    ServerProcess,
    StartWorker,
    assert_problem,
    client,
    create_owner_key,
    ready,
    transcript,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

EVENT: TypeAdapter[Event] = TypeAdapter(Event)


@pytest.fixture
async def http(api: ServerProcess, key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with client(api.url, key) as http:
        yield http


def run_input(thread_id: str, messages: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {
        "threadId": thread_id,
        "runId": str(uuid.uuid4()),
        "messages": messages,
        "tools": [],
        "context": [],
        "state": {},
        **more,
    }


def scripted(script: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"ferryman": {"model": "scripted", "script": script, **more}}


def user(text: str) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "role": "user", "content": text}


async def run(
    http: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    on_event: Callable[[Any], Awaitable[None]] | None = None,
) -> list[Any]:
    """The run's events, each parsed by AG-UI's types (`on_event` sees each as it comes);
    checked in the protocol's order."""
    events = []
    async with aconnect_sse(http, "POST", path, json=body) as source:
        assert source.response.status_code == 200, await source.response.aread()
        assert source.response.headers["content-type"].startswith("text/event-stream")
        async for sse in source.aiter_sse():
            if sse.data:
                events.append(EVENT.validate_json(sse.data))
                if on_event is not None:
                    await on_event(events[-1])
    assert_ordered(events, body)
    return events


def assert_ordered(events: list[Any], body: dict[str, Any]) -> None:
    """AG-UI's order rules: RUN_STARTED first, a terminal event last; text and tool calls
    started before their content and ended before the run; steps closed by name."""
    first, last = events[0], events[-1]
    assert isinstance(first, RunStartedEvent)
    assert (first.thread_id, first.run_id) == (body["threadId"], body["runId"])
    assert last.type in (EventType.RUN_FINISHED, EventType.RUN_ERROR)
    if isinstance(last, RunFinishedEvent):
        assert (last.thread_id, last.run_id) == (body["threadId"], body["runId"])
    texts: set[str] = set()
    calls: set[str] = set()
    steps: set[str] = set()
    for event in events[1:-1]:
        kind = event.type
        assert kind not in (EventType.RUN_STARTED, EventType.RUN_FINISHED, EventType.RUN_ERROR)
        if kind == EventType.TEXT_MESSAGE_START:
            assert not texts
            texts.add(event.message_id)
        elif kind == EventType.TEXT_MESSAGE_CONTENT:
            assert event.message_id in texts and event.delta
        elif kind == EventType.TEXT_MESSAGE_END:
            texts.remove(event.message_id)
        elif kind == EventType.TOOL_CALL_START:
            calls.add(event.tool_call_id)
        elif kind == EventType.TOOL_CALL_ARGS:
            assert event.tool_call_id in calls
        elif kind == EventType.TOOL_CALL_END:
            calls.remove(event.tool_call_id)
        elif kind == EventType.STEP_STARTED:
            assert event.step_name not in steps
            steps.add(event.step_name)
        elif kind == EventType.STEP_FINISHED:
            steps.remove(event.step_name)
    assert not texts and not calls and not steps


def of(events: list[Any], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def streamed_text(events: list[Any]) -> str:
    return "".join(e.delta for e in of(events, TextMessageContentEvent))


async def test_text_streams_and_the_resent_history_is_matched(
    http: httpx.AsyncClient, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    tid = str(uuid.uuid4())
    text = "The quick brown fox jumps over the lazy dog."
    script = [{"text": text, "chunks": 6, "delayMs": 300}, {"text": "Second answer."}]
    first = user("hello")
    body = run_input(tid, [first], forwardedProps=scripted(script))
    events = await run(http, "/ag-ui/agent", body)
    kinds = [e.type for e in events]
    assert kinds.count(EventType.TEXT_MESSAGE_CONTENT) > 1  # token by token
    assert streamed_text(events) == text
    assert kinds.count(EventType.STEP_STARTED) == 1
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent)
    assert finished.outcome is not None and finished.outcome.type == "success"
    # The thread is a native session of the caller, made on first use with that id.
    session = (await http.get(f"/api/agent/{tid}")).json()
    assert session["id"] == tid and session["status"] == "succeeded"
    # The next run resends the history (the assistant message by the id AG-UI streamed it
    # with): only the new user message is posted.
    message_id = of(events, TextMessageContentEvent)[0].message_id
    history = [first, {"id": message_id, "role": "assistant", "content": text}, user("again")]
    events = await run(http, "/ag-ui/agent", run_input(tid, history))
    assert streamed_text(events) == "Second answer."
    users = [e["data"]["text"] for e in await transcript(http, tid) if e["type"] == "user_message"]
    assert users == ["hello", "again"]
    assert not of(events, MessagesSnapshotEvent)  # the client has the history
    # Nothing new: refused, nothing written.
    resent = run_input(tid, history)
    assert_problem(await http.post("/ag-ui/agent", json=resent), 422, "INPUT_NOT_SUPPORTED")
    # A client without the history (a new page on the thread) is sent it first.
    fresh = user("fresh")
    events = await run(http, "/ag-ui/agent", run_input(tid, [fresh]))
    [snapshot] = of(events, MessagesSnapshotEvent)
    assert events.index(snapshot) == 1  # right after RUN_STARTED
    assert fresh["id"] not in [m.id for m in snapshot.messages]  # its own id now: the log's
    said = [(m.role, m.content) for m in snapshot.messages]
    assert said == [
        ("user", "hello"),
        ("assistant", text),
        ("user", "again"),
        ("assistant", "Second answer."),
        ("user", "fresh"),
    ]
    assert snapshot.messages[1].id == message_id  # the id its text message streamed with
    # Under the log's ids, which the client sends back: matched, not posted again.
    history = [
        m.model_dump(mode="json", by_alias=True, exclude_none=True) for m in snapshot.messages
    ]
    events = await run(http, "/ag-ui/agent", run_input(tid, [*history, user("more")]))
    assert not of(events, MessagesSnapshotEvent)
    users = [e["data"]["text"] for e in await transcript(http, tid) if e["type"] == "user_message"]
    assert users == ["hello", "again", "fresh", "more"]


async def test_a_tool_call_and_its_result(
    http: httpx.AsyncClient, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    tid = str(uuid.uuid4())
    script = [
        {
            "text": "Saving.",
            "toolCalls": [{"name": "put_note", "arguments": {"key": "k", "text": "v"}}],
        },
        {"text": "Saved."},
    ]
    body = run_input(tid, [user("save")], forwardedProps=scripted(script))
    events = await run(http, "/ag-ui/agent", body)
    start = of(events, ToolCallStartEvent)
    assert [s.tool_call_name for s in start] == ["put_note"]
    call_id = start[0].tool_call_id
    args = "".join(a.delta for a in of(events, ToolCallArgsEvent) if a.tool_call_id == call_id)
    assert args == '{"key": "k", "text": "v"}'
    results = of(events, ToolCallResultEvent)
    assert [r.tool_call_id for r in results] == [call_id]
    assert streamed_text(events) == "Saving.Saved."
    assert [e.type for e in events].count(EventType.STEP_STARTED) == 2  # one per model turn
    # The tool call's start comes after its turn's text ended, its result after its end.
    kinds = [e.type for e in events]
    assert kinds.index(EventType.TEXT_MESSAGE_END) < kinds.index(EventType.TOOL_CALL_START)
    assert kinds.index(EventType.TOOL_CALL_END) < kinds.index(EventType.TOOL_CALL_RESULT)


async def test_an_approval_is_an_interrupt_answered_through_resume(
    http: httpx.AsyncClient, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    tid = str(uuid.uuid4())
    script = [
        {"toolCalls": [{"name": "put_note", "arguments": {"key": "a", "text": "b"}}]},
        {"text": "Done."},
    ]
    props = scripted(script, approvalRequired=["put_note"])
    first = user("save it")
    events = await run(http, "/ag-ui/agent", run_input(tid, [first], forwardedProps=props))
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.outcome is not None
    assert finished.outcome.type == "interrupt"
    [interrupt] = finished.outcome.interrupts
    call_id = of(events, ToolCallStartEvent)[0].tool_call_id
    assert interrupt.reason == "tool_approval" and interrupt.tool_call_id == call_id
    assert not of(events, ToolCallResultEvent)  # it waits
    assert (await http.get(f"/api/agent/{tid}")).json()["status"] == "waiting"
    # A resume naming no pending interrupt is refused.
    wrong = run_input(tid, [first], resume=[{"interruptId": "nope", "status": "resolved"}])
    assert_problem(await http.post("/ag-ui/agent", json=wrong), 409, "NO_PENDING_INTERRUPT")
    answer = {"interruptId": interrupt.id, "status": "resolved", "payload": {"approved": True}}
    events = await run(http, "/ag-ui/agent", run_input(tid, [first], resume=[answer]))
    assert [r.tool_call_id for r in of(events, ToolCallResultEvent)] == [call_id]
    assert "tool_approval_decided" in [c.name for c in of(events, CustomEvent)]
    assert streamed_text(events) == "Done."
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.outcome is not None
    assert finished.outcome.type == "success"
    decided = [e for e in await transcript(http, tid) if e["type"] == "tool_approval_decided"]
    assert [d["data"]["approved"] for d in decided] == [True]


async def test_a_question_is_an_interrupt_answered_through_resume(
    http: httpx.AsyncClient, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    tid = str(uuid.uuid4())
    script = [
        {"toolCalls": [{"name": "ask_user", "arguments": {"question": "Which color?"}}]},
        {"text": "Blue it is."},
    ]
    first = user("paint")
    events = await run(
        http, "/ag-ui/agent", run_input(tid, [first], forwardedProps=scripted(script))
    )
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.outcome is not None
    assert finished.outcome.type == "interrupt"
    [interrupt] = finished.outcome.interrupts
    assert interrupt.reason == "question" and interrupt.message == "Which color?"
    answer = {"interruptId": interrupt.id, "status": "resolved", "payload": "blue"}
    events = await run(http, "/ag-ui/agent", run_input(tid, [first], resume=[answer]))
    assert streamed_text(events) == "Blue it is."
    users = [e["data"]["text"] for e in await transcript(http, tid) if e["type"] == "user_message"]
    assert users == ["paint", "blue"]


async def test_a_worker_crash_mid_run_goes_on_from_the_log(
    http: httpx.AsyncClient, start_worker: StartWorker
) -> None:
    worker = start_worker()
    await ready(worker)
    tid = str(uuid.uuid4())
    script = [
        {"toolCalls": [{"name": "sleep", "arguments": {"seconds": 4}}]},
        {"text": "Back again."},
    ]

    async def crash(event: Any) -> None:
        if isinstance(event, CustomEvent) and event.name == "tool_call_start":
            worker.stop(signal.SIGKILL)  # mid-sleep
            await ready(start_worker())

    body = run_input(tid, [user("nap")], forwardedProps=scripted(script))
    events = await run(http, "/ag-ui/agent", body, crash)
    names = [c.name for c in of(events, CustomEvent)]
    assert "session_resumed" in names
    # The interrupted call answered (by the takeover's repair), every call once, and the
    # run went on.
    calls = [c.tool_call_id for c in of(events, ToolCallStartEvent)]
    assert [r.tool_call_id for r in of(events, ToolCallResultEvent)] == calls
    assert streamed_text(events) == "Back again."
    assert isinstance(events[-1], RunFinishedEvent)


async def test_a_provider_retry_is_a_custom_event(
    http: httpx.AsyncClient, start_worker: StartWorker
) -> None:
    await ready(start_worker({"FERRYMAN_MODEL_MAX_RETRIES": "2"}))
    tid = str(uuid.uuid4())
    script = [{"text": "Fine now.", "chunks": 3, "fault": {"kind": "server_error"}}]
    body = run_input(tid, [user("go")], forwardedProps=scripted(script))
    events = await run(http, "/ag-ui/agent", body)
    assert "model_retry" in [c.name for c in of(events, CustomEvent)]
    # The abandoned turn's text message and step ended at the retry; the retry streams anew.
    assert of(events, TextMessageContentEvent)[-1].delta
    assert isinstance(events[-1], RunFinishedEvent)


async def test_delegates_are_subagents_of_the_run(
    http: httpx.AsyncClient, start_worker: StartWorker
) -> None:
    """A delegate call's child is a subagent of the parent's run (docs/delegation.md): the run
    stays open while the parent waits on its children, and goes on with their ends."""
    await ready(start_worker())

    async def stored(name: str, **body: Any) -> str:
        made = await http.post("/api/assistants", json={"name": name, "model": "scripted", **body})
        assert made.status_code == 201, made.text
        return str(made.json()["id"])

    helper = await stored("Helper", script=[{"text": "helped"}])
    broken = await stored("Broken", model="openai:nowhere")
    calls = [
        {"name": f"agent__{name}", "arguments": {"task": name}} for name in ("helper", "broken")
    ]
    planner = await stored(
        "Planner", delegates=[helper, broken], script=[{"toolCalls": calls}, {"text": "planned"}]
    )
    tid = str(uuid.uuid4())
    events = await run(http, f"/ag-ui/assistants/{planner}", run_input(tid, [user("plan")]))
    (started_helper, started_broken) = of(events, SubagentStartedEvent)
    assert [s.name for s in (started_helper, started_broken)] == ["agent__helper", "agent__broken"]
    calls_made = [c.tool_call_id for c in of(events, ToolCallStartEvent)]
    assert [started_helper.parent_tool_call_id, started_broken.parent_tool_call_id] == calls_made
    (finished,) = of(events, SubagentFinishedEvent)
    assert finished.subagent_run_id == started_helper.subagent_run_id
    assert finished.result == "helped"
    (failed,) = of(events, SubagentErrorEvent)
    assert failed.subagent_run_id == started_broken.subagent_run_id
    results = {r.tool_call_id: r.content for r in of(events, ToolCallResultEvent)}
    assert results[calls_made[0]] == "helped"
    assert streamed_text(events).endswith("planned")
    assert isinstance(events[-1], RunFinishedEvent)
    child = (await http.get(f"/api/agent/{started_helper.subagent_run_id}")).json()
    assert child["parent"] == {"sessionId": tid, "toolCallId": calls_made[0]}


async def test_a_stored_assistant_and_what_is_refused(
    http: httpx.AsyncClient, api: ServerProcess, isolated_db: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    made = await http.post("/api/assistants", json={"name": "echo", "model": "scripted"})
    assert made.status_code == 201, made.text
    assistant = made.json()["id"]
    tid = str(uuid.uuid4())
    events = await run(http, f"/ag-ui/assistants/{assistant}", run_input(tid, [user("hi")]))
    assert streamed_text(events) == "You said: hi"
    session = (await http.get(f"/api/agent/{tid}")).json()
    assert session["assistant"] == {"id": assistant, "version": 1}
    body = run_input(str(uuid.uuid4()), [user("x")])
    missing = await http.post(f"/ag-ui/assistants/{uuid.uuid4()}", json=body)
    assert_problem(missing, 404, "ASSISTANT_NOT_FOUND")
    # Another owner's thread is no one's to the caller; so is an id that is not a UUID.
    other = create_owner_key(isolated_db)[1]
    async with client(api.url, other) as stranger:
        taken = run_input(tid, [user("mine?")])
        assert_problem(await stranger.post("/ag-ui/agent", json=taken), 404, "SESSION_NOT_FOUND")
        named = run_input("not-a-uuid", [user("x")])
        assert_problem(await stranger.post("/ag-ui/agent", json=named), 404, "SESSION_NOT_FOUND")
    # The refused run left no thread behind, and its id serves the next try.
    assert_problem(await http.get(f"/api/agent/{body['threadId']}"), 404, "SESSION_NOT_FOUND")
    events = await run(http, f"/ag-ui/assistants/{assistant}", body)
    assert streamed_text(events) == "You said: x"
    async with client(api.url, "fm_not_a_key") as unknown:
        assert_problem(await unknown.post("/ag-ui/agent", json=body), 401, "INVALID_API_KEY")
