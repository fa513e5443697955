"""The Agent Protocol through the official Python client, `langgraph-sdk`, against a real
server (uvicorn, ephemeral port) and real worker processes: threads, a run streamed token by
token with a tool call, state and history, an interrupt answered with `command.resume`, a
cancel, and a run's stream joined across an API restart and a worker SIGKILL, every event
exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import ConflictError, NotFoundError
from langgraph_sdk.schema import StreamPart

from tests.support import (
    ServerProcess,
    StartWorker,
    assert_problem,
    client,
    create_owner_key,
    free_port,
    owner_backlog,
    ready,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

GRAPH = "ferryman"
GUIDE = Path(__file__).resolve().parents[1] / "docs" / "langgraph.md"
ALL_MODES = ["values", "updates", "messages-tuple", "events", "custom"]


@pytest.fixture(scope="module")
def protocol_api(isolated_db: str) -> Iterator[ServerProcess]:
    """An API server on a port it keeps across restarts (the client's URL stays good)."""
    server = ServerProcess(isolated_db, env={"FERRYMAN_POLL_INTERVAL": "1"}, port=free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def sdk(protocol_api: ServerProcess, key: str) -> AsyncIterator[LangGraphClient]:
    client = get_client(url=f"{protocol_api.url}/agent-protocol", api_key=key)
    yield client
    await client.http.client.aclose()


def context(script: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"model": "scripted", "script": script, **more}


def text_of(content: Any) -> str:
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


def streamed_texts(parts: list[StreamPart]) -> dict[str, str]:
    """The text each AI message's `messages` chunks add up to, by message id."""
    texts: dict[str, str] = {}
    for part in parts:
        if part.event == "messages" and part.data[0]["type"] == "AIMessageChunk":
            chunk = part.data[0]
            texts[chunk["id"]] = texts.get(chunk["id"], "") + text_of(chunk["content"])
    return texts


def durable(parts: list[StreamPart]) -> list[tuple[str | None, str, Any]]:
    """The parts made of log events (ids `<seq>-<j>`), chunks of token text left out: those
    are compared by the text they add up to."""
    return [
        (p.id, p.event, p.data)
        for p in parts
        if p.id and "-" in p.id and not (p.event == "messages" and "AIMessageChunk" in str(p.data))
    ]


async def collect(stream: AsyncIterator[StreamPart]) -> list[StreamPart]:
    return [part async for part in stream]


async def test_threads(sdk: LangGraphClient, protocol_api: ServerProcess, key: str) -> None:
    async with client(protocol_api.url, key) as http:
        before = (await http.get("/api/agent", params={"limit": 1})).json()["cursor"]
    thread = await sdk.threads.create(metadata={"user": "ann"})
    tid = thread["thread_id"]
    # Its session_created (written in the insert's statement) shows the session as GET does.
    async with client(protocol_api.url, key) as http:
        native = (await http.get(f"/api/agent/{tid}")).json()
        created = [json.loads(e.data) for e in await owner_backlog(http, before)]
    assert [(e["type"], e["data"]["session"]) for e in created] == [("session_created", native)]
    assert thread["status"] == "idle"
    assert thread["metadata"]["user"] == "ann"
    got = await sdk.threads.get(tid)
    assert got["thread_id"] == tid and got["values"] == {"messages": []}
    again = await sdk.threads.create(thread_id=tid, if_exists="do_nothing")
    assert again["thread_id"] == tid
    with pytest.raises(ConflictError):
        await sdk.threads.create(thread_id=tid)
    found = await sdk.threads.search(metadata={"user": "ann"})
    assert [t["thread_id"] for t in found] == [tid]
    assert [t["thread_id"] for t in await sdk.threads.search(status="idle")] == [tid]
    assert await sdk.threads.search(status="busy") == []
    updated = await sdk.threads.update(tid, metadata={"topic": "x"})
    assert updated["metadata"]["user"] == "ann" and updated["metadata"]["topic"] == "x"
    state = await sdk.threads.get_state(tid)
    assert state["values"] == {"messages": []} and state["next"] == []
    # What is not served says so, with a stable code.
    async with httpx.AsyncClient(base_url=f"{protocol_api.url}/agent-protocol") as http:
        headers = {"x-api-key": key}
        assert_problem(await http.post(f"/threads/{tid}/copy", headers=headers), 501, "NOT_SERVED")
        assert_problem(
            await http.post("/crons/search", json={}, headers=headers), 501, "NOT_SERVED"
        )
        bad = await http.post(
            f"/threads/{tid}/runs",
            json={"assistant_id": GRAPH, "input": {"messages": [{"role": "ai", "content": "x"}]}},
            headers=headers,
        )
        assert_problem(bad, 422, "INPUT_NOT_SUPPORTED")
        # Local mode: no key is the owner `local`, who has no such thread.
        assert_problem(await http.get(f"/threads/{tid}"), 404, "SESSION_NOT_FOUND")
        wrong = await http.get(f"/threads/{tid}", headers={"x-api-key": "nope"})
        assert_problem(wrong, 401, "INVALID_API_KEY")
    await sdk.threads.delete(tid)
    with pytest.raises(NotFoundError):
        await sdk.threads.get(tid)


TOOL_SCRIPT = [
    {
        "text": "Let me write that down.",
        "chunks": 5,
        "delayMs": 600,
        "toolCalls": [{"name": "put_note", "arguments": {"key": "k", "text": "v"}}],
    },
    {"text": "Done, noted.", "chunks": 4, "delayMs": 500},
]


async def test_stream_a_run_with_a_tool_call(
    sdk: LangGraphClient, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    thread = await sdk.threads.create()
    tid = thread["thread_id"]
    parts = await collect(
        sdk.runs.stream(
            tid,
            GRAPH,
            input={"messages": [{"role": "user", "content": "note k=v"}]},
            context=context(TOOL_SCRIPT),
            stream_mode=ALL_MODES,
        )
    )
    events = [p.event for p in parts]
    assert events[0] == "metadata" and events[-1] == "end", events
    assert parts[-1].data["status"] == "success"
    ids = [p.id for p in parts]
    assert len(set(ids)) == len(ids) and all(ids)
    run_id = parts[0].data["run_id"]
    # Token by token: more than one chunk per turn, adding up to the turn's text.
    chunks = [p for p in parts if p.event == "messages" and p.data[0]["type"] == "AIMessageChunk"]
    assert len(chunks) > 3
    assert sorted(streamed_texts(parts).values()) == sorted(
        ["Let me write that down.", "Done, noted."]
    )
    calls = [c for p in chunks for c in p.data[0]["tool_call_chunks"]]
    assert [c["name"] for c in calls] == ["put_note"]
    assert any(p.event == "messages" and p.data[0]["type"] == "tool" for p in parts)
    assert any(p.event == "events" and p.data["event"] == "on_tool_start" for p in parts)
    assert any(p.event == "custom" and p.data["type"] == "session_start" for p in parts)
    final = [p for p in parts if p.event == "values"][-1].data["messages"]
    assert [m["type"] for m in final] == ["human", "ai", "tool", "ai"]
    assert final[1]["tool_calls"][0]["name"] == "put_note"
    assert final[2]["tool_call_id"] == final[1]["tool_calls"][0]["id"]
    assert final[3]["content"] == "Done, noted."
    # The chunks' message ids are the state's.
    assert set(streamed_texts(parts)) == {final[1]["id"], final[3]["id"]}

    state = await sdk.threads.get_state(tid)
    assert state["values"]["messages"] == final and state["next"] == []
    assert state["checkpoint"]["thread_id"] == tid
    history = await sdk.threads.get_history(tid, limit=10)
    assert history[0]["checkpoint"] == state["checkpoint"]
    assert [len(h["values"]["messages"]) for h in history] == [4, 3, 2, 1]
    assert history[1]["checkpoint"] == history[0]["parent_checkpoint"]
    assert await sdk.threads.get_history(tid, limit=10) == history  # stable ids
    older = await sdk.threads.get_history(tid, limit=2, before=history[1]["checkpoint"])
    assert older == history[2:4]
    run = await sdk.runs.get(tid, run_id)
    assert run["status"] == "success"
    assert [r["run_id"] for r in await sdk.runs.list(tid)] == [run_id]
    assert (await sdk.threads.get(tid))["status"] == "idle"
    # A joined finished run replays the same events, ids and all.
    again = await collect(sdk.runs.join_stream(tid, run_id, stream_mode=ALL_MODES))
    assert durable(again) == durable(parts)
    # A second run on the thread: its own id, the conversation goes on.
    second = await sdk.runs.wait(
        tid, GRAPH, input={"messages": [{"role": "user", "content": "hi"}]}
    )
    assert second["messages"][-1]["content"] == "You said: hi"
    assert len(await sdk.runs.list(tid)) == 2


async def test_interrupt_answered_by_resume(
    sdk: LangGraphClient, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    thread = await sdk.threads.create()
    tid = thread["thread_id"]
    script = [
        {"toolCalls": [{"name": "ask_user", "arguments": {"question": "Which color?"}}]},
        {"text": "Blue it is."},
    ]
    values = await sdk.runs.wait(
        tid,
        GRAPH,
        input={"messages": [{"role": "user", "content": "paint"}]},
        context=context(script),
    )
    interrupt = values["__interrupt__"][0]
    assert interrupt["value"]["question"] == "Which color?"
    thread = await sdk.threads.get(tid)
    assert thread["status"] == "interrupted"
    state = await sdk.threads.get_state(tid)
    assert state["tasks"][0]["interrupts"] == [interrupt] and state["next"] == ["agent"]
    runs = await sdk.runs.list(tid)
    assert runs[0]["status"] == "interrupted"
    parts = await collect(
        sdk.runs.stream(tid, GRAPH, command={"resume": "blue"}, stream_mode=["values", "updates"])
    )
    assert parts[-1].event == "end"
    final = [p for p in parts if p.event == "values"][-1].data
    assert "__interrupt__" not in final
    assert [m["content"] for m in final["messages"] if m["type"] == "human"] == ["paint", "blue"]
    assert final["messages"][-1]["content"] == "Blue it is."
    assert (await sdk.threads.get(tid))["status"] == "idle"
    # Nothing pends now: a resume is refused with its code.
    with pytest.raises(ConflictError):
        await sdk.runs.create(tid, GRAPH, command={"resume": "again"})


async def test_approval_answered_by_resume(sdk: LangGraphClient, start_worker: StartWorker) -> None:
    await ready(start_worker())
    tid = (await sdk.threads.create())["thread_id"]
    script = [
        {"toolCalls": [{"name": "put_note", "arguments": {"key": "a", "text": "b"}}]},
        {"text": "Saved."},
    ]
    values = await sdk.runs.wait(
        tid,
        GRAPH,
        input={"messages": [{"role": "user", "content": "save"}]},
        context=context(script, approvalRequired=["put_note"]),
    )
    interrupt = values["__interrupt__"][0]
    assert interrupt["value"]["type"] == "approval" and interrupt["value"]["name"] == "put_note"
    values = await sdk.runs.wait(tid, GRAPH, command={"resume": {interrupt["id"]: True}})
    assert values["messages"][-1]["content"] == "Saved."
    assert values["messages"][-2]["type"] == "tool"


async def test_cancel_a_run(sdk: LangGraphClient, start_worker: StartWorker) -> None:
    await ready(start_worker())
    tid = (await sdk.threads.create())["thread_id"]
    script = [{"toolCalls": [{"name": "sleep", "arguments": {"seconds": 60}}]}, {"text": "late"}]
    run = await sdk.runs.create(
        tid,
        GRAPH,
        input={"messages": [{"role": "user", "content": "wait"}]},
        context=context(script),
    )
    for _ in range(200):
        if (await sdk.runs.get(tid, run["run_id"]))["status"] == "running":
            break
        await asyncio.sleep(0.05)
    assert (await sdk.threads.get(tid))["status"] == "busy"
    with pytest.raises(ConflictError):  # multitask_strategy reject, the default
        await sdk.runs.create(tid, GRAPH, input={"messages": [{"role": "user", "content": "x"}]})
    await sdk.runs.cancel(tid, run["run_id"], wait=True)
    assert (await sdk.runs.get(tid, run["run_id"]))["status"] == "interrupted"
    assert (await sdk.threads.get(tid))["status"] == "idle"
    with pytest.raises(httpx.HTTPStatusError) as rollback:
        await sdk.runs.cancel(tid, run["run_id"], action="rollback")
    assert rollback.value.response.status_code == 501


KILL_SCRIPT = [
    {
        "text": "Sleeping first.",
        "chunks": 3,
        "delayMs": 300,
        "toolCalls": [{"name": "sleep", "arguments": {"seconds": 6}}],
    },
    {"text": "Awake now, all done.", "chunks": 4, "delayMs": 400},
]


async def test_join_across_api_restart_and_worker_kill(
    sdk: LangGraphClient, protocol_api: ServerProcess, start_worker: StartWorker
) -> None:
    worker = start_worker()
    await ready(worker)
    tid = (await sdk.threads.create())["thread_id"]
    parts: list[StreamPart] = []
    sleeping = asyncio.Event()

    async def follow() -> None:
        # The SDK reconnects on its own (the Location header) with Last-Event-ID.
        async for part in sdk.runs.stream(
            tid,
            GRAPH,
            input={"messages": [{"role": "user", "content": "nap"}]},
            context=context(KILL_SCRIPT),
            stream_mode=ALL_MODES,
            stream_resumable=True,
        ):
            parts.append(part)
            if part.event == "events" and part.data["event"] == "on_tool_start":
                sleeping.set()

    with warnings_ignored():
        task = asyncio.create_task(follow())
        await asyncio.wait_for(sleeping.wait(), 30)
        # The worker first, so that the run is still going when the stream is cut: the SDK
        # rejoins a run it finds running (and stops at one it finds ended).
        worker.stop(signal.SIGKILL)  # mid-sleep
        protocol_api.stop()  # SIGTERM: its streams end, the client reconnects
        protocol_api.start()
        await ready(start_worker())
        await asyncio.wait_for(task, 90)
    run_id = parts[0].data["run_id"]
    assert parts[-1].event == "end", " ".join(f"{p.id}:{p.event}" for p in parts)
    assert parts[-1].data["status"] == "success"
    ids = [p.id for p in parts]
    assert len(set(ids)) == len(ids), "an event came twice"
    assert any(p.event == "custom" and p.data["type"] == "session_resumed" for p in parts)
    # Against an uninterrupted read of the same run: the same events, ids and payloads.
    whole = await collect(sdk.runs.join_stream(tid, run_id, stream_mode=ALL_MODES))
    assert durable(parts) == durable(whole)
    assert streamed_texts(parts) == streamed_texts(whole)
    # And an explicit join from the middle gives exactly the rest.
    middle = durable(whole)[len(durable(whole)) // 2][0]
    rest = await collect(
        sdk.runs.join_stream(tid, run_id, stream_mode=ALL_MODES, last_event_id=middle)
    )
    cut = [d[0] for d in durable(whole)].index(middle) + 1
    assert durable(rest) == durable(whole)[cut:]


@contextlib.contextmanager
def warnings_ignored() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


async def test_multitask_enqueue_and_interrupt(
    sdk: LangGraphClient, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    tid = (await sdk.threads.create())["thread_id"]
    script = [{"toolCalls": [{"name": "sleep", "arguments": {"seconds": 2}}]}, {"text": "ok"}]
    first = await sdk.runs.create(
        tid, GRAPH, input={"messages": [{"role": "user", "content": "a"}]}, context=context(script)
    )
    # enqueue: the message steers the run in progress, which is the run it joins.
    steered = await sdk.runs.create(
        tid,
        GRAPH,
        input={"messages": [{"role": "user", "content": "b"}]},
        multitask_strategy="enqueue",
    )
    assert steered["run_id"] == first["run_id"]
    # interrupt: the run in progress is cancelled, a new one starts.
    values = await sdk.runs.wait(
        tid,
        GRAPH,
        input={"messages": [{"role": "user", "content": "c"}]},
        multitask_strategy="interrupt",
    )
    humans = [m["content"] for m in values["messages"] if m["type"] == "human"]
    assert humans == ["a", "b", "c"] and values["messages"][-1]["type"] == "ai"
    runs = await sdk.runs.list(tid)
    assert [r["status"] for r in runs] == ["success", "interrupted"]
    assert runs[1]["run_id"] == first["run_id"]
    with pytest.raises(httpx.HTTPStatusError) as rollback:
        await sdk.runs.create(
            tid,
            GRAPH,
            input={"messages": [{"role": "user", "content": "d"}]},
            multitask_strategy="rollback",
        )
    assert rollback.value.response.status_code == 501


async def test_the_guide_example_runs(
    protocol_api: ServerProcess, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    match = re.search(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert match, "no python block in docs/langgraph.md"
    env = {**os.environ, "FERRYMAN_URL": protocol_api.url}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", match.group(1)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "tool call: put_note",
        "tool call: ask_user",
        "asked: Anything else?",
        "streamed: Noting it.",
        "answer: Done.",
        "checkpoints: 8",
    ]


async def test_join_in_the_middle_of_a_turn(
    sdk: LangGraphClient, start_worker: StartWorker
) -> None:
    """The chunks a client missed while away are sent from the store, once each."""
    await ready(start_worker())
    tid = (await sdk.threads.create())["thread_id"]
    text = "one two three four five six seven eight nine ten eleven twelve"
    script = [{"text": text, "chunks": 12, "delayMs": 2400}]
    first: list[StreamPart] = []
    async for part in sdk.runs.stream(
        tid,
        GRAPH,
        input={"messages": [{"role": "user", "content": "count"}]},
        context=context(script),
        stream_mode=["messages-tuple"],
    ):
        first.append(part)
        if len([p for p in first if p.event == "messages"]) == 3:
            break  # the client goes away mid-turn
    run_id = first[0].data["run_id"]
    await asyncio.sleep(0.8)  # chunks stream meanwhile
    rest = await collect(
        sdk.runs.join_stream(
            tid, run_id, stream_mode=["messages-tuple"], last_event_id=first[-1].id
        )
    )
    assert rest[-1].event == "end"
    ids = [p.id for p in first + rest]
    assert len(set(ids)) == len(ids), ids
    assert list(streamed_texts(first + rest).values()) == [text]


async def test_a_run_of_a_stored_assistant(
    sdk: LangGraphClient, protocol_api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    async with httpx.AsyncClient(
        base_url=protocol_api.url, headers={"Authorization": f"Bearer {key}"}
    ) as http:
        made = await http.post("/api/assistants", json={"name": "echo", "model": "scripted"})
        assert made.status_code == 201, made.text
        assistant = made.json()
        tid = (await sdk.threads.create())["thread_id"]
        values = await sdk.runs.wait(
            tid, assistant["id"], input={"messages": [{"role": "user", "content": "hi"}]}
        )
        assert values["messages"][-1]["content"] == "You said: hi"
        session = (await http.get(f"/api/agent/{tid}")).json()
        assert session["assistant"] == {"id": assistant["id"], "version": 1}
    with pytest.raises(NotFoundError):
        await sdk.runs.create(
            tid, "no-such-assistant", input={"messages": [{"role": "user", "content": "x"}]}
        )


async def test_a_client_that_leaves_cancels_when_it_asked(
    sdk: LangGraphClient, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    tid = (await sdk.threads.create())["thread_id"]
    script = [{"toolCalls": [{"name": "sleep", "arguments": {"seconds": 60}}]}, {"text": "late"}]
    run_id = None
    async for part in sdk.runs.stream(
        tid,
        GRAPH,
        input={"messages": [{"role": "user", "content": "wait"}]},
        context=context(script),
        stream_mode=["events"],
        on_disconnect="cancel",
    ):
        run_id = run_id or part.data["run_id"]
        if part.event == "events" and part.data["event"] == "on_tool_start":
            break  # the client goes away
    assert run_id is not None
    for _ in range(200):
        if (await sdk.runs.get(tid, run_id))["status"] == "interrupted":
            break
        await asyncio.sleep(0.05)
    assert (await sdk.runs.get(tid, run_id))["status"] == "interrupted"


async def test_another_owners_thread_is_not_found(
    sdk: LangGraphClient, protocol_api: ServerProcess, isolated_db: str
) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    other = get_client(
        url=f"{protocol_api.url}/agent-protocol", api_key=create_owner_key(isolated_db)[1]
    )
    with pytest.raises(NotFoundError):
        await other.threads.get(tid)
    with pytest.raises(NotFoundError):
        await other.runs.list(tid)
    assert await other.threads.search() == []
    await other.http.client.aclose()
