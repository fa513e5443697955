"""Crash recovery with real worker processes (SPEC section 5).

A worker holding a session is SIGKILLed during a model stream, during a tool, and between two
writes; another worker, already running, resumes the session: `session_resumed {reason: "crash"}`
on both streams, every dangling tool call answered once by a synthetic interrupted result, the
idempotent calls re-issued (notes stay one row per key), seqs contiguous, the session succeeds.
A worker that is alive but cut off (SIGSTOP) loses its sessions after the lease TTL and, once it
runs again, writes nothing more. A worker whose heartbeat connection (its liveness lock) dies
claims nothing until it registers again, instead of burning its sessions' attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from tests.support import (
    ServerProcess,
    WorkerProcess,
    client,
    create_owner_key,
    fresh_database,
    sse,
    wait_logged,
)

# Dead-worker detection goes through the liveness lock, so a resume must come far sooner than
# the lease TTL (what bounds a worker that is alive but cut off).
LEASE_TTL = 10.0
RESUME_BOUND = 3.0
INTERRUPTED = {"isError": True, "interrupted": True, "content": "worker interrupted"}


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recovery_db() -> Iterator[str]:
    """A database of this module's own: no other test's queued sessions reach our workers."""
    with fresh_database("ferryman_recovery") as url:
        yield url


@pytest.fixture(scope="module")
def api(recovery_db: str) -> Iterator[ServerProcess]:
    server = ServerProcess(
        recovery_db, env={"FERRYMAN_AUTH": "keys", "FERRYMAN_POLL_INTERVAL": "1"}
    ).start()
    yield server
    server.stop()


# --- workers ---------------------------------------------------------------------------------


@dataclass
class Workers:
    """A few `ferryman worker` processes; the killed ones are replaced."""

    url: str
    env: dict[str, str]
    size: int = 2
    concurrency: int = 4
    alive: list[WorkerProcess] = field(default_factory=list)
    dead: list[WorkerProcess] = field(default_factory=list)

    def spawn(self) -> WorkerProcess:
        worker = WorkerProcess(self.url, env=self.env, concurrency=self.concurrency).start()
        self.alive.append(worker)
        return worker

    def start(self) -> Workers:
        for _ in range(self.size):
            self.spawn()
        for worker in self.alive:
            wait_started(worker)
        return self

    def by_pid(self, pid: int) -> WorkerProcess:
        for worker in self.alive:
            if worker.pid == pid:
                return worker
        raise AssertionError(f"no live worker with pid {pid}")

    def kill(self, worker: WorkerProcess) -> float:
        """SIGKILL `worker`; returns the moment of the kill."""
        worker.signal(signal.SIGKILL)
        killed_at = time.monotonic()
        assert worker.proc is not None
        worker.proc.wait(10)
        self.alive.remove(worker)
        self.dead.append(worker)
        return killed_at

    def all_logs(self) -> str:
        text = []
        for worker in [*self.alive, *self.dead]:
            with open(worker.log_path, errors="replace") as f:
                text.append(f.read())
        return "\n".join(text)

    def stop(self) -> None:
        for worker in self.alive:
            with contextlib.suppress(Exception):
                worker.signal(signal.SIGCONT)
            worker.stop()


def wait_started(worker: WorkerProcess, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert worker.proc is not None
        if worker.proc.poll() is not None:
            raise AssertionError(f"worker exited early:\n{worker.logs()}")
        with open(worker.log_path, errors="replace") as f:
            if "started (concurrency" in f.read():
                return
        time.sleep(0.1)
    raise AssertionError(f"worker not started in {timeout}s:\n{worker.logs()}")


@contextlib.contextmanager
def workers(url: str, size: int = 2, **env: str) -> Iterator[Workers]:
    settings = {
        "FERRYMAN_LEASE_TTL": str(LEASE_TTL),
        "FERRYMAN_HEARTBEAT_INTERVAL": "1",
        **env,
    }
    pool = Workers(url, settings, size=size)
    try:
        yield pool.start()
    finally:
        pool.stop()


# --- streams ---------------------------------------------------------------------------------


@dataclass
class Watch:
    """One followed SSE stream: durable envelopes with the moment each arrived."""

    path: str
    last_id: str | None = None
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    deltas: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def envelopes(self) -> list[dict[str, Any]]:
        return [e for _, e in self.events]

    def first(self, pred: Callable[[dict[str, Any]], bool]) -> tuple[float, dict[str, Any]] | None:
        for at, envelope in self.events:
            if pred(envelope):
                return at, envelope
        return None


async def follow(http: httpx.AsyncClient, watch: Watch, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError):
            async with sse(http, watch.path, last_event_id=watch.last_id) as events:
                async for event in events:
                    if not event.data:
                        continue
                    envelope = json.loads(event.data)
                    if event.event == "message_delta":
                        watch.deltas += 1
                    elif event.id and envelope.get("id") == event.id:
                        watch.events.append((time.monotonic(), envelope))
                        watch.last_id = event.id
                    watch.changed.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


@contextlib.asynccontextmanager
async def watching(http: httpx.AsyncClient, *watches: Watch) -> AsyncIterator[None]:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(follow(http, w, stop)) for w in watches]
    try:
        yield
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def is_type(type_: str, **data: Any) -> Callable[[dict[str, Any]], bool]:
    def pred(envelope: dict[str, Any]) -> bool:
        return envelope["type"] == type_ and all(
            envelope["data"].get(k) == v for k, v in data.items()
        )

    return pred


# --- the durable record ----------------------------------------------------------------------


def session_rows(url: str, session_id: str) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT seq, attempt, type, data FROM session_events WHERE session_id = %s"
            " ORDER BY seq",
            (session_id,),
        ).fetchall()


def session_row(url: str, session_id: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute(
            "SELECT status, attempt, last_seq FROM sessions WHERE id = %s", (session_id,)
        ).fetchone()
    assert row is not None
    return row


def note_rows(url: str, session_id: str) -> dict[str, list[dict[str, Any]]]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT key, text, attempt FROM notes WHERE session_id = %s ORDER BY key",
            (session_id,),
        ).fetchall()
    notes: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        notes.setdefault(row["key"], []).append(row)
    return notes


def dangling_calls(rows: list[dict[str, Any]]) -> list[str]:
    """Ids of the calls in `rows` (in call order) that have no `tool_result` in `rows`."""
    answered = {r["data"]["toolCallId"] for r in rows if r["type"] == "tool_result"}
    calls: list[str] = []
    for row in rows:
        if row["type"] == "assistant_message":
            calls += [c["id"] for c in row["data"].get("toolCalls") or []]
        elif row["type"] == "tool_call_start":
            calls.append(row["data"]["toolCallId"])
    dangling: list[str] = []
    for call_id in calls:
        if call_id not in answered and call_id not in dangling:
            dangling.append(call_id)
    return dangling


def check_log(url: str, session_id: str, owner_watch: Watch | None = None) -> list[dict[str, Any]]:
    """The invariants every recovered session keeps; returns its `session_resumed` events."""
    rows = session_rows(url, session_id)
    head = session_row(url, session_id)
    context = "\n".join(f"{r['seq']:>3} a{r['attempt']} {r['type']} {r['data']}" for r in rows)
    assert head["status"] == "succeeded", f"status {head['status']}\n{context}"
    assert [r["seq"] for r in rows] == list(range(1, head["last_seq"] + 1)), context
    attempts = [r["attempt"] for r in rows]
    assert attempts == sorted(attempts), f"a dead attempt wrote after a newer one\n{context}"
    # Every call is answered exactly once.
    results: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["type"] == "tool_result":
            results.setdefault(row["data"]["toolCallId"], []).append(row)
    for call_id in {c["id"] for r in rows for c in r["data"].get("toolCalls") or []}:
        assert len(results.get(call_id, [])) == 1, f"call {call_id} answered\n{context}"
    resumes = [r for r in rows if r["type"] == "session_resumed"]
    for resumed in resumes:
        # What the dead attempts left behind, as the resuming worker found it.
        before = [r for r in rows if r["attempt"] < resumed["attempt"]]
        expected = dangling_calls(before)
        data = resumed["data"]
        assert data["reason"] == "crash", context
        assert data["attempt"] == resumed["attempt"], context
        assert data["repairedToolCalls"] == expected, context
        for call_id in expected:
            (result,) = results[call_id]
            assert {k: result["data"].get(k) for k in INTERRUPTED} == INTERRUPTED, context
            # Written by the resuming run, before its `session_resumed`.
            assert result["attempt"] == resumed["attempt"], context
            assert result["seq"] < resumed["seq"], context
        # The first event of an attempt after a crash is either a repair or the resume itself.
        first_of_attempt = next(r for r in rows if r["attempt"] == resumed["attempt"])
        assert first_of_attempt["type"] in ("tool_result", "session_resumed"), context
        if owner_watch is not None:
            owner_copy = owner_watch.first(
                lambda e, a=resumed["attempt"]: (
                    e["type"] == "session_resumed"
                    and e["sessionId"] == session_id
                    and e["data"]["attempt"] == a
                )
            )
            assert owner_copy is not None, f"no owner session_resumed for attempt\n{context}"
            assert owner_copy[1]["data"] == data, context
    return resumes


def resumed_log_lines(logs: str, session_id: str) -> list[dict[str, Any]]:
    lines = []
    for line in logs.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("event") == "session resumed" and record.get("session") == session_id:
                lines.append(record)
    return lines


def holder_pid(watch: Watch) -> int:
    """The pid of the worker that started or resumed the session last (as the stream says)."""
    for _, envelope in reversed(watch.events):
        if envelope["type"] in ("session_start", "session_resumed"):
            return int(envelope["data"]["pid"])
    raise AssertionError("no run has started")


async def create(http: httpx.AsyncClient, prompt: str, script: list[dict[str, Any]]) -> str:
    response = await http.post("/api/agent", json={"prompt": prompt, "script": script})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


# --- tests -----------------------------------------------------------------------------------


async def kill_and_resume(
    pool: Workers,
    http: httpx.AsyncClient,
    script: list[dict[str, Any]],
    kill_when: Callable[[Watch], bool],
    what: str,
) -> tuple[str, Watch, Watch, float]:
    """Run `script`, SIGKILL its holder once `kill_when(session watch)`, wait for the end.
    Returns the session id, both watches and the kill-to-`session_resumed` time."""
    session_id = await create(http, what, script)
    # A fresh owner per test: replay its feed from the start.
    owner_watch = Watch("/api/agent/owner-events", last_id="0")
    session_watch = Watch(f"/api/agent/{session_id}/events")
    async with watching(http, session_watch, owner_watch):
        await wait_for(lambda: kill_when(session_watch), 30, f"{what}: the moment to kill")
        victim = pool.by_pid(holder_pid(session_watch))
        killed_at = pool.kill(victim)
        replacement = pool.spawn()
        await wait_for(
            lambda: session_watch.first(is_type("session_resumed")) is not None,
            LEASE_TTL + 10,
            f"{what}: session_resumed",
        )
        resumed = session_watch.first(is_type("session_resumed"))
        assert resumed is not None
        resume_time = resumed[0] - killed_at
        await wait_for(
            lambda: session_watch.first(is_type("session_end")) is not None,
            60,
            f"{what}: session_end",
        )
        end = session_watch.first(is_type("session_end"))
        assert end is not None and end[1]["data"]["status"] == "succeeded", end
        await wait_for(
            lambda: (
                owner_watch.first(
                    lambda e: e["type"] == "session_resumed" and e["sessionId"] == session_id
                )
                is not None
            ),
            10,
            f"{what}: owner session_resumed",
        )
        await asyncio.to_thread(wait_started, replacement)
    assert resumed[1]["data"]["pid"] != victim.pid
    assert resumed[1]["data"]["reason"] == "crash"
    print(f"{what}: kill -> session_resumed on the session stream {resume_time:.3f}s")
    return session_id, session_watch, owner_watch, resume_time


def fresh_owner(url: str) -> str:
    return create_owner_key(url)[1]


async def test_kill_during_model_stream(recovery_db: str, api: ServerProcess) -> None:
    key = fresh_owner(recovery_db)
    script = [{"text": "a long streamed answer " * 8, "chunks": 20, "delayMs": 3000}]
    with workers(recovery_db) as pool:
        async with client(api.url, key) as http:
            session_id, _, owner_watch, took = await kill_and_resume(
                pool,
                http,
                script,
                # Mid-stream: the run started and tokens are flowing.
                lambda w: w.first(is_type("session_start")) is not None and w.deltas >= 3,
                "kill during a model stream",
            )
        logs = pool.all_logs()
    assert took < RESUME_BOUND, f"resume took {took:.2f}s (lease TTL {LEASE_TTL}s)"
    (resumed,) = check_log(recovery_db, session_id, owner_watch)
    assert resumed["data"]["repairedToolCalls"] == []
    rows = session_rows(recovery_db, session_id)
    # Nothing of the interrupted stream became durable; the replayed turn is the answer.
    answers = [r for r in rows if r["type"] == "assistant_message"]
    assert len(answers) == 1 and answers[0]["attempt"] == 2
    assert answers[0]["data"]["text"] == script[0]["text"]
    (line,) = resumed_log_lines(logs, session_id)
    assert line["plan"] == "start" and line["reason"] == "crash" and line["repaired"] == []


async def test_kill_during_tool(recovery_db: str, api: ServerProcess) -> None:
    key = fresh_owner(recovery_db)
    script = [
        {
            "toolCalls": [
                {"name": "put_note", "arguments": {"key": "plan", "text": "step one"}},
                {"name": "sleep", "arguments": {"seconds": 3}},
            ]
        },
        {"toolCalls": [{"name": "put_note", "arguments": {"key": "result", "text": "done"}}]},
        {"text": "finished"},
    ]
    with workers(recovery_db) as pool:
        async with client(api.url, key) as http:
            session_id, _, owner_watch, took = await kill_and_resume(
                pool,
                http,
                script,
                lambda w: w.first(is_type("tool_call_start", name="sleep")) is not None,
                "kill during a tool",
            )
        logs = pool.all_logs()
    assert took < RESUME_BOUND, f"resume took {took:.2f}s (lease TTL {LEASE_TTL}s)"
    rows = session_rows(recovery_db, session_id)
    (resumed,) = check_log(recovery_db, session_id, owner_watch)
    sleep_start = next(
        r for r in rows if r["type"] == "tool_call_start" and r["data"]["name"] == "sleep"
    )
    assert resumed["data"]["repairedToolCalls"] == [sleep_start["data"]["toolCallId"]]
    # The interrupted turn is replayed: both calls re-issued under new ids, the idempotent
    # put_note runs again (an upsert: still one row per key).
    put_plan = [
        r
        for r in rows
        if r["type"] == "tool_call_start" and r["data"]["arguments"].get("key") == "plan"
    ]
    assert [r["attempt"] for r in put_plan] == [1, 2]
    assert put_plan[0]["data"]["toolCallId"] != put_plan[1]["data"]["toolCallId"]
    sleeps = [r for r in rows if r["type"] == "tool_call_start" and r["data"]["name"] == "sleep"]
    assert [r["attempt"] for r in sleeps] == [1, 2]
    notes = note_rows(recovery_db, session_id)
    assert sorted(notes) == ["plan", "result"]
    assert all(len(v) == 1 for v in notes.values())
    assert notes["plan"][0]["text"] == "step one" and notes["plan"][0]["attempt"] == 2
    assert notes["result"][0]["attempt"] == 2
    (line,) = resumed_log_lines(logs, session_id)
    assert line["plan"] == "continue" and line["repaired"] == resumed["data"]["repairedToolCalls"]


async def test_kill_between_writes(recovery_db: str, api: ServerProcess) -> None:
    """Quick put_note calls; the kill lands at a random event of the run, a few times."""
    key = fresh_owner(recovery_db)
    seed = int(os.environ.get("FERRYMAN_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"seed {seed}")
    turns, per_turn = 3, 4
    script: list[dict[str, Any]] = [
        {
            "delayMs": 150,
            "toolCalls": [
                {"name": "put_note", "arguments": {"key": f"k{t}-{i}", "text": f"v{t}-{i}"}}
                for i in range(per_turn)
            ],
        }
        for t in range(turns)
    ]
    script.append({"text": "all noted", "delayMs": 400})
    keys = sorted(f"k{t}-{i}" for t in range(turns) for i in range(per_turn))
    # user_message, session_start, then per turn an assistant message and a start and a result
    # per call: kill somewhere between the second event and the last put_note.
    last_write = 2 + turns * (1 + 2 * per_turn)
    times = []
    with workers(recovery_db) as pool:
        async with client(api.url, key) as http:
            for round_ in range(4):
                kill_at = rng.randrange(2, last_write - 2)
                session_id, _, owner_watch, took = await kill_and_resume(
                    pool,
                    http,
                    script,
                    lambda w, n=kill_at: bool(w.events) and int(w.events[-1][1]["id"]) >= n,
                    f"kill between writes (round {round_}, after seq {kill_at})",
                )
                times.append(took)
                (resumed,) = check_log(recovery_db, session_id, owner_watch)
                notes = note_rows(recovery_db, session_id)
                assert sorted(notes) == keys
                assert all(len(v) == 1 and v[0]["text"] == "v" + k[1:] for k, v in notes.items())
                lines = resumed_log_lines(pool.all_logs(), session_id)
                assert len(lines) == 1 and lines[0]["plan"] in ("start", "continue")
                assert lines[0]["repaired"] == resumed["data"]["repairedToolCalls"]
    assert max(times) < RESUME_BOUND, f"kill -> resume times {times} (lease TTL {LEASE_TTL}s)"


async def test_stopped_worker_is_fenced_out(recovery_db: str, api: ServerProcess) -> None:
    """SIGSTOP: the liveness lock is still held, so only the lease TTL frees the session; once
    the stopped worker runs again it writes nothing more."""
    ttl = 3.0
    key = fresh_owner(recovery_db)
    script = [
        {"toolCalls": [{"name": "put_note", "arguments": {"key": "before", "text": "1"}}]},
        {"toolCalls": [{"name": "sleep", "arguments": {"seconds": 1.5}}]},
        {"toolCalls": [{"name": "put_note", "arguments": {"key": "after", "text": "2"}}]},
        {"text": "finished"},
    ]
    with workers(recovery_db, FERRYMAN_LEASE_TTL=str(ttl)) as pool:
        async with client(api.url, key) as http:
            session_id = await create(http, "stopped worker", script)
            watch = Watch(f"/api/agent/{session_id}/events")
            owner_watch = Watch("/api/agent/owner-events", last_id="0")
            async with watching(http, watch, owner_watch):
                await wait_for(
                    lambda: watch.first(is_type("tool_call_start", name="sleep")) is not None,
                    30,
                    "the sleep to start",
                )
                stopped = pool.by_pid(holder_pid(watch))
                stopped.signal(signal.SIGSTOP)
                stopped_at = time.monotonic()
                try:
                    await wait_for(
                        lambda: watch.first(is_type("session_resumed")) is not None,
                        ttl + 15,
                        "another worker to take over",
                    )
                    took = time.monotonic() - stopped_at
                    with psycopg.connect(recovery_db, autocommit=True) as conn:
                        row = conn.execute(
                            "SELECT stopped_at IS NOT NULL FROM workers WHERE pid = %s",
                            (stopped.pid,),
                        ).fetchone()
                    reaped = row[0] if row else None
                finally:
                    stopped.signal(signal.SIGCONT)
                await wait_for(
                    lambda: watch.first(is_type("session_end")) is not None, 30, "session_end"
                )
                # The woken worker tried whatever it had in hand and was fenced out.
                await wait_logged(stopped, "lease lost; run stops writing", session=session_id)
            assert stopped.proc is not None and stopped.proc.poll() is None, "worker died"
    print(f"SIGSTOP -> takeover {took:.2f}s (lease TTL {ttl}s)")
    # The stopped worker still held its liveness lock, so it was never reaped as dead: the
    # takeover waited for its lease to expire (renewed at most a heartbeat before the stop).
    assert reaped is False, "the stopped worker was reaped as dead"
    assert ttl - 2 <= took < ttl + 5, took
    (resumed,) = check_log(recovery_db, session_id, owner_watch)
    assert resumed["data"]["pid"] != stopped.pid
    rows = session_rows(recovery_db, session_id)
    first_new = min(r["seq"] for r in rows if r["attempt"] == 2)
    late = [r for r in rows if r["attempt"] == 1 and r["seq"] > first_new]
    assert not late, f"the stopped worker wrote after the takeover: {late}"
    sleep_start = next(
        r for r in rows if r["type"] == "tool_call_start" and r["data"]["name"] == "sleep"
    )
    assert resumed["data"]["repairedToolCalls"] == [sleep_start["data"]["toolCallId"]]
    notes = note_rows(recovery_db, session_id)
    assert {k: [n["attempt"] for n in v] for k, v in notes.items()} == {
        "after": [2],
        "before": [1],
    }


async def test_lost_heartbeat_connection_does_not_burn_attempts(
    database_url: str, recovery_db: str, api: ServerProcess
) -> None:
    """A live worker whose heartbeat connection dies (and cannot come back for a while, as in a
    database restart) loses its liveness lock: it must claim nothing until it registers again.
    It used to reap itself and take its own session back claim after claim, each claim spending
    an attempt, until `MAX_ATTEMPTS_EXCEEDED`. (One worker, so no other one takes over first.)"""
    key = fresh_owner(recovery_db)
    script = [
        {
            "toolCalls": [
                {"name": "put_note", "arguments": {"key": "a", "text": "1"}},
                {"name": "sleep", "arguments": {"seconds": 2}},
            ]
        },
        {"text": "finished"},
    ]
    name = psycopg.conninfo.conninfo_to_dict(recovery_db)["dbname"]
    with workers(recovery_db, size=1, FERRYMAN_MAX_ATTEMPTS="5", FERRYMAN_LEASE_TTL="4") as pool:
        async with client(api.url, key) as http:
            session_id = await create(http, "heartbeat lost", script)
            watch = Watch(f"/api/agent/{session_id}/events")
            owner_watch = Watch("/api/agent/owner-events", last_id="0")
            async with watching(http, watch, owner_watch):
                await wait_for(
                    lambda: watch.first(is_type("tool_call_start", name="sleep")) is not None,
                    30,
                    "the sleep to start",
                )
                victim = pool.by_pid(holder_pid(watch))
                with (
                    psycopg.connect(database_url, autocommit=True) as admin,
                    psycopg.connect(recovery_db, autocommit=True) as conn,
                ):
                    row = conn.execute(
                        "SELECT lock_key FROM workers WHERE pid = %s AND stopped_at IS NULL",
                        (victim.pid,),
                    ).fetchone()
                    assert row is not None
                    # No new connections to the database for a while (existing ones work on),
                    # then cut the victim's heartbeat connection, the one holding its lock.
                    admin.execute(
                        sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(
                            sql.Identifier(name)
                        )
                    )
                    try:
                        cut = admin.execute(
                            """
                            SELECT pg_terminate_backend(l.pid) FROM pg_locks l
                            JOIN pg_database d ON d.oid = l.database
                            WHERE d.datname = %s AND l.locktype = 'advisory' AND l.granted
                              AND l.classid = %s AND l.objid = %s AND l.objsubid = 2
                            """,
                            (name, 0x4645, row[0]),
                        ).fetchall()
                        assert cut == [(True,)], cut
                        await asyncio.sleep(4)
                    finally:
                        admin.execute(
                            sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(
                                sql.Identifier(name)
                            )
                        )
                await wait_for(
                    lambda: watch.first(is_type("session_end")) is not None, 40, "session_end"
                )
            assert victim.proc is not None and victim.proc.poll() is None
    head = session_row(recovery_db, session_id)
    assert head["status"] == "succeeded", head
    # Once registered again, the worker took its session back once (its lease had expired):
    # one claim, not a claim storm.
    assert head["attempt"] == 2, head
    check_log(recovery_db, session_id, owner_watch)


async def test_registering_again_is_atomic(database_url: str, server: ServerProcess) -> None:
    """A worker that registers again (its heartbeat connection came back) must not be seen
    live before its old leases are given back: else its own claim loop could take a session in
    between, and the release would strip the new lease (an attempt spent for nothing, as a
    CI run once showed). Held at the lease release by a row lock, the registration must still
    look stopped from outside."""
    from app.store import liveness

    worker_id = f"w-{os.urandom(4).hex()}"
    _, key = create_owner_key(database_url)
    async with client(server.url, key) as http:
        session_id = (await http.post("/api/agent", json={"prompt": "leased"})).json()["id"]
    connect = psycopg.AsyncConnection.connect
    async with (
        await connect(database_url, autocommit=True, row_factory=dict_row) as admin,
        await connect(database_url, autocommit=True, row_factory=dict_row) as heartbeat,
    ):
        await admin.execute(
            "INSERT INTO workers (id, pid, hostname, stopped_at) VALUES (%s, 1, 'h', now())",
            (worker_id,),
        )
        # The session is still leased to the worker's previous life, as after a lost heartbeat
        # (status 'running' so that a real worker of this database would leave it alone).
        await admin.execute(
            "UPDATE sessions SET status = 'running', lease_worker_id = %s,"
            " lease_expires_at = now() + interval '1 hour' WHERE id = %s",
            (worker_id, session_id),
        )
        async with admin.transaction():
            await admin.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", (session_id,))
            registering = asyncio.create_task(
                liveness.register_worker(heartbeat, worker_id, os.getpid(), "h")
            )
            await asyncio.sleep(0.5)
            assert not registering.done(), "the registration did not wait for the row lock"
            async with await connect(database_url, row_factory=dict_row) as observer:
                cur = await observer.execute(
                    "SELECT stopped_at FROM workers WHERE id = %s", (worker_id,)
                )
                row = await cur.fetchone()
            assert row is not None and row["stopped_at"] is not None, "live before the release"
        await asyncio.wait_for(registering, 10)
        cur = await admin.execute(
            "SELECT w.stopped_at, s.lease_worker_id FROM workers w, sessions s"
            " WHERE w.id = %s AND s.id = %s",
            (worker_id, session_id),
        )
        assert await cur.fetchone() == {"stopped_at": None, "lease_worker_id": None}
        await admin.execute("DELETE FROM workers WHERE id = %s", (worker_id,))
