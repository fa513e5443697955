"""Test support: real servers and workers in child processes, databases, API keys, SSE readers,
and the HTTP and SQL helpers the test modules share."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from signal import SIGTERM  # ChildProcess.signal shadows the module in its class
from typing import TYPE_CHECKING, Any, NoReturn

import httpx
import psycopg
from httpx_sse import ServerSentEvent, aconnect_sse
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from app.db import migrate
from app.db.embedded import start_embedded
from app.db.pool import Database
from app.store import claims
from app.store import sessions as session_store
from app.store.keys import hash_key, new_key
from tests.cluster import data_dir_for, with_database

if TYPE_CHECKING:
    from tests.netns import Host

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def server_url() -> str:
    """A database URL with rights to create databases: $DATABASE_URL, or the embedded server."""
    return os.environ.get("DATABASE_URL") or start_embedded(data_dir_for("ferryman-test"))


@contextlib.contextmanager
def empty_database(prefix: str, admin_url: str | None = None) -> Iterator[str]:
    """A new database with no schema on `admin_url`'s server (default: the server under
    test), dropped afterwards."""
    admin_url = admin_url or server_url()
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextlib.contextmanager
def fresh_database(prefix: str, admin_url: str | None = None) -> Iterator[str]:
    """A new, migrated database (see `empty_database`), dropped afterwards."""
    with empty_database(prefix, admin_url) as url:
        migrate.upgrade(url)
        yield url


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ChildProcess:
    """`python -m app ...` in a child process, its output in a log file."""

    database_url: str
    env: dict[str, str] = field(default_factory=dict)
    # The test host (network namespace) to run in; None: this machine's own network.
    netns: Host | None = None
    # Another checkout of Ferryman (with its own .venv) to run instead of this one: a
    # benchmark's `--baseline`.
    checkout: Path | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    log_path: str = field(default="", init=False)

    def _spawn(
        self, args: list[str], log_path: str, defaults: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start the command; `defaults` are environment settings that `env` may override."""
        env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "FERRYMAN_LOG_FORMAT": "json",
            **(defaults or {}),
            **self.env,
        }
        self.log_path = log_path
        with open(log_path, "wb") as log:  # the child keeps its own handle
            self.proc = subprocess.Popen(
                [
                    *(self.netns.exec_prefix() if self.netns else []),
                    str(self.checkout / ".venv" / "bin" / "python")
                    if self.checkout
                    else sys.executable,
                    "-m",
                    "app",
                    *args,
                ],
                env=env,
                cwd=self.checkout or REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self.proc

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def logs(self, tail: int | None = 5000) -> str:
        """The end of the process's output (all of it with `tail=None`)."""
        with open(self.log_path, errors="replace") as f:
            text = f.read()
        return text if tail is None else text[-tail:]

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, sig: int = SIGTERM, timeout: float = 15.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@dataclass
class ServerProcess(ChildProcess):
    """`ferryman serve` in a child process, on an ephemeral port (or `port`, when set)."""

    args: list[str] = field(default_factory=list)
    # Sessions stay queued unless the test asks for the in-process worker.
    worker: bool = False
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def host(self) -> str:
        return self.netns.address if self.netns else "127.0.0.1"

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self.port = self.port or free_port()
        args = ["serve", "--host", self.host, "--port", str(self.port)]
        proc = self._spawn(
            [*args, *([] if self.worker else ["--no-worker"]), *self.args],
            f"/tmp/ferryman-test-server-{self.port}.log",
            {"FERRYMAN_POLL_INTERVAL": "2"},
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.logs()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            time.sleep(0.1)
        raise RuntimeError(f"server not ready in {timeout}s:\n{self.logs()}")


@dataclass
class WorkerProcess(ChildProcess):
    """`ferryman worker` in a child process (SIGKILL it to test recovery)."""

    concurrency: int = 4

    def start(self) -> WorkerProcess:
        self._spawn(
            ["worker", "--concurrency", str(self.concurrency)],
            f"/tmp/ferryman-test-worker-{uuid.uuid4().hex[:8]}.log",
        )
        return self


@contextlib.contextmanager
def running(server: ServerProcess) -> Iterator[ServerProcess]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


def create_owner_key(
    database_url: str, owner: str | None = None, policy: dict[str, Any] | None = None
) -> tuple[str, str]:
    """A fresh owner (or `owner`) and an API key for it with `policy` (None: `{}`), written
    straight to the database."""
    owner = owner or f"owner-{uuid.uuid4().hex[:12]}"
    key = new_key()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO api_keys (id, owner_id, name, prefix, key_hash, policy)"
            " VALUES (%s, %s, 'test', %s, %s, %s)",
            (uuid.uuid4(), owner, key[:10], hash_key(key), Jsonb(policy or {})),
        )
    return owner, key


def client(base_url: str, key: str | None = None, **kwargs: Any) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30, **kwargs)


