"""The runner end to end: real `ferryman worker` processes against a real PostgreSQL.

Every module that starts workers gets a database of its own (`isolated_db`): workers claim any
queued session in their database, so sharing the session-wide one would let them run other
tests' sessions (and other tests' workers run ours). `test_cancel` and `test_leases` import the
helpers below.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.rows import dict_row

from app.agent.tools import Tool, ToolContext, ToolRegistry
from app.agent.tools.builtin import BUILTIN_TOOLS
from app.db import migrate
from tests.support import REPO, ServerProcess, WorkerProcess, client, create_owner_key

TERMINAL = {"succeeded", "failed", "cancelled"}
# Fast claims and heartbeats for every test worker unless a test says otherwise.
WORKER_ENV = {"FERRYMAN_CLAIM_INTERVAL": "0.2", "FERRYMAN_HEARTBEAT_INTERVAL": "0.5"}
StartWorker = Callable[..., WorkerProcess]


# --- helpers shared with test_cancel.py and test_leases.py ----------------------------------


@pytest.fixture(scope="module")
def isolated_db(database_url: str) -> Iterator[str]:
    """A fresh, migrated database on the test server, for this module's workers alone."""
    name = f"ferryman_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    info["dbname"] = name
    url = psycopg.conninfo.make_conninfo(**info)
    migrate.upgrade(url)
    yield url
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
        )


@pytest.fixture(scope="module")
def api(isolated_db: str) -> Iterator[ServerProcess]:
    """An API server (no worker) on the module's database."""
    proc = ServerProcess(isolated_db, env={"FERRYMAN_POLL_INTERVAL": "1"}).start()
    yield proc
    proc.stop()


@pytest.fixture
def key(isolated_db: str) -> str:
    """A fresh owner's API key on the module's database."""
    return create_owner_key(isolated_db)[1]


@pytest.fixture
def start_worker(isolated_db: str) -> Iterator[StartWorker]:
    """Start `ferryman worker` processes; all are stopped when the test ends, and sessions the
    test left unfinished are closed so no later test's worker picks them up."""
    started: list[WorkerProcess] = []

    def start(env: dict[str, str] | None = None, concurrency: int = 4) -> WorkerProcess:
        worker = WorkerProcess(
            isolated_db, env={**WORKER_ENV, **(env or {})}, concurrency=concurrency
        )
        started.append(worker.start())
        return worker

    yield start
    stop_all(started)
    with psycopg.connect(isolated_db, autocommit=True) as conn:
        conn.execute(
            "UPDATE sessions SET status = 'cancelled', lease_worker_id = NULL, lease_pid = NULL,"
            " lease_expires_at = NULL WHERE status NOT IN ('succeeded', 'failed', 'cancelled')"
        )


def stop_all(workers: list[WorkerProcess]) -> None:
    """SIGTERM every live worker (resuming stopped ones first), then wait for all of them."""
    live = [w for w in workers if w.proc is not None and w.proc.poll() is None]
    for worker in live:
        with contextlib.suppress(ProcessLookupError):
            worker.signal(signal.SIGCONT)
            worker.signal(signal.SIGTERM)
    for worker in live:
        worker.stop(timeout=10)


@pytest.fixture(scope="module")
def shared_worker(isolated_db: str) -> Iterator[WorkerProcess]:
    """One plain worker for the tests of this module that need nothing special of it."""
    worker = WorkerProcess(isolated_db, env=WORKER_ENV, concurrency=4).start()
    yield worker
    stop_all([worker])


async def live_workers(url: str) -> list[str]:
    rows = await query(url, "SELECT id FROM workers WHERE stopped_at IS NULL")
    return [r["id"] for r in rows]


async def ready(*workers: WorkerProcess, timeout: float = 30.0) -> None:
    """Wait until each worker has registered and entered its claim loop."""
    deadline = time.monotonic() + timeout
    for worker in workers:
        while "started (concurrency" not in worker.logs():
            assert worker.proc is not None
            if worker.proc.poll() is not None:
                raise AssertionError(f"worker exited early:\n{worker.logs()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"worker not ready in {timeout}s:\n{worker.logs()}")
            await asyncio.sleep(0.05)


async def query(url: str, statement: str, params: Any = ()) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, row_factory=dict_row
    ) as conn:
        cur = await conn.execute(statement, params)
        return await cur.fetchall() if cur.description else []


async def create(http: httpx.AsyncClient, prompt: str = "p", **body: Any) -> str:
    response = await http.post("/api/agent", json={"prompt": prompt, **body})
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


async def transcript(http: httpx.AsyncClient, session_id: str) -> list[dict[str, Any]]:
    response = await http.get(f"/api/agent/{session_id}/transcript", params={"limit": 1000})
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["events"]
    return events


