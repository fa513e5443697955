"""Local mode answers this machine's callers and pages only: a foreign Host (DNS rebinding), a
write from another site's page (Origin), a request through a proxy or from another machine are
refused, on a real server, with raw headers. Keys mode is not concerned."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.responses import PlainTextResponse
from starlette.types import Message, Receive, Scope, Send

from app.api.middleware import LocalOnly
from tests.support import (
    REPO,
    ServerProcess,
    assert_problem,
    client,
    free_port,
    missing,
    new_session,
    query,
    running,
)


async def count_sessions(database_url: str, prompt: str) -> int:
    rows = await query(
        database_url, "SELECT count(*) AS n FROM sessions WHERE prompt = %s", (prompt,)
    )
    return int(rows[0]["n"])


async def test_a_rebound_page_is_refused(server: ServerProcess, database_url: str) -> None:
    """The issue's request: another site's page whose name now resolves to 127.0.0.1."""
    prompt = f"rebinding {uuid.uuid4()}"
    headers = {"Host": "attacker.example", "Origin": "http://attacker.example"}
    async with client(server.url) as http:
        response = await http.post("/api/agent", json={"prompt": prompt}, headers=headers)
        assert_problem(response, 421, "HOST_NOT_ALLOWED")
        assert "FERRYMAN_LOCAL_HOSTS" in response.json()["detail"]
        # Reads and streams too: a rebound page could read their answers.
        for path in ("/api/agent", "/api/agent/owner-events", "/"):
            assert_problem(await http.get(path, headers=headers), 421, "HOST_NOT_ALLOWED")
    assert await count_sessions(database_url, prompt) == 0


FOREIGN_HOSTS = [
    "attacker.example",
    "attacker.example:{port}",
    "localhost.attacker.example:{port}",
    "127.0.0.1.nip.io:{port}",
    "0.0.0.0:{port}",  # the address some browsers let pages reach this machine by
    "192.0.2.2:{port}",
    "[::2]:{port}",
    "[::1",
    "localhost:http",
    "evil.example:{port}@localhost",
]
LOCAL_HOSTS = [
    "localhost",
    "localhost:{port}",
    "LocalHost.:{port}",
    "workbench.localhost:{port}",
    "127.0.0.1",
    "127.0.0.2:{port}",
    "[::1]:{port}",
    "[::ffff:127.0.0.1]:{port}",
]


@pytest.mark.parametrize(
    ("host", "local"), [*((h, False) for h in FOREIGN_HOSTS), *((h, True) for h in LOCAL_HOSTS)]
)
async def test_host_names(server: ServerProcess, host: str, local: bool) -> None:
    async with client(server.url) as http:
        response = await http.get("/api/agent", headers={"Host": host.format(port=server.port)})
    if local:
        assert response.status_code == 200, response.text
    else:
        assert_problem(response, 421, "HOST_NOT_ALLOWED")


async def test_a_request_without_host_is_served(server: ServerProcess) -> None:
    """HTTP/1.0 has no Host; no browser sends such a request, and the peer is local."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
    await writer.drain()
    status = await reader.readline()
    writer.close()
    assert status.split()[1] == b"200", status


@pytest.mark.parametrize(
    "origin",
    [
        "https://attacker.example",
        "http://localhost.attacker.example",
        "null",  # a sandboxed frame, a file:// page, a redirect across sites
        "chrome-extension://abcdefghijklmnop",
        "http://0.0.0.0:8000",
    ],
)
async def test_writes_from_another_sites_page_are_refused(
    server: ServerProcess, database_url: str, origin: str
) -> None:
    prompt = f"cross-site {uuid.uuid4()}"
    headers = {"Origin": origin}
    async with client(server.url) as http:
        session_id = await new_session(http, "a session of the local owner")
        writes = [
            http.post("/api/agent", json={"prompt": prompt}, headers=headers),
            http.patch(f"/api/agent/{session_id}", json={"title": prompt}, headers=headers),
            http.post(f"/api/agent/{session_id}/messages", json={"text": "x"}, headers=headers),
            http.post(f"/api/agent/{session_id}/cancel", headers=headers),
            http.delete(f"/api/agent/{session_id}", headers=headers),
        ]
        for response in await asyncio.gather(*writes):
            body = assert_problem(response, 403, "CROSS_SITE_REQUEST")
            assert origin in body["detail"]
        # Reads pass: without CORS headers the page cannot see the answer.
        session = await http.get(f"/api/agent/{session_id}", headers=headers)
        assert session.status_code == 200
        assert session.json()["status"] == "queued" and session.json()["title"] != prompt
    assert await count_sessions(database_url, prompt) == 0


@pytest.mark.parametrize(
    "origin",
    ["http://127.0.0.1:{port}", "http://localhost:3000", "https://app.localhost", "http://[::1]"],
)
async def test_writes_from_this_machines_pages(server: ServerProcess, origin: str) -> None:
    """The workbench (same origin), and other local pages: local mode trusts this machine."""
    async with client(server.url) as http:
        headers = {"Origin": origin.format(port=server.port)}
        response = await http.post("/api/agent", json={"prompt": "local"}, headers=headers)
        assert response.status_code == 201, response.text
        assert (await http.get("/", headers=headers)).status_code == 200


