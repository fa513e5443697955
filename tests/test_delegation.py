"""Agents that delegate (docs/delegation.md): real `ferryman worker` processes, the scripted
model (a child runs its assistant's script), a real API server. A delegate call makes exactly
one child session; the parent waits without a lease and resumes with the child's answer."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
import uuid
from typing import Any

import httpx
from hypothesis import given
from hypothesis import strategies as st

from app.agent.delegation import find_cycle, offers_delegates, tool_names
from tests.support import (
    TERMINAL,
    ServerProcess,
    StartWorker,
    assert_problem,
    client,
    create_owner_key,
    new_session,
    of_type,
    query,
    ready,
    transcript,
    wait_event,
    wait_for_status,
)
from tests.test_openapi import check


def sleep_then(text: str, seconds: float) -> list[dict[str, Any]]:
    return [{"toolCalls": [{"name": "sleep", "arguments": {"seconds": seconds}}]}, {"text": text}]


async def assistant(http: httpx.AsyncClient, name: str, **body: Any) -> str:
    response = await http.post("/api/assistants", json={"name": name, "model": "scripted", **body})
    assert response.status_code == 201, response.text
    aid: str = response.json()["id"]
    return aid


def call(tool: str, task: str) -> dict[str, Any]:
    return {"name": tool, "arguments": {"task": task}}


async def children(url: str, parent: str) -> list[dict[str, Any]]:
    return await query(
        url,
        "SELECT id, status, parent_tool_call_id, depth, deleted_at FROM sessions"
        " WHERE parent_session_id = %s ORDER BY created_at",
        (uuid.UUID(parent),),
    )


async def delegate_calls(http: httpx.AsyncClient, sid: str, n: int = 1) -> list[dict[str, Any]]:
    """The parent's delegate calls, once `n` are logged."""
    deadline = time.monotonic() + 20
    while len(calls := of_type(await transcript(http, sid), "delegate_call")) < n:
        assert time.monotonic() < deadline, f"{sid} made fewer than {n} delegate calls"
        await asyncio.sleep(0.05)
    return [c["data"] for c in calls]


