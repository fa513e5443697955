"""Streamable-HTTP MCP servers that restart or go away while the worker is idle, and servers
whose tools change: real server processes (tests/mcp_servers/notes_server.py), killed and
started again on the same port. Each runs in both protocol eras: `--legacy` speaks only the
2025 protocol, whose session a restarted server no longer knows (404); the default speaks the
2026 one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.agent.tools import ToolError
from app.agent.tools.mcp import McpServer, McpServerConfig
from tests.support import (
    TERMINAL,
    ServerProcess,
    StartWorker,
    client,
    free_port,
    new_session,
    of_type,
    ready,
    transcript,
    wait_for_status,
)
from tests.test_mcp_tools import connected, events, http_notes_server, until

TOKEN = "s3cret"
ERAS = pytest.mark.parametrize("era", [("--legacy",), ()], ids=["2025", "2026"])


def http_config(port: int, **policy: Any) -> McpServerConfig:
    return McpServerConfig(
        name="remote",
        transport="http",
        url=f"http://127.0.0.1:{port}/mcp",
        headers={"Authorization": f"Bearer {TOKEN}"},
        **policy,
    )


def calls(log: Path, tool: str) -> list[dict[str, object]]:
    return [e for e in events(log) if e["event"] == "call" and e["tool"] == tool]


@contextlib.asynccontextmanager
async def killed_after_a_call(
    tmp_path: Path, era: tuple[str, ...]
) -> AsyncIterator[tuple[McpServer, int, Path]]:
    """A connected server whose process answered one `echo` and was then killed."""
    port, log = free_port(), tmp_path / "http.jsonl"
    with http_notes_server(port, log, TOKEN, *era) as first:
        async with connected(http_config(port)) as server:
            assert await server.call("echo", {"text": "before"}) == "before"
            first.kill()
            first.wait()
            yield server, port, log


@ERAS
async def test_a_server_restarted_while_idle_answers_the_next_call(
    tmp_path: Path, era: tuple[str, ...]
) -> None:
    async with killed_after_a_call(tmp_path, era) as (server, port, log):
        with http_notes_server(port, log, TOKEN, *era):
            answer = await asyncio.wait_for(server.call("echo", {"text": "after"}), 20)
            assert answer == "after"
            assert [c["args"] for c in calls(log, "echo")][-1] == {"text": "after"}
            assert len(calls(log, "echo")) == 2  # sent once to the server that answered


@ERAS
async def test_a_call_made_while_the_server_is_down_is_sent_when_it_is_back(
    tmp_path: Path, era: tuple[str, ...]
) -> None:
    async with killed_after_a_call(tmp_path, era) as (server, port, log):
        waiting = asyncio.create_task(server.call("add", {"a": 2, "b": 2}))
        await asyncio.sleep(1)
        assert not waiting.done()
        with http_notes_server(port, log, TOKEN, *era):
            assert await asyncio.wait_for(waiting, 20) == "4"
        assert len(calls(log, "add")) == 1
        # Stays down: the call waits within its budget, then fails; nothing was run.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(server.call("add", {"a": 3, "b": 3}), 2)
        assert len(calls(log, "add")) == 1


@ERAS
async def test_a_call_the_server_died_under_is_not_sent_again(
    tmp_path: Path, era: tuple[str, ...]
) -> None:
    port, log = free_port(), tmp_path / "http.jsonl"
    with http_notes_server(port, log, TOKEN, *era):
        async with connected(http_config(port)) as server:
            with pytest.raises(ToolError, match="may or may not have taken effect"):
                await server.call("crash", {})
            with http_notes_server(port, log, TOKEN, *era):
                assert await asyncio.wait_for(server.call("echo", {"text": "x"}), 20) == "x"
                assert len(calls(log, "crash")) == 1


@ERAS
async def test_changed_tools_are_listed_again(tmp_path: Path, era: tuple[str, ...]) -> None:
    port, log = free_port(), tmp_path / "http.jsonl"
    published: list[set[str]] = []
    with http_notes_server(port, log, TOKEN, *era):
        async with connected(http_config(port)) as server:
            server._on_tools = lambda s: published.append({t.name for t in s.tools})
            assert "remote__greet" not in {t.name for t in server.tools}
            assert await server.call("add_tool", {"name": "greet"}) == "added greet"
            await until(lambda: bool(published) and "remote__greet" in published[-1])
            assert await server.call("greet", {}) == "greet"


# --- a whole worker ---------------------------------------------------------------------------


async def test_a_worker_follows_a_server_that_changes_and_goes_away(
    api: ServerProcess, key: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    """A tool the server adds reaches GET /api/tools and a session can call it; a server that
    stays down fails a call within the tool's budget and the session goes on."""
    port, log = free_port(), tmp_path / "http.jsonl"
    config = http_config(port, timeoutSeconds=3).model_dump(exclude_none=True)
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"servers": [config]}))
    with http_notes_server(port, log, TOKEN, "--legacy") as proc:
        await ready(start_worker({"FERRYMAN_MCP_SERVERS": str(path)}))
        async with client(api.url, key) as http:
            add = {"name": "remote__add_tool", "arguments": {"name": "greet"}}
            sid = await new_session(http, script=[{"toolCalls": [add]}, {"text": "done"}])
            assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
            deadline = time.monotonic() + 10
            while "remote__greet" not in {
                t["name"] for t in (await http.get("/api/tools")).json()["tools"]
            }:
                assert time.monotonic() < deadline, "the added tool is not in the catalog"
                await asyncio.sleep(0.1)
            greet = {"name": "remote__greet", "arguments": {}}
            sid = await new_session(http, script=[{"toolCalls": [greet]}, {"text": "done"}])
            assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
            (result,) = of_type(await transcript(http, sid), "tool_result")
            assert result["data"]["content"] == "greet" and result["data"]["isError"] is False

            proc.kill()
            proc.wait()
            echo = {"name": "remote__echo", "arguments": {"text": "anyone?"}}
            started = time.monotonic()
            sid = await new_session(http, script=[{"toolCalls": [echo]}, {"text": "went on"}])
            assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
            assert time.monotonic() - started < 15
            (result,) = of_type(await transcript(http, sid), "tool_result")
            assert result["data"]["isError"] is True
            assert "3 s budget" in result["data"]["content"]