async def wait_event(
    http: httpx.AsyncClient,
    session_id: str,
    match: Callable[[dict[str, Any]], bool],
    timeout: float = 20.0,
) -> dict[str, Any]:
    """Poll the transcript until an event matches; that event."""
    deadline = time.monotonic() + timeout
    while True:
        for event in await transcript(http, session_id):
            if match(event):
                return event
        if time.monotonic() > deadline:
            raise AssertionError(f"no matching event in {session_id} after {timeout}s")
        await asyncio.sleep(0.05)


async def wait_status(
    http: httpx.AsyncClient, session_id: str, statuses: set[str], timeout: float = 20.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = (await http.get(f"/api/agent/{session_id}")).json()
        if body["status"] in statuses:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"{session_id} still {body['status']} after {timeout}s: {body}")
        await asyncio.sleep(0.05)


def of_type(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == type_]


def assert_contiguous(events: list[dict[str, Any]]) -> None:
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


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
                return await create(http, f"prompt {index}", script=script)

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


# A worker with extra tools registered, as a `ferryman.tools` plug-in would add them.
CUSTOM_WORKER = """
import asyncio, signal
from app.agent.tools import Tool, ToolError, ToolRegistry
from app.config import get_settings
from app.db import bootstrap
from app.logs import configure
from app.runtime.worker import Worker
from app.services import Services

SECONDS = {"type": "object", "properties": {"seconds": {"type": "number"}},
           "required": ["seconds"]}

async def slow(arguments, context):
    await asyncio.sleep(float(arguments["seconds"]))
    return "slow finished"

async def boom(arguments, context):
    raise RuntimeError("kaboom")

async def refuse(arguments, context):
    raise ToolError("not today")

registry = ToolRegistry.default()
registry.register(Tool("slow", "Default timeout.", SECONDS, slow))
registry.register(Tool("quick", "Its own 0.3 s timeout.", SECONDS, slow, timeout=0.3))
registry.register(Tool("boom", "Raises.", {"type": "object"}, boom))
registry.register(Tool("refuse", "Raises ToolError.", {"type": "object"}, refuse))
settings = get_settings()
configure(settings.log_level, settings.log_format)
url = bootstrap.prepare(settings)

async def main():
    services = Services.create(settings, url)
    await services.start()
    worker = Worker(settings, services.db, services.bus, registry=registry)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    try:
        await worker.run()
    finally:
        await services.stop()

asyncio.run(main())
"""


class CustomToolWorker(WorkerProcess):
    def start(self) -> CustomToolWorker:
        env = {**os.environ, "DATABASE_URL": self.database_url, **self.env}
        env["FERRYMAN_LOG_FORMAT"] = "json"
        self.log_path = f"/tmp/ferryman-test-worker-{uuid.uuid4().hex[:8]}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CUSTOM_WORKER],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return self


async def test_tool_timeouts_and_raising_tools(
    api: ServerProcess, isolated_db: str, key: str
) -> None:
    # Runs before `shared_worker` exists: a plain worker would not know these tools.
    assert await live_workers(isolated_db) == []
    worker = CustomToolWorker(
        isolated_db, env={**WORKER_ENV, "FERRYMAN_TOOL_TIMEOUT": "0.5"}
    ).start()
    try:
        await ready(worker)
        async with client(api.url, key) as http:
            script = [
                {
                    "text": "tools",
                    "toolCalls": [
                        {"name": "slow", "arguments": {"seconds": 5}},
                        {"name": "quick", "arguments": {"seconds": 2}},
                        {"name": "slow", "arguments": {"seconds": 0.05}},
                        {"name": "sleep", "arguments": {"seconds": 0.7}},
                        {"name": "boom", "arguments": {}},
                        {"name": "refuse", "arguments": {}},
                    ],
                },
                {"text": "went on"},
            ]
            sid = await create(http, script=script)
            assert (await wait_status(http, sid, TERMINAL))["status"] == "succeeded"
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
    finally:
        worker.stop(timeout=10)


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
        sid = await create(http, script=script)
        # A tool the session did not enable is unknown to it.
        restricted = await create(
            http,
            script=[
                {"toolCalls": [{"name": "put_note", "arguments": {"key": "k", "text": "v"}}]},
                {"text": "ok"},
            ],
            tools=["get_note"],
        )
        assert (await wait_status(http, sid, TERMINAL))["status"] == "succeeded"
        assert (await wait_status(http, restricted, TERMINAL))["status"] == "succeeded"
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


# --- waiting, follow-ups, steering --------------------------------------------------------


