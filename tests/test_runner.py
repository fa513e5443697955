"""The runner end to end: real `ferryman worker` processes against a real PostgreSQL.

The module runs its workers on a database of its own (`isolated_db`, see tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from datetime import datetime
from typing import Any

import httpx
import pytest

from app.agent.tools import Tool, ToolContext, ToolRegistry, default_registry
from app.agent.tools.builtin import BUILTIN_TOOLS
from tests.support import (
    TERMINAL,
    ServerProcess,
    StartWorker,
    WorkerProcess,
    assert_contiguous,
    client,
    first_delta,
    live_workers,
    new_session,
    of_type,
    query,
    ready,
    transcript,
    wait_event,
    wait_for_status,
)
from tests.tools import TOOLS_ENV

# --- many sessions, several workers ---------------------------------------------------------


SESSIONS = 200


async def test_many_sessions_three_workers_each_run_once(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    workers = [start_worker(concurrency=12) for _ in range(3)]
    await ready(*workers)
    async with client(api.url, key) as http:
        gate = asyncio.Semaphore(25)

        async def one(index: int) -> str:
            script = [
                {
                    "text": f"saving {index}",
                    "toolCalls": [
                        {"name": "put_note", "arguments": {"key": f"k{index}", "text": f"v{index}"}}
                    ],
                },
                {"text": f"done {index}"},
            ]
            async with gate:
                return await new_session(http, f"prompt {index}", script=script)

        session_ids = await asyncio.gather(*(one(i) for i in range(SESSIONS)))
        deadline = time.monotonic() + 60
        while True:
            rows = await query(
                isolated_db,
                "SELECT count(*) AS n FROM sessions WHERE id = ANY(%s) AND status IN"
                " ('succeeded', 'failed', 'cancelled')",
                ([uuid.UUID(s) for s in session_ids],),
            )
            if rows[0]["n"] == SESSIONS:
                break
            assert time.monotonic() < deadline, f"only {rows[0]['n']} of {SESSIONS} finished"
            await asyncio.sleep(0.2)

    ids = [uuid.UUID(s) for s in session_ids]
    sessions = {
        r["id"]: r
        for r in await query(
            isolated_db,
            "SELECT id, owner_id, status, attempt, last_seq, lease_worker_id FROM sessions"
            " WHERE id = ANY(%s)",
            (ids,),
        )
    }
    events: dict[uuid.UUID, list[dict[str, Any]]] = {i: [] for i in ids}
    for row in await query(
        isolated_db,
        "SELECT session_id, seq, attempt, type, data FROM session_events"
        " WHERE session_id = ANY(%s) ORDER BY session_id, seq",
        (ids,),
    ):
        events[row["session_id"]].append(row)
    notes = await query(
        isolated_db,
        "SELECT session_id, key, text, attempt FROM notes WHERE session_id = ANY(%s)",
        (ids,),
    )
    statuses = await query(
        isolated_db,
        "SELECT session_id, data FROM owner_events WHERE owner_id = %s AND type = 'session_status'",
        (sessions[ids[0]]["owner_id"],),
    )
    assert len({s["owner_id"] for s in sessions.values()}) == 1

    run_workers: set[str] = set()
    for index, session_id in enumerate(ids):
        session = sessions[session_id]
        log = events[session_id]
        assert session["status"] == "succeeded", (session, log)
        assert session["attempt"] == 1, (session, log)
        assert session["lease_worker_id"] is None
        assert_contiguous(log)
        assert session["last_seq"] == len(log)
        types = [e["type"] for e in log]
        assert types == [
            "user_message",
            "session_start",
            "assistant_message",
            "tool_call_start",
            "tool_result",
            "assistant_message",
            "session_end",
        ], types
        assert {e["attempt"] for e in log[1:]} == {1}, log
        assert log[-1]["data"]["status"] == "succeeded"
        assert log[4]["data"]["isError"] is False
        assert log[5]["data"]["text"] == f"done {index}"
        run_workers.add(log[1]["data"]["workerId"])

    by_session: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for note in notes:
        by_session.setdefault(note["session_id"], []).append(note)
    for index, session_id in enumerate(ids):
        assert [(n["key"], n["text"], n["attempt"]) for n in by_session[session_id]] == [
            (f"k{index}", f"v{index}", 1)
        ]

    succeeded = Counter(r["session_id"] for r in statuses if r["data"]["status"] == "succeeded")
    running = Counter(r["session_id"] for r in statuses if r["data"]["status"] == "running")
    for session_id in ids:
        assert succeeded[session_id] == 1
        assert running[session_id] == 1
    # The three workers shared the load.
    assert len(run_workers) >= 2, run_workers


# --- tools ------------------------------------------------------------------------------


async def test_tool_timeouts_and_raising_tools(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    # Runs before `shared_worker` exists: a plain worker would not know these tools.
    assert await live_workers(isolated_db) == []
    await ready(start_worker({**TOOLS_ENV, "FERRYMAN_TOOL_TIMEOUT": "0.5"}))
    async with client(api.url, key) as http:
        script = [
            {
                "text": "tools",
                "toolCalls": [
                    {"name": "slow", "arguments": {"seconds": 5}},
                    {"name": "quick", "arguments": {"seconds": 2}},
                    {"name": "slow", "arguments": {"seconds": 0.05}},
                    {"name": "sleep", "arguments": {"seconds": 0.7}},
                    {"name": "explode", "arguments": {"message": "kaboom"}},
                    {"name": "refuse", "arguments": {}},
                ],
            },
            {"text": "went on"},
        ]
        sid = await new_session(http, script=script)
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
        events = await transcript(http, sid)
    results = [r["data"] for r in of_type(events, "tool_result")]
    slow_timeout, quick_timeout, slow_ok, sleep_ok, boom, refuse = results
    # FERRYMAN_TOOL_TIMEOUT is the budget of tools that declare none.
    assert slow_timeout["isError"] is True and slow_timeout["timedOut"] is True
    assert "0.5 s" in slow_timeout["content"]
    # A tool's own timeout overrides the default, shorter ...
    assert quick_timeout["isError"] is True and quick_timeout["timedOut"] is True
    assert "0.3 s" in quick_timeout["content"]
    assert slow_ok == {**slow_ok, "isError": False, "content": "slow finished"}
    assert "timedOut" not in slow_ok
    # ... or longer: `sleep` declares its own (up to an hour), so 0.7 s runs to the end.
    assert sleep_ok["isError"] is False and "timedOut" not in sleep_ok
    assert boom["isError"] is True and "kaboom" in boom["content"]
    assert "timedOut" not in boom and "interrupted" not in boom
    assert refuse["isError"] is True and "not today" in refuse["content"]
    assert of_type(events, "assistant_message")[-1]["data"]["text"] == "went on"
    # The 5 s call was given up after its budget, not waited for.
    start, end = (
        datetime.fromisoformat(e["ts"])
        for e in events
        if e["type"] in ("tool_call_start", "tool_result")
        and e["data"]["toolCallId"] == slow_timeout["toolCallId"]
    )
    assert (end - start).total_seconds() < 3.0
    assert of_type(events, "session_end")[-1]["data"]["status"] == "succeeded"


async def test_unknown_tool_and_invalid_arguments_are_error_results(
    api: ServerProcess, key: str, shared_worker: WorkerProcess
) -> None:
    await ready(shared_worker)
    async with client(api.url, key) as http:
        script = [
            {
                "text": "trying",
                "toolCalls": [
                    {"name": "no_such_tool", "arguments": {}},
                    {"name": "sleep", "arguments": {"seconds": "x"}},
                    {"name": "put_note", "arguments": {"text": "no key"}},
                    {"name": "get_note", "arguments": {"key": "missing"}},
                    {"name": "put_note", "arguments": {"key": "k", "text": "v"}},
                ],
            },
            {"text": "carried on"},
        ]
        sid = await new_session(http, script=script)
        # A tool the session did not enable is unknown to it.
        restricted = await new_session(
            http,
            script=[
                {"toolCalls": [{"name": "put_note", "arguments": {"key": "k", "text": "v"}}]},
                {"text": "ok"},
            ],
            tools=["get_note"],
        )
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
        assert (await wait_for_status(http, restricted, TERMINAL))["status"] == "succeeded"
        events = await transcript(http, sid)
        results = of_type(events, "tool_result")
        assert [r["data"]["name"] for r in results] == [
            "no_such_tool",
            "sleep",
            "put_note",
            "get_note",
            "put_note",
        ]
        unknown, bad_type, missing, get_missing, put = (r["data"] for r in results)
        assert unknown["isError"] is True and "unknown tool" in unknown["content"]
        assert bad_type["isError"] is True and "invalid arguments" in bad_type["content"]
        assert "seconds" in bad_type["content"]
        assert missing["isError"] is True and "invalid arguments" in missing["content"]
        assert "key" in missing["content"]
        assert get_missing["isError"] is False
        assert json.loads(get_missing["content"]) == {
            "key": "missing",
            "found": False,
            "text": None,
        }
        assert put["isError"] is False
        # Each result answers its own call, in order, and the session went on.
        calls = of_type(events, "assistant_message")[0]["data"]["toolCalls"]
        assert [r["data"]["toolCallId"] for r in results] == [c["id"] for c in calls]
        assert of_type(events, "assistant_message")[-1]["data"]["text"] == "carried on"

        restricted_results = of_type(await transcript(http, restricted), "tool_result")
        assert len(restricted_results) == 1
        assert restricted_results[0]["data"]["isError"] is True
        assert "unknown tool" in restricted_results[0]["data"]["content"]


async def test_a_note_commits_with_the_result_of_the_call_that_put_it(
    api: ServerProcess, isolated_db: str, key: str, shared_worker: WorkerProcess
) -> None:
    """A note is written with the result of the tool call that put it, in one transaction (a
    crash between the two can leave neither, never one), and later calls read it back."""
    await ready(shared_worker)
    put = {"name": "put_note", "arguments": {"key": "k", "text": "one"}}
    script = [
        {
            "toolCalls": [
                put,
                {"name": "get_note", "arguments": {"key": "k"}},
                {"name": "put_note", "arguments": {"key": "k", "text": "two"}},
            ]
        },
        {"toolCalls": [{"name": "get_note", "arguments": {"key": "k"}}]},
        {"text": "done"},
    ]
    async with client(api.url, key) as http:
        sid = await new_session(http, script=script)
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
        results = [r["data"] for r in of_type(await transcript(http, sid), "tool_result")]
    assert [json.loads(r["content"])["text"] for r in results if r["name"] == "get_note"] == [
        "one",
        "two",
    ]
    rows = await query(
        isolated_db,
        "SELECT xmin::text AS tx FROM session_events WHERE session_id = %s"
        " AND type = 'tool_result' AND data->>'name' = 'put_note' ORDER BY seq",
        (uuid.UUID(sid),),
    )
    notes = await query(
        isolated_db,
        "SELECT text, xmin::text AS tx FROM notes WHERE session_id = %s",
        (uuid.UUID(sid),),
    )
    assert notes == [{"text": "two", "tx": rows[-1]["tx"]}]


# --- waiting, follow-ups, steering --------------------------------------------------------


async def test_ask_user_waits_and_a_reply_continues(
    api: ServerProcess, key: str, shared_worker: WorkerProcess
) -> None:
    await ready(shared_worker)
    async with client(api.url, key) as http:
        question = {"question": "Red or blue?", "options": ["red", "blue"]}
        sid = await new_session(
            http,
            script=[
                {"text": "let me ask", "toolCalls": [{"name": "ask_user", "arguments": question}]},
                {"text": "thanks for answering"},
            ],
        )
        waiting = await wait_for_status(http, sid, {"waiting", *TERMINAL})
        assert waiting["status"] == "waiting"
        assert waiting["lease"] is None
        events = await transcript(http, sid)
        assert of_type(events, "user_question")[0]["data"] == question
        assert of_type(events, "session_end")[-1]["data"]["status"] == "waiting"
        asked = of_type(events, "tool_result")[0]["data"]
        assert asked["name"] == "ask_user" and asked["isError"] is False

        reply = await http.post(f"/api/agent/{sid}/messages", json={"text": "blue"})
        assert reply.status_code == 202, reply.text
        assert reply.json()["message"]["delivery"] == "queued"
        done = await wait_for_status(http, sid, TERMINAL)
        assert done["status"] == "succeeded"
        assert done["attempt"] == 2
        events = await transcript(http, sid)
        assert_contiguous(events)
        resumed = of_type(events, "session_resumed")
        assert len(resumed) == 1
        assert resumed[0]["data"]["reason"] == "follow_up"
        assert resumed[0]["data"]["repairedToolCalls"] == []
        assert resumed[0]["attempt"] == 2
        answers = of_type(events, "assistant_message")
        assert [a["data"]["text"] for a in answers] == ["let me ask", "thanks for answering"]
        assert answers[-1]["attempt"] == 2
        # The question was asked once: the follow-up did not replay the first turn.
        assert len(of_type(events, "user_question")) == 1
        assert [e["data"]["status"] for e in of_type(events, "session_end")] == [
            "waiting",
            "succeeded",
        ]


async def test_output_limit_waits_and_a_reply_continues(
    api: ServerProcess, key: str, shared_worker: WorkerProcess
) -> None:
    await ready(shared_worker)
    async with client(api.url, key) as http:
        sid = await new_session(
            http,
            script=[
                {"text": "a long answer that got cut", "stopReason": "length"},
                {"text": "rest"},
            ],
        )
        waiting = await wait_for_status(http, sid, {"waiting", *TERMINAL})
        assert waiting["status"] == "waiting"
        events = await transcript(http, sid)
        assert of_type(events, "assistant_message")[0]["data"]["stopReason"] == "length"
        end = of_type(events, "session_end")[0]["data"]
        assert end["status"] == "waiting" and end.get("note")

        reply = await http.post(f"/api/agent/{sid}/messages", json={"text": "go on"})
        assert reply.json()["message"]["delivery"] == "queued"
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
        events = await transcript(http, sid)
        assert [a["data"]["text"] for a in of_type(events, "assistant_message")] == [
            "a long answer that got cut",
            "rest",
        ]
        assert of_type(events, "session_resumed")[0]["data"]["reason"] == "follow_up"


async def test_steering_a_running_session(
    api: ServerProcess, key: str, shared_worker: WorkerProcess
) -> None:
    await ready(shared_worker)
    async with client(api.url, key) as http:
        # The script runs out after the sleep: the next turn echoes the last user message. The
        # sleep outlasts the steer's request on a loaded machine (taken after the run's last
        # turn, a message queues a second run instead).
        sid = await new_session(
            http,
            "original prompt",
            script=[
                {"text": "napping", "toolCalls": [{"name": "sleep", "arguments": {"seconds": 3}}]}
            ],
        )
        await wait_event(http, sid, lambda e: e["type"] == "tool_call_start")
        steer = await http.post(f"/api/agent/{sid}/messages", json={"text": "change of plan"})
        assert steer.status_code == 202
        assert steer.json()["message"]["delivery"] == "steer"
        done = await wait_for_status(http, sid, TERMINAL)
        assert done["status"] == "succeeded"
        # Delivered within the run: no second run was needed.
        assert done["attempt"] == 1
        events = await transcript(http, sid)
        answers = of_type(events, "assistant_message")
        assert answers[-1]["data"]["text"] == "You said: change of plan"
        assert not of_type(events, "session_resumed")
        assert len(of_type(events, "session_end")) == 1
        # The steer is logged before the turn that answers it.
        steer_seq = steer.json()["message"]["seq"]
        assert of_type(events, "user_message")[-1]["seq"] == steer_seq < answers[-1]["seq"]


async def test_message_during_the_last_turn_is_answered_in_the_same_run(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    """A steer that arrives while the final answer streams is not lost, and the run does not
    end without it: the model answers it in the same run. The log never says the session
    ended before it really did."""
    await ready(start_worker())
    async with client(api.url, key) as http:
        sid = await new_session(
            http, script=[{"text": "slow final answer", "chunks": 4, "delayMs": 1200}]
        )
        await first_delta(http, sid)  # the final answer is streaming: land the steer in it
        steer = await http.post(f"/api/agent/{sid}/messages", json={"text": "one more thing"})
        assert steer.json()["message"]["delivery"] == "steer"
        session = await wait_for_status(http, sid, TERMINAL)
        assert session["status"] == "succeeded"
        assert session["attempt"] == 1
        events = await transcript(http, sid)
        assert [(e["type"], e["data"].get("text")) for e in events] == [
            ("user_message", "hello"),
            ("session_start", None),
            ("user_message", "one more thing"),
            ("assistant_message", "slow final answer"),
            ("assistant_message", "You said: one more thing"),
            ("session_end", None),
        ]


async def test_message_during_a_failing_turn_requeues_after_the_failure(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    """A turn that fails does not take a steer with it: the run ends `failed` (announced as
    such), then the undelivered message re-queues the session and a new run answers it."""
    await ready(start_worker())
    async with client(api.url, key) as http:
        script = [{"text": "provider down", "stopReason": "error", "chunks": 4, "delayMs": 1200}]
        sid = await new_session(http, script=script)
        await first_delta(http, sid)  # the failing turn is streaming: land the steer in it
        steer = await http.post(f"/api/agent/{sid}/messages", json={"text": "try again"})
        assert steer.json()["message"]["delivery"] == "steer"
        deadline = time.monotonic() + 20
        while (session := (await http.get(f"/api/agent/{sid}")).json())["attempt"] < 2 or (
            session["status"] not in TERMINAL
        ):
            assert time.monotonic() < deadline, session
            await asyncio.sleep(0.05)
        assert session["status"] == "succeeded"
        events = await transcript(http, sid)
        ends = [e["data"]["status"] for e in of_type(events, "session_end")]
        assert ends == ["failed", "succeeded"]
        assert of_type(events, "assistant_message")[-1]["data"]["text"] == "You said: try again"
        statuses = await query(
            isolated_db,
            "SELECT data->>'status' AS status FROM owner_events"
            " WHERE session_id = %s AND type = 'session_status' ORDER BY id",
            (uuid.UUID(sid),),
        )
        assert [r["status"] for r in statuses] == [
            "running",
            "failed",
            "queued",
            "running",
            "succeeded",
        ]


async def test_default_echo_without_script(
    api: ServerProcess, key: str, shared_worker: WorkerProcess
) -> None:
    await ready(shared_worker)
    async with client(api.url, key) as http:
        sid = await new_session(http, "hello there, worker")
        done = await wait_for_status(http, sid, TERMINAL)
        assert done["status"] == "succeeded"
        assert done["error"] is None
        events = await transcript(http, sid)
        assert [e["type"] for e in events] == [
            "user_message",
            "session_start",
            "assistant_message",
            "session_end",
        ]
        answer = events[2]["data"]
        assert answer == {
            "text": "You said: hello there, worker",
            "toolCalls": [],
            "stopReason": "stop",
        }
        start = events[1]["data"]
        assert start["attempt"] == 1 and isinstance(start["pid"], int) and start["workerId"]


# --- live deltas ----------------------------------------------------------------------------


async def read_frames(response: httpx.Response) -> Any:
    """Raw SSE frames: dicts of their fields (`id`, `event`, `data`), comments skipped."""
    buffer = ""
    async for chunk in response.aiter_text():
        buffer += chunk.replace("\r\n", "\n")
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            frame: dict[str, str] = {}
            for line in block.split("\n"):
                if not line or line.startswith(":"):
                    continue
                name, _, value = line.partition(":")
                frame[name] = value[1:] if value.startswith(" ") else value
            if "data" in frame or "id" in frame:
                yield frame


async def test_message_deltas_stream_live_with_chunk_ids(
    api: ServerProcess, key: str, shared_worker: WorkerProcess
) -> None:
    await ready(shared_worker)
    text = "The quick brown fox jumps over the lazy dog"
    async with client(api.url, key) as http:
        # The first turn asks; the answer to the follow-up streams while we watch live.
        ask = {"name": "ask_user", "arguments": {"question": "ready?"}}
        sid = await new_session(
            http, script=[{"toolCalls": [ask]}, {"text": text, "chunks": 8, "delayMs": 1600}]
        )
        await wait_for_status(http, sid, {"waiting"})
        frames: list[dict[str, str]] = []
        async with asyncio.timeout(30), http.stream("GET", f"/api/agent/{sid}/events") as response:
            assert response.status_code == 200
            async for frame in read_frames(response):
                frames.append(frame)
                if frame.get("event") == "caught_up":
                    reply = await http.post(f"/api/agent/{sid}/messages", json={"text": "go"})
                    assert reply.status_code == 202
                elif frame.get("event") == "session_end" and '"succeeded"' in frame["data"]:
                    break
    deltas = [f for f in frames if f.get("event") == "message_delta"]
    assert len(deltas) >= 2, frames
    for number, delta in enumerate(deltas, 1):
        envelope = json.loads(delta["data"])
        # `<afterSeq>.<chunk>`: a reconnect from it gets the chunks after this one.
        assert delta["id"] == f"{envelope['afterSeq']}.{number}"
        assert envelope["chunk"] == number
        assert envelope["type"] == "message_delta"
        assert envelope["sessionId"] == sid
        assert envelope["phase"] == "live"
    assert "".join(json.loads(d["data"])["data"]["text"] for d in deltas) == text
    # Deltas come before the durable message that carries the whole text.
    answer = next(
        i
        for i, f in enumerate(frames)
        if f.get("event") == "assistant_message" and json.loads(f["data"])["data"]["text"] == text
    )
    assert max(i for i, f in enumerate(frames) if f.get("event") == "message_delta") < answer
    durable = [int(f["id"]) for f in frames if "id" in f and "." not in f["id"]]
    assert durable == list(range(1, len(durable) + 1))


# --- the tool registry, in process ----------------------------------------------------------


async def _noop(arguments: dict[str, Any], context: ToolContext) -> str:
    return "ok"


def test_tool_registry() -> None:
    echo = Tool(
        name="echo",
        description="Echo.",
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string"}, "times": {"type": "integer", "minimum": 1}},
            "required": ["text"],
            "additionalProperties": False,
        },
        run=_noop,
        idempotent=True,
        timeout=3,
    )
    registry = ToolRegistry(BUILTIN_TOOLS)
    assert registry.names() == ["ask_user", "get_note", "put_note", "sleep"]
    registry.register(echo)
    assert registry.get("echo") is echo
    assert registry.get("nope") is None
    with pytest.raises(ValueError, match="echo"):
        registry.register(echo)
    with pytest.raises(ValueError, match="sleep"):
        registry.register(BUILTIN_TOOLS[0])

    # select: all by default (sorted), the named ones in the asked order, unknown names ignored.
    assert [t.name for t in registry.select(None)] == [
        "ask_user",
        "echo",
        "get_note",
        "put_note",
        "sleep",
    ]
    assert [t.name for t in registry.select(["sleep", "ghost", "echo"])] == ["sleep", "echo"]
    assert registry.select([]) == []

    assert echo.argument_errors({"text": "hi"}) == []
    assert echo.argument_errors({"text": "hi", "times": 2}) == []
    missing = echo.argument_errors({})
    assert len(missing) == 1 and "text" in missing[0]
    wrong = echo.argument_errors({"text": 1, "times": 0, "extra": True})
    assert len(wrong) == 3
    assert any(p.startswith("text:") for p in wrong)
    assert any(p.startswith("times:") for p in wrong)
    assert any("extra" in p for p in wrong)

    sleep = registry.get("sleep")
    assert sleep is not None and sleep.idempotent
    assert sleep.argument_errors({"seconds": 3601})
    assert sleep.argument_errors({"seconds": -1})
    assert sleep.argument_errors({"seconds": 1}) == []
    spec = echo.spec()
    assert (spec.name, spec.parameters["required"]) == ("echo", ["text"])

    # A schema that is not valid JSON Schema is refused at registration time.
    from jsonschema.exceptions import SchemaError

    with pytest.raises(SchemaError):
        Tool(name="bad", description="", parameters={"type": "nonsense"}, run=_noop)


def test_default_registry_has_builtins_and_ends_turn_only_for_ask_user() -> None:
    registry = default_registry()
    for name in ("sleep", "put_note", "get_note", "ask_user"):
        assert registry.get(name) is not None
    assert [t.name for t in registry.select(None) if t.ends_turn] == ["ask_user"]
    assert registry.turn_enders() == {"ask_user"}
