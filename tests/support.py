"""Test support: real servers on ephemeral ports, API keys, SSE readers."""

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
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from signal import SIGTERM  # WorkerProcess.signal shadows the module in its class
from typing import Any

import httpx
import psycopg
from httpx_sse import ServerSentEvent, aconnect_sse
from psycopg import sql

from app.db import migrate
from app.db.embedded import start_embedded
from app.store.keys import hash_key, new_key

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _scratch_data_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/ferryman-test")
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"ferryman-test-{os.getuid()}"


def server_url() -> str:
    """A database URL with rights to create databases: $DATABASE_URL, or the embedded server."""
    return os.environ.get("DATABASE_URL") or start_embedded(_scratch_data_dir())


def with_database(url: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)


@contextlib.contextmanager
def fresh_database(prefix: str) -> Iterator[str]:
    """A new, migrated database on the server under test, dropped afterwards."""
    admin_url = server_url()
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = with_database(admin_url, name)
    migrate.upgrade(url)
    try:
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    """`ferryman serve` in a child process, on an ephemeral port."""

    database_url: str
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    # Sessions stay queued unless the test asks for the in-process worker.
    worker: bool = False
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log_path: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self.port = self.port or free_port()
        env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "FERRYMAN_LOG_FORMAT": "json",
            "FERRYMAN_POLL_INTERVAL": "2",
            **self.env,
        }
        self.log_path = f"/tmp/ferryman-test-server-{self.port}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(self.port),
             *([] if self.worker else ["--no-worker"]), *self.args],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.logs()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            time.sleep(0.1)
        raise RuntimeError(f"server not ready in {timeout}s:\n{self.logs()}")

    def logs(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-5000:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def create_owner_key(database_url: str, owner: str | None = None) -> tuple[str, str]:
    """A fresh owner and an API key for it, written straight to the database."""
    owner = owner or f"owner-{uuid.uuid4().hex[:12]}"
    key = new_key()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO api_keys (id, owner_id, name, prefix, key_hash)"
            " VALUES (%s, %s, 'test', %s, %s)",
            (uuid.uuid4(), owner, key[:10], hash_key(key)),
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


CONTROL_EVENTS = frozenset({"caught_up", "resync_required", "message_delta"})


def ids(events: list[ServerSentEvent]) -> list[int]:
    """Ids of the durable events. httpx-sse, like EventSource, repeats the last id on control
    frames (the last-event-id buffer persists), so those are told apart by type."""
    return [int(e.id) for e in events if e.id and e.event not in CONTROL_EVENTS]


@contextlib.contextmanager
def running(server: ServerProcess) -> Iterator[ServerProcess]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class WorkerProcess:
    """`ferryman worker` in a child process (SIGKILL it to test recovery)."""

    database_url: str
    env: dict[str, str] = field(default_factory=dict)
    concurrency: int = 4
    proc: subprocess.Popen[bytes] | None = None
    log_path: str = ""

    def start(self) -> WorkerProcess:
        env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "FERRYMAN_LOG_FORMAT": "json",
            **self.env,
        }
        self.log_path = f"/tmp/ferryman-test-worker-{uuid.uuid4().hex[:8]}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", "worker", "--concurrency", str(self.concurrency)],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def logs(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-5000:]

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


async def wait_for_status(
    http: httpx.AsyncClient, session_id: str, statuses: set[str], timeout: float = 30.0
) -> dict[str, Any]:
    """Poll a session until its status is one of `statuses`."""
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = (await http.get(f"/api/agent/{session_id}")).json()
        if body.get("status") in statuses:
            return body
        if time.monotonic() > deadline:
            status = body.get("status")
            raise AssertionError(f"session {session_id} still {status} after {timeout}s")
        await asyncio.sleep(0.05)