async def test_ask_user_waits_and_a_reply_continues(
    api: ServerProcess, key: str, shared_worker: WorkerProcess
) -> None:
    await ready(shared_worker)
    async with client(api.url, key) as http:
        question = {"question": "Red or blue?", "options": ["red", "blue"]}
        sid = await create(
            http,
            script=[
                {"text": "let me ask", "toolCalls": [{"name": "ask_user", "arguments": question}]},
                {"text": "thanks for answering"},
            ],
        )
        waiting = await wait_status(http, sid, {"waiting", *TERMINAL})
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
        done = await wait_status(http, sid, TERMINAL)
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
        sid = await create(
            http,
            script=[
                {"text": "a long answer that got cut", "stopReason": "length"},
                {"text": "rest"},
            ],
        )
        waiting = await wait_status(http, sid, {"waiting", *TERMINAL})
        assert waiting["status"] == "waiting"
        events = await transcript(http, sid)
        assert of_type(events, "assistant_message")[0]["data"]["stopReason"] == "length"
        end = of_type(events, "session_end")[0]["data"]
        assert end["status"] == "waiting" and end.get("note")

        reply = await http.post(f"/api/agent/{sid}/messages", json={"text": "go on"})
        assert reply.json()["message"]["delivery"] == "queued"
        assert (await wait_status(http, sid, TERMINAL))["status"] == "succeeded"
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
        # The script runs out after the sleep: the next turn echoes the last user message.
        sid = await create(
            http,
            "original prompt",
            script=[
                {"text": "napping", "toolCalls": [{"name": "sleep", "arguments": {"seconds": 1}}]}
            ],
        )
        await wait_event(http, sid, lambda e: e["type"] == "tool_call_start")
        steer = await http.post(f"/api/agent/{sid}/messages", json={"text": "change of plan"})
        assert steer.status_code == 202
        assert steer.json()["message"]["delivery"] == "steer"
        done = await wait_status(http, sid, TERMINAL)
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


async def test_message_during_the_last_turn_requeues(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    """A steer that arrives after the last turn started is not lost: the run ends, and the
    session goes again for it."""
    await ready(start_worker())
    async with client(api.url, key) as http:
        sid = await create(
            http, script=[{"text": "slow final answer", "chunks": 4, "delayMs": 1200}]
        )
        await wait_event(http, sid, lambda e: e["type"] == "session_start")
        await asyncio.sleep(0.3)
        steer = await http.post(f"/api/agent/{sid}/messages", json={"text": "one more thing"})
        assert steer.json()["message"]["delivery"] == "steer"
        deadline = time.monotonic() + 20
        while True:
            events = await transcript(http, sid)
            answers = of_type(events, "assistant_message")
            session = (await http.get(f"/api/agent/{sid}")).json()
            if session["status"] in TERMINAL and len(answers) == 2:
                break
            assert time.monotonic() < deadline, (
                session,
                [(e["type"], e["attempt"], e["data"]) for e in events],
            )
            await asyncio.sleep(0.05)
        assert session["status"] == "succeeded"
        assert [a["data"]["text"] for a in answers] == [
            "slow final answer",
            "You said: one more thing",
        ]
        assert of_type(events, "session_resumed")[0]["data"]["reason"] == "follow_up"


async def test_default_echo_without_script(
    api: ServerProcess, key: str, shared_worker: WorkerProcess
) -> None:
    await ready(shared_worker)
    async with client(api.url, key) as http:
        sid = await create(http, "hello there, worker")
        done = await wait_status(http, sid, TERMINAL)
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


async def test_message_deltas_stream_live_without_ids(
    api: ServerProcess, key: str, shared_worker: WorkerProcess
) -> None:
    await ready(shared_worker)
    text = "The quick brown fox jumps over the lazy dog"
    async with client(api.url, key) as http:
        # The first turn asks; the answer to the follow-up streams while we watch live.
        ask = {"name": "ask_user", "arguments": {"question": "ready?"}}
        sid = await create(
            http, script=[{"toolCalls": [ask]}, {"text": text, "chunks": 8, "delayMs": 1600}]
        )
        await wait_status(http, sid, {"waiting"})
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
    for delta in deltas:
        assert "id" not in delta
        envelope = json.loads(delta["data"])
        assert envelope["type"] == "message_delta"
        assert envelope["sessionId"] == sid
        assert envelope["phase"] == "live"
    assert "".join(json.loads(d["data"])["data"]["text"] for d in deltas) == text
    # Deltas come before the durable message that carries the whole text, and move no cursor.
    answer = next(
        i
        for i, f in enumerate(frames)
        if f.get("event") == "assistant_message" and json.loads(f["data"])["data"]["text"] == text
    )
    assert max(i for i, f in enumerate(frames) if f.get("event") == "message_delta") < answer
    durable = [int(f["id"]) for f in frames if "id" in f]
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
    registry = ToolRegistry.default()
    for name in ("sleep", "put_note", "get_note", "ask_user"):
        assert registry.get(name) is not None
    assert [t.name for t in registry.select(None) if t.ends_turn] == ["ask_user"]