@pytest.mark.parametrize(
    "header",
    [
        ("X-Forwarded-For", "203.0.113.7"),
        ("X-Forwarded-Host", "ferryman.example.com"),
        ("Forwarded", "for=203.0.113.7;proto=https"),
        ("X-Real-IP", "203.0.113.7"),
        ("Via", "1.1 proxy"),
    ],
)
async def test_requests_through_a_proxy_are_refused(
    server: ServerProcess, header: tuple[str, str]
) -> None:
    """A proxy on this machine makes every caller look local; one that says so is refused."""
    async with client(server.url) as http:
        response = await http.get("/api/agent", headers=dict([header]))
    body = assert_problem(response, 403, "LOCAL_MODE_NOT_LOCAL")
    assert "FERRYMAN_AUTH=keys" in body["detail"]


async def test_extra_local_hosts(database_url: str) -> None:
    env = {"FERRYMAN_LOCAL_HOSTS": "ferryman.internal, Notes.Test"}
    with running(ServerProcess(database_url, env=env)) as proc:
        async with client(proc.url) as http:
            ok = await http.get("/api/agent", headers={"Host": f"ferryman.internal:{proc.port}"})
            assert ok.status_code == 200, ok.text
            headers = {"Origin": "https://notes.test"}
            created = await http.post("/api/agent", json={"prompt": "x"}, headers=headers)
            assert created.status_code == 201, created.text
            refused = await http.get("/api/agent", headers={"Host": "attacker.example"})
            assert_problem(refused, 421, "HOST_NOT_ALLOWED")


async def test_keys_mode_is_not_concerned(database_url: str, owner_key: tuple[str, str]) -> None:
    """With keys, a request acts for its key's owner alone: no Host or Origin rule applies."""
    headers = {
        "Host": "ferryman.example.com",
        "Origin": "https://app.example.com",
        "X-Forwarded-For": "203.0.113.7",
    }
    with running(ServerProcess(database_url, env={"FERRYMAN_AUTH": "keys"})) as proc:
        async with client(proc.url, owner_key[1]) as http:
            created = await http.post("/api/agent", json={"prompt": "x"}, headers=headers)
            assert created.status_code == 201, created.text
        async with client(proc.url) as http:
            anonymous = await http.get("/api/agent")
            assert_problem(anonymous, 401, "AUTH_REQUIRED")


# --- the peer's address: the app itself, whatever runs it ----------------------------------


async def _ok(scope: Scope, receive: Receive, send: Send) -> None:
    await PlainTextResponse("ok")(scope, receive, send)


async def answer(peer: tuple[str, int] | None) -> tuple[int, dict[str, Any] | None]:
    """The status (and problem, if refused) local mode gives a request from `peer`, as an ASGI
    server would pass it (None: a Unix socket, which has no peer address)."""
    scope: Scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "headers": [(b"host", b"localhost:8000")],
        "client": peer,
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await LocalOnly(_ok)(scope, receive, send)
    status = sent[0]["status"]
    return status, json.loads(sent[1]["body"]) if status != 200 else None


@pytest.mark.parametrize(
    "peer",
    [("127.0.0.1", 50000), ("127.9.9.9", 50000), ("::1", 50000), ("::ffff:127.0.0.1", 50000)],
)
async def test_loopback_peers_are_served(peer: tuple[str, int]) -> None:
    assert await answer(peer) == (200, None)


@pytest.mark.parametrize(
    "peer",
    [
        ("192.0.2.7", 50000),
        ("::ffff:192.0.2.7", 50000),
        ("2001:db8::7", 50000),
        ("testclient", 50000),  # not an address at all
        None,  # a Unix socket: most likely a proxy's
    ],
)
async def test_other_peers_are_refused(peer: tuple[str, int] | None) -> None:
    status, body = await answer(peer)
    assert status == 403
    assert body is not None and body["code"] == "LOCAL_MODE_NOT_LOCAL"


def _address_of_this_machine() -> str | None:
    """A non-loopback IPv4 address of this machine (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address: str = sock.getsockname()[0]
    return None if address.startswith("127.") else address


@contextlib.contextmanager
def under_uvicorn(database_url: str, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """The app as another ASGI server runs it: uvicorn's own command, on every address, with
    the settings left at their defaults (so local mode)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FERRYMAN_AUTH", "FERRYMAN_HOST")}
    env["DATABASE_URL"] = database_url
    command = [sys.executable, "-m", "uvicorn", "--factory", "app.main:create_app"]
    proc = subprocess.Popen(
        [*command, "--host", "0.0.0.0", "--port", str(port)],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            raise AssertionError("uvicorn did not serve the app")
        yield proc
    finally:
        proc.terminate()
        proc.wait(15)


async def test_under_another_server_on_every_address(database_url: str) -> None:
    """The issue's case: `ferryman serve` refuses local mode on 0.0.0.0, but another ASGI
    server does not know to. The app itself then serves this machine alone."""
    address = _address_of_this_machine()
    if address is None:
        missing("this machine has no address but loopback", "this test (CI machines have one)")
    port = free_port()
    with under_uvicorn(database_url, port):
        async with httpx.AsyncClient(timeout=10) as http:
            local = await http.get(f"http://127.0.0.1:{port}/api/agent")
            assert local.status_code == 200, local.text
            remote = await http.get(f"http://{address}:{port}/api/agent")
            body = assert_problem(remote, 403, "LOCAL_MODE_NOT_LOCAL")
            assert address in body["detail"]