@contextlib.asynccontextmanager
async def sse(
    http: httpx.AsyncClient, path: str, *, last_event_id: str | None = None, **params: Any
) -> AsyncIterator[AsyncIterator[ServerSentEvent]]:
    """Open an SSE stream and yield its events. Pings and the `retry:` block are skipped, as an
    EventSource skips them (a block without data dispatches nothing)."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
    async with aconnect_sse(http, "GET", path, headers=headers, params=params) as source:
        source.response.raise_for_status()

        async def events() -> AsyncIterator[ServerSentEvent]:
            async for event in source.aiter_sse():
                if event.data:
                    yield event

        yield events()


async def owner_backlog(http: httpx.AsyncClient, cursor: str) -> list[ServerSentEvent]:
    """The owner events after `cursor` (the durable ones, up to `caught_up`)."""
    seen = []
    async with (
        asyncio.timeout(10),
        sse(http, "/api/agent/owner-events", last_event_id=cursor) as events,
    ):
        async for event in events:
            if event.event == "caught_up":
                break
            seen.append(event)
    return seen


async def first_delta(http: httpx.AsyncClient, session_id: str) -> None:
    """Return once the session's model has begun to stream its answer (a `message_delta`)."""
    async with sse(http, f"/api/agent/{session_id}/events") as events:
        async for event in events:
            if event.event == "message_delta":
                return
    raise AssertionError(f"{session_id}: the stream ended before any delta")


CONTROL_EVENTS = frozenset({"caught_up", "resync_required", "message_delta"})


def ids(events: list[ServerSentEvent]) -> list[int]:
    """Ids of the durable events. httpx-sse, like EventSource, repeats the last id on control
    frames (the last-event-id buffer persists), so those are told apart by type."""
    return [int(e.id) for e in events if e.id and e.event not in CONTROL_EVENTS]


# --- the REST API -----------------------------------------------------------------------------

PROBLEM = "application/problem+json"
TERMINAL = {"succeeded", "failed", "cancelled"}


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """`response` is an RFC 9457 problem with this status and `code`; its body."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    assert body["status"] == status
    assert body["type"] == "about:blank"
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str)
    if status == 422:
        assert body["errors"], body
        assert all({"field", "message", "type"} <= set(e) for e in body["errors"])
    return body


async def create_session(
    http: httpx.AsyncClient, prompt: str = "hello", **body: Any
) -> dict[str, Any]:
    """POST /api/agent (201); the new Session."""
    response = await http.post("/api/agent", json={"prompt": prompt, **body})
    assert response.status_code == 201, response.text
    session: dict[str, Any] = response.json()
    return session


async def new_session(http: httpx.AsyncClient, prompt: str = "hello", **body: Any) -> str:
    """create_session, for the new session's id alone."""
    session_id: str = (await create_session(http, prompt, **body))["id"]
    return session_id


async def transcript(http: httpx.AsyncClient, session_id: str) -> list[dict[str, Any]]:
    response = await http.get(f"/api/agent/{session_id}/transcript", params={"limit": 1000})
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["events"]
    return events


def of_type(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == type_]


def assert_contiguous(events: list[dict[str, Any]]) -> None:
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