async def test_two_delegates_run_in_parallel_and_the_parent_resumes_with_both(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    async with client(api.url, key) as http:
        researcher = await assistant(http, "Researcher", script=sleep_then("found A", 1.5))
        writer = await assistant(http, "Writer", script=sleep_then("wrote B", 1.5))
        script = [
            {"toolCalls": [call("agent__researcher", "look"), call("agent__writer", "write")]},
            {"text": "both done"},
        ]
        sid = await new_session(http, script=script, delegates=[researcher, writer])
        calls = await delegate_calls(http, sid, 2)
        waiting = await wait_for_status(http, sid, {"waiting"})
        assert waiting["lease"] is None  # no worker slot held while the children run
        assert waiting["delegates"] == [researcher, writer]
        done = await wait_for_status(http, sid, TERMINAL)
        events = await transcript(http, sid)
        kids = [(await http.get(f"/api/agent/{c['childSessionId']}")).json() for c in calls]
        child_logs = [await transcript(http, c["childSessionId"]) for c in calls]
        # The new events and fields fit docs/openapi.json.
        for session_id in (sid, *(c["childSessionId"] for c in calls)):
            check(await http.get(f"/api/agent/{session_id}"))
            check(await http.get(f"/api/agent/{session_id}/transcript"))
        check(await http.get(f"/api/assistants/{researcher}"))
    assert done["status"] == "succeeded"
    assert [c["name"] for c in calls] == ["agent__researcher", "agent__writer"]
    results = {r["data"]["toolCallId"]: r["data"] for r in of_type(events, "tool_result")}
    assert [results[c["toolCallId"]]["content"] for c in calls] == ["found A", "wrote B"]
    assert not any(r["isError"] for r in results.values())
    assert of_type(events, "assistant_message")[-1]["data"]["text"] == "both done"
    for kid, made_by, task in zip(kids, calls, ["look", "write"], strict=True):
        assert kid["parent"] == {"sessionId": sid, "toolCallId": made_by["toolCallId"]}
        assert kid["status"] == "succeeded" and kid["prompt"] == task
        assert kid["assistant"]["id"] == made_by["assistantId"]
    # In parallel: each child started before the other ended.
    starts = [of_type(log, "session_start")[0]["ts"] for log in child_logs]
    ends = [of_type(log, "session_end")[-1]["ts"] for log in child_logs]
    assert starts[0] < ends[1] and starts[1] < ends[0]
    # The owner stream announced each child with its parent.
    created = await query(
        isolated_db,
        "SELECT data FROM owner_events WHERE type = 'session_created' AND session_id = ANY(%s)",
        ([uuid.UUID(c["childSessionId"]) for c in calls],),
    )
    assert sorted(c["data"]["session"]["parent"]["sessionId"] for c in created) == [sid, sid]
    assert len(await children(isolated_db, sid)) == 2


async def test_a_failed_child_is_an_error_result_and_a_question_waits_on_the_parent(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    ask = {"name": "ask_user", "arguments": {"question": "which one?"}}
    async with client(api.url, key) as http:
        asker = await assistant(http, "Asker", script=[{"toolCalls": [ask]}, {"text": "the red"}])
        broken = await assistant(http, "Broken", model="openai:nowhere")
        script = [
            {"toolCalls": [call("agent__asker", "pick"), call("agent__broken", "fail")]},
            {"text": "ok"},
        ]
        sid = await new_session(http, script=script, delegates=[asker, broken])
        calls = await delegate_calls(http, sid, 2)
        asking = calls[0]["childSessionId"]
        await wait_for_status(http, asking, {"waiting"})
        # The parent waits too: once its run has ended (its write may follow the child's
        # question) and, after the broken child's failure re-queued it, ended again.
        await wait_for_status(http, sid, {"waiting"})
        await http.post(f"/api/agent/{asking}/messages", json={"text": "red"})
        done = await wait_for_status(http, sid, TERMINAL)
        events = await transcript(http, sid)
    assert done["status"] == "succeeded"
    results = {r["data"]["toolCallId"]: r["data"] for r in of_type(events, "tool_result")}
    assert results[calls[0]["toolCallId"]]["content"] == "the red"
    failed = results[calls[1]["toolCallId"]]
    assert failed["isError"] is True and failed["content"].startswith(
        "the delegated session failed"
    )


async def test_a_worker_killed_while_the_child_runs_makes_no_second_child(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    victim = start_worker()
    await ready(victim)
    async with client(api.url, key) as http:
        slow = await assistant(http, "Slow", script=sleep_then("slept", 2))
        script = [{"toolCalls": [call("agent__slow", "nap")]}, {"text": "after"}]
        sid = await new_session(http, script=script, delegates=[slow])
        (made,) = await delegate_calls(http, sid)
        child = made["childSessionId"]
        await wait_event(http, child, lambda e: e["type"] == "tool_call_start")
        await wait_for_status(http, sid, {"waiting"})  # its run's end may follow the child's start
        victim.signal(signal.SIGKILL)
        await ready(start_worker())
        done = await wait_for_status(http, sid, TERMINAL, timeout=40)
        events = await transcript(http, sid)
        child_events = await transcript(http, child)
    assert done["status"] == "succeeded"
    assert of_type(child_events, "session_resumed")[0]["data"]["reason"] == "crash"
    (result,) = of_type(events, "tool_result")
    assert result["data"]["content"] == "slept"
    assert [str(c["id"]) for c in await children(isolated_db, sid)] == [child]


async def test_a_child_failed_by_its_claim_answers_the_parent(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    """A child settled by a claim (MAX_ATTEMPTS_EXCEEDED after a crash), not by a run of its
    own, answers its parent too: every end goes through `settling.finish`."""
    env = {"FERRYMAN_MAX_ATTEMPTS": "1"}
    victim = start_worker(env=env)
    await ready(victim)
    async with client(api.url, key) as http:
        slow = await assistant(http, "Crashy", script=sleep_then("never", 30))
        script = [{"toolCalls": [call("agent__crashy", "x")]}, {"text": "went on"}]
        sid = await new_session(http, script=script, delegates=[slow])
        (made,) = await delegate_calls(http, sid)
        await wait_event(http, made["childSessionId"], lambda e: e["type"] == "tool_call_start")
        victim.signal(signal.SIGKILL)
        await ready(start_worker(env=env))
        child = await wait_for_status(http, made["childSessionId"], TERMINAL)
        done = await wait_for_status(http, sid, TERMINAL)
        events = await transcript(http, sid)
    assert child["error"]["code"] == "MAX_ATTEMPTS_EXCEEDED"
    assert done["status"] == "succeeded"
    (result,) = of_type(events, "tool_result")
    assert result["data"]["isError"] is True
    assert "MAX_ATTEMPTS_EXCEEDED" in result["data"]["content"]


async def test_a_parent_killed_after_delegating_resumes_without_a_second_child(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    """The delegate call and its child commit together; the parent is killed while a tool of
    the same turn runs. The resumed parent waits on that child (the call is not repaired); the
    scripted model's replay of the turn is a new call with a new id, so a child of its own."""
    victim = start_worker()
    await ready(victim)
    async with client(api.url, key) as http:
        quick = await assistant(http, "Quick", script=[{"text": "quick answer"}])
        turn = {
            "toolCalls": [
                call("agent__quick", "q"),
                {"name": "sleep", "arguments": {"seconds": 30}},
            ]
        }
        sid = await new_session(http, script=[turn, {"text": "end"}], delegates=[quick])
        (first,) = await delegate_calls(http, sid)
        await wait_event(http, sid, lambda e: e["type"] == "tool_call_start")
        victim.signal(signal.SIGKILL)
        await ready(start_worker())
        await wait_event(
            http, sid, lambda e: e["type"] == "session_resumed" and e["data"]["reason"] == "crash"
        )
        resumed = of_type(await transcript(http, sid), "session_resumed")[0]["data"]
        assert first["toolCallId"] not in resumed["repairedToolCalls"]
        await http.post(f"/api/agent/{sid}/cancel")  # the replayed sleep would take 30 s
        events = await transcript(http, sid)
    kids = await children(isolated_db, sid)
    assert [k["parent_tool_call_id"] for k in kids].count(first["toolCallId"]) == 1
    results = {r["data"]["toolCallId"]: r["data"] for r in of_type(events, "tool_result")}
    assert results[first["toolCallId"]]["content"] == "quick answer"


async def test_cancel_and_delete_reach_the_children(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    async with client(api.url, key) as http:
        slow = await assistant(http, "Sleeper", script=sleep_then("never", 60))

        async def with_a_running_child() -> tuple[str, dict[str, Any]]:
            script = [{"toolCalls": [call("agent__sleeper", "wait")]}]
            sid = await new_session(http, script=script, delegates=[slow])
            (made,) = await delegate_calls(http, sid)
            await wait_event(http, made["childSessionId"], lambda e: e["type"] == "tool_call_start")
            return sid, made

        cancelled, made = await with_a_running_child()
        answer = await http.post(f"/api/agent/{cancelled}/cancel")
        assert answer.status_code == 202, answer.text
        assert (await wait_for_status(http, cancelled, TERMINAL))["status"] == "cancelled"
        child = await wait_for_status(http, made["childSessionId"], TERMINAL)
        assert child["status"] == "cancelled"

        deleted, made = await with_a_running_child()
        assert (await http.delete(f"/api/agent/{deleted}")).status_code == 204
        gone = await http.get(f"/api/agent/{made['childSessionId']}")
        assert_problem(gone, 404, "SESSION_NOT_FOUND")
    (kid,) = await children(isolated_db, deleted)
    assert kid["deleted_at"] is not None


async def test_cycles_and_unknown_delegates_are_refused(
    api: ServerProcess, isolated_db: str, key: str
) -> None:
    async with client(api.url, key) as http:
        a = await assistant(http, "A")
        b = await assistant(http, "B", delegates=[a])
        cycle = await http.patch(f"/api/assistants/{a}", json={"delegates": [b]})
        body = assert_problem(cycle, 422, "DELEGATE_CYCLE")
        assert body["cycle"] == [a, b, a]
        own = await http.patch(f"/api/assistants/{a}", json={"delegates": [a]})
        assert_problem(own, 422, "DELEGATE_CYCLE")
        from_a = await http.post(
            "/api/agent", json={"prompt": "x", "assistantId": a, "delegates": [b]}
        )
        assert_problem(from_a, 422, "DELEGATE_CYCLE")
        unknown = str(uuid.uuid4())
        missing = await http.post("/api/agent", json={"prompt": "x", "delegates": [unknown]})
        assert unknown in assert_problem(missing, 422, "VALIDATION_ERROR")["detail"]
        async with client(api.url, create_owner_key(isolated_db)[1]) as other:
            foreign = await other.post("/api/agent", json={"prompt": "x", "delegates": [a]})
            assert_problem(foreign, 422, "VALIDATION_ERROR")
        fine = await http.post("/api/agent", json={"prompt": "x", "delegates": [b]})
        assert fine.status_code == 201, fine.text


async def test_a_child_at_the_depth_limit_is_offered_no_delegates(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker(env={"FERRYMAN_MAX_AGENT_DEPTH": "1"}))
    async with client(api.url, key) as http:
        leaf = await assistant(http, "Leaf")
        middle = await assistant(
            http,
            "Middle",
            delegates=[leaf],
            script=[{"toolCalls": [call("agent__leaf", "deeper")]}, {"text": "stopped"}],
        )
        script = [{"toolCalls": [call("agent__middle", "go")]}, {"text": "top"}]
        sid = await new_session(http, script=script, delegates=[middle])
        (made,) = await delegate_calls(http, sid)
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
        child_events = await transcript(http, made["childSessionId"])
    (refused,) = of_type(child_events, "tool_result")
    assert refused["data"]["isError"] is True and "unknown tool" in refused["data"]["content"]
    (kid,) = await children(isolated_db, sid)
    assert kid["depth"] == 1
    assert await children(isolated_db, made["childSessionId"]) == []


async def test_a_call_without_a_task_makes_no_child(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    async with client(api.url, key) as http:
        helper = await assistant(http, "Helper")
        script = [{"toolCalls": [call("agent__helper", "")]}, {"text": "fine"}]
        sid = await new_session(http, script=script, delegates=[helper])
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
        events = await transcript(http, sid)
    (refused,) = of_type(events, "tool_result")
    assert refused["data"]["isError"] is True
    assert refused["data"]["content"].startswith("invalid arguments")
    assert of_type(events, "delegate_call") == []
    assert await children(isolated_db, sid) == []


# --- the pure parts ---------------------------------------------------------------------------

graphs = st.dictionaries(st.integers(0, 7), st.lists(st.integers(0, 7), max_size=4), max_size=8)


def _reachable(graph: dict[int, list[int]], start: int) -> set[int]:
    seen: set[int] = set()
    todo = list(graph.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return seen


@given(graphs, st.integers(0, 7))
def test_a_cycle_is_found_exactly_when_one_is_reachable(
    graph: dict[int, list[int]], root: int
) -> None:
    found = find_cycle(graph, root)
    loops = any(node in _reachable(graph, node) for node in _reachable(graph, root) | {root})
    assert (found is not None) == loops
    if found is not None:
        assert found[0] == root and found[-1] in found[:-1]
        assert all(b in graph[a] for a, b in itertools.pairwise(found))


@given(st.integers(0, 10), st.integers(0, 10))
def test_only_sessions_above_the_depth_limit_delegate(depth: int, limit: int) -> None:
    assert offers_delegates(depth, limit) == (depth < limit)


@given(st.lists(st.text(max_size=80), max_size=8))
def test_tool_names_are_unique_and_valid(names: list[str]) -> None:
    tools = tool_names(names)
    assert len(set(tools)) == len(tools) == len(names)
    assert all(t.startswith("agent__") and len(t) <= 64 for t in tools)
    assert all(c.isascii() and (c.isalnum() or c == "_") for t in tools for c in t)
