"""`serve --processes N`: N full API processes share one port (SO_REUSEPORT); a stream served
by one sees writes made through another; SIGTERM stops them all."""

from __future__ import annotations

import asyncio
import os

from tests.support import ServerProcess, client, create_owner_key, running, sse


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            children.extend(int(child) for child in f.read().split())
    return children


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in f.read()
    except FileNotFoundError:
        return False


async def test_processes_share_the_port(database_url: str) -> None:
    _, key = create_owner_key(database_url)
    server = ServerProcess(database_url, args=["--processes", "2"])
    with running(server):
        assert server.proc is not None
        children = _children(server.proc.pid)
        assert len(children) == 2
        async with client(server.url, key) as http:
            cursor = (await http.get("/api/agent")).json()["cursor"]
            async with sse(http, "/api/agent/owner-events", last_event_id=cursor) as events:
                # New connections land on either process; every write reaches this stream.
                for index in range(10):
                    async with client(server.url, key) as writer:
                        await writer.post("/api/agent", json={"prompt": f"p{index}"})
                seen = []
                async with asyncio.timeout(10):
                    async for event in events:
                        if event.event == "session_created":
                            seen.append(int(event.id))
                        if len(seen) == 10:
                            break
        assert seen == list(range(int(cursor) + 1, int(cursor) + 11))
    assert server.proc.returncode == 0
    for child in children:
        assert not _alive(child)