async def wait_for_status(
    http: httpx.AsyncClient, session_id: str, statuses: set[str], timeout: float = 20.0
) -> dict[str, Any]:
    """Poll a session until its status is one of `statuses`; the session."""
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = (await http.get(f"/api/agent/{session_id}")).json()
        if body.get("status") in statuses:
            return body
        if time.monotonic() > deadline:
            status = body.get("status")
            raise AssertionError(f"{session_id} still {status} after {timeout}s: {body}")
        await asyncio.sleep(0.05)


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


# --- the database -----------------------------------------------------------------------------


async def query(url: str, statement: str, params: Any = ()) -> list[dict[str, Any]]:
    """Run one statement in its own connection; its rows (none for a statement without any)."""
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, row_factory=dict_row
    ) as conn:
        cur = await conn.execute(statement, params)
        return await cur.fetchall() if cur.description else []


# --- workers ----------------------------------------------------------------------------------

# Fast claims and heartbeats for every test worker unless a test says otherwise.
WORKER_ENV = {"FERRYMAN_CLAIM_INTERVAL": "0.2", "FERRYMAN_HEARTBEAT_INTERVAL": "0.5"}
StartWorker = Callable[..., WorkerProcess]


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


async def wait_logged(
    worker: ChildProcess, text: str, *, session: str | None = None, timeout: float = 20.0
) -> None:
    """Wait until the process has logged a line containing `text` (about `session`, if given).
    For proofs that a process did something (tried a late write and was refused) rather than a
    sleep that gives it time to."""
    deadline = time.monotonic() + timeout
    while True:
        for line in worker.logs().splitlines():
            if text in line and (session is None or session in line):
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"never logged {text!r} in {timeout}s:\n{worker.logs()[-3000:]}")
        await asyncio.sleep(0.05)


def stop_all(workers: list[WorkerProcess]) -> None:
    """SIGTERM every live worker (resuming stopped ones first), then wait for all of them."""
    live = [w for w in workers if w.proc is not None and w.proc.poll() is None]
    for worker in live:
        with contextlib.suppress(ProcessLookupError):
            worker.signal(signal.SIGCONT)
            worker.signal(signal.SIGTERM)
    for worker in live:
        worker.stop(timeout=10)


async def live_workers(url: str) -> list[str]:
    rows = await query(url, "SELECT id FROM workers WHERE stopped_at IS NULL")
    return [r["id"] for r in rows]


@contextlib.asynccontextmanager
async def database_with_worker(prefix: str, worker: str) -> AsyncIterator[Database]:
    """A fresh migrated database's pool, with a registered worker `worker` that claims through
    the store (no process): for store-level tests of what a run writes."""
    with fresh_database(prefix) as url:
        db = Database(url, min_size=1, max_size=4)
        await db.pool.open(wait=True)
        async with db.transaction() as conn:
            await conn.execute(
                "INSERT INTO workers (id, pid, hostname) VALUES (%s, 1, 'test')", (worker,)
            )
        try:
            yield db
        finally:
            await db.close()


async def claimed_session(db: Database, worker: str) -> dict[str, Any]:
    """A new session of a new owner, claimed by `worker` (the claim's row)."""
    new = session_store.NewSession("hi", "hi", "scripted", None, None, {})
    async with db.transaction() as conn:
        await session_store.create_session(conn, f"owner-{uuid.uuid4().hex[:8]}", new, None)
        [row] = await claims.claim(conn, worker, 1, 30)
    return row


def missing(reason: str, what: str) -> NoReturn:
    """Something a test needs is missing: a skip on a developer's machine, a failure under
    CI=true, where .ci/run provides it and `what` must run."""
    import pytest  # tests/llm/server.py's child process imports this module without pytest

    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: {what} must run in CI)")
    pytest.skip(reason)


def delete_schedules(database_url: str) -> None:
    """Delete every schedule: one left behind by a test would fire in a later test's workers."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM schedules")


# Queue sessions: owner, title prefix (numbered from 1), how many, at what priority.
QUEUE = (
    "INSERT INTO sessions (id, owner_id, title, status, model, prompt, priority)"
    " SELECT gen_random_uuid(), %(owner)s, %(title)s || n, 'queued', 'scripted', 'p',"
    " %(priority)s FROM generate_series(1, %(n)s) AS n"
)
