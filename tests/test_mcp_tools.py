"""MCP tools (SPEC section 6.2) against real MCP servers: the test server of
tests/mcp_servers/notes_server.py over stdio and streamable HTTP, and the published
`mcp-server-time`. First the config and the pure parts, then `McpServer` in this process, then
whole sessions on real worker processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp_types import (
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)

from app.agent.tools import ToolError
from app.agent.tools.mcp import (
    McpConfigError,
    McpServer,
    McpServerConfig,
    load_config,
    offered_name,
    result_text,
)
from tests.support import (
    REPO,
    TERMINAL,
    WORKER_ENV,
    ServerProcess,
    StartWorker,
    WorkerProcess,
    client,
    free_port,
    new_session,
    of_type,
    ready,
    transcript,
    wait_event,
    wait_for_status,
)

NOTES_SERVER = ["-m", "tests.mcp_servers.notes_server"]

# --- the config -----------------------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_toml_config(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "mcp.toml",
        """
        [[servers]]
        name = "notes"
        transport = "stdio"
        command = "python"
        args = ["-m", "notes"]
        env = { TOKEN = "t" }
        idempotent = true
        timeoutSeconds = 5
        requireApproval = ["crash"]

        [[servers]]
        name = "remote"
        transport = "http"
        url = "https://tools.example/mcp"
        headers = { Authorization = "Bearer x" }
        """,
    )
    notes, remote = load_config(path)
    assert notes.command == "python" and notes.args == ["-m", "notes"]
    assert notes.env == {"TOKEN": "t"} and notes.timeoutSeconds == 5
    assert notes.applies(notes.idempotent, "echo")
    assert notes.applies(notes.requireApproval, "crash")
    assert notes.applies(notes.requireApproval, "crash")
    assert not notes.applies(notes.requireApproval, "echo")
    assert remote.url == "https://tools.example/mcp"
    assert not remote.applies(remote.idempotent, "anything")  # not idempotent by default


def test_a_json_config(tmp_path: Path) -> None:
    config = {"servers": [{"name": "t", "transport": "stdio", "command": "mcp-server-time"}]}
    (server,) = load_config(write(tmp_path, "mcp.json", json.dumps(config)))
    assert server.name == "t"


def test_approval_can_name_the_offered_tool(tmp_path: Path) -> None:
    server = McpServerConfig(
        name="notes", transport="stdio", command="x", requireApproval=["notes__add"]
    )
    assert server.applies(server.requireApproval, "add")


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("mcp.yaml", "servers: []", "use a .toml or .json file"),
        ("mcp.toml", "servers = [", "is not valid TOML"),
        ("mcp.json", "{", "is not valid JSON"),
        ("mcp.json", '{"servers": [{"name": "a", "transport": "stdio"}]}', "needs a `command`"),
        ("mcp.json", '{"servers": [{"name": "a", "transport": "http"}]}', "needs a `url`"),
        (
            "mcp.json",
            '{"servers": [{"name": "a b", "transport": "stdio", "command": "x"}]}',
            "servers.0.name",
        ),
        (
            "mcp.json",
            '{"servers": [{"name": "a", "transport": "ftp", "command": "x"}]}',
            "servers.0.transport",
        ),
        (
            "mcp.json",
            '{"servers": [{"name": "a", "transport": "stdio", "command": "x", "url": "http://x"}]}',
            "for http servers",
        ),
        (
            "mcp.json",
            '{"servers": [{"name": "a", "transport": "stdio", "command": "x"},'
            ' {"name": "a", "transport": "stdio", "command": "y"}]}',
            "must be unique: a",
        ),
        ("mcp.json", '{"servers": [], "extra": 1}', "extra"),
    ],
)
def test_bad_configs_say_what_is_wrong(tmp_path: Path, name: str, text: str, says: str) -> None:
    with pytest.raises(McpConfigError) as raised:
        load_config(write(tmp_path, name, text))
    assert says in str(raised.value)


def test_a_missing_config_file() -> None:
    with pytest.raises(McpConfigError, match="cannot read"):
        load_config(Path("/nonexistent/mcp.toml"))


def test_offered_names_are_namespaced_and_safe() -> None:
    assert offered_name("notes", "echo") == "notes__echo"
    assert offered_name("fs", "read.file/v2") == "fs__read_file_v2"
    assert len(offered_name("s", "x" * 100)) == 64


def test_results_become_text() -> None:
    def result(*blocks: Any, structured: Any = None, error: bool = False) -> CallToolResult:
        return CallToolResult(content=list(blocks), structured_content=structured, is_error=error)

    assert (
        result_text(result(TextContent(type="text", text="a"), TextContent(type="text", text="b")))
        == "a\nb"
    )
    assert result_text(result(structured={"result": 42})) == '{"result": 42}'
    image = ImageContent(type="image", data="aGk=", mime_type="image/png")
    assert result_text(result(image)) == "[image image/png]"
    resource = EmbeddedResource(
        type="resource", resource=TextResourceContents(uri="file:///a", text="inside")
    )
    assert result_text(result(resource)) == "inside"


# --- McpServer against real servers -------------------------------------------------------


def events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def stdio_config(log: Path, **policy: Any) -> McpServerConfig:
    return McpServerConfig(
        name="notes",
        transport="stdio",
        command=sys.executable,
        args=NOTES_SERVER,
        cwd=REPO,
        env={"NOTES_SERVER_LOG": str(log)},
        **policy,
    )


@contextlib.asynccontextmanager
async def connected(config: McpServerConfig) -> Any:
    server = McpServer(config, restart_cap=0.5)
    server.start()
    try:
        assert await server.wait_connected(20), "the MCP server did not come up"
        yield server
    finally:
        await server.stop()


async def test_stdio_tools_are_listed_and_called(tmp_path: Path) -> None:
    log = tmp_path / "notes.jsonl"
    async with connected(stdio_config(log, requireApproval=["crash"], timeoutSeconds=7)) as server:
        tools = {t.name: t for t in server.tools}
        assert set(tools) == {
            "notes__echo",
            "notes__add",
            "notes__slow",
            "notes__fail",
            "notes__crash",
            "notes__add_tool",
        }
        echo = tools["notes__echo"]
        assert echo.source == "mcp:notes" and echo.timeout == 7
        assert echo.parameters["required"] == ["text"]
        assert not echo.idempotent and not echo.requires_approval
        assert tools["notes__crash"].requires_approval
        assert await server.call("echo", {"text": "hello"}) == "hello"
        assert await server.call("add", {"a": 2, "b": 40}) == "42"
        with pytest.raises(ToolError, match="fail was asked to fail"):
            await server.call("fail", {})
    assert [e["event"] for e in events(log)][:1] == ["start"]


async def test_cancelling_a_call_cancels_it_on_the_server(tmp_path: Path) -> None:
    log = tmp_path / "notes.jsonl"
    async with connected(stdio_config(log)) as server:
        call = asyncio.create_task(server.call("slow", {"seconds": 30}))
        await until(lambda: any(e.get("tool") == "slow" for e in events(log)))
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        await until(lambda: {"event": "cancelled", "tool": "slow"} in events(log))
        assert await server.call("echo", {"text": "still here"}) == "still here"


async def test_a_server_that_dies_is_restarted(tmp_path: Path) -> None:
    log = tmp_path / "notes.jsonl"
    async with connected(stdio_config(log)) as server:
        with pytest.raises(ToolError, match="went away during the call"):
            await server.call("crash", {})
        # The next call waits for the restart instead of failing.
        assert await server.call("echo", {"text": "after the crash"}) == "after the crash"
        # Killed while idle: noticed without a call, and started again.
        pid = [e for e in events(log) if e["event"] == "start"][-1]["pid"]
        os.kill(pid, signal.SIGKILL)
        await until(lambda: len([e for e in events(log) if e["event"] == "start"]) == 3)
        assert await server.call("add", {"a": 1, "b": 1}) == "2"
        assert server.restarts >= 2


@contextlib.contextmanager
def http_notes_server(
    port: int, log: Path, token: str, *flags: str
) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "NOTES_SERVER_LOG": str(log), "NOTES_SERVER_TOKEN": token}
    proc = subprocess.Popen(
        [sys.executable, *NOTES_SERVER, "--transport", "http", "--port", str(port), *flags],
        cwd=REPO,
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
                break
            assert proc.poll() is None and time.monotonic() < deadline, "no HTTP MCP server"
            time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait()


async def test_streamable_http_with_headers_and_a_restart(tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "http.jsonl"
    config = McpServerConfig(
        name="remote",
        transport="http",
        url=f"http://127.0.0.1:{port}/mcp",
        headers={"Authorization": "Bearer s3cret"},
    )
    with http_notes_server(port, log, "s3cret"):
        async with connected(config) as server:
            assert {t.name for t in server.tools} >= {"remote__echo", "remote__add"}
            assert await server.call("echo", {"text": "over http"}) == "over http"
            with pytest.raises(ToolError):
                await server.call("crash", {})
            waiting = asyncio.create_task(server.call("echo", {"text": "back"}))
            await asyncio.sleep(0.5)
            assert not waiting.done()
            with http_notes_server(port, log, "s3cret"):
                assert await asyncio.wait_for(waiting, 20) == "back"


async def test_a_refused_http_server_is_not_connected(tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "http.jsonl"
    config = McpServerConfig(
        name="remote", transport="http", url=f"http://127.0.0.1:{port}/mcp", headers={}
    )
    with http_notes_server(port, log, "s3cret"):  # wants a token this config does not send
        server = McpServer(config, restart_cap=0.2)
        server.start()
        try:
            assert not await server.wait_connected(2)
            assert server.tools == []
        finally:
            await server.stop()


async def test_the_published_time_server() -> None:
    config = McpServerConfig(
        name="time",
        transport="stdio",
        command=sys.executable,
        args=["-m", "mcp_server_time", "--local-timezone", "UTC"],
    )
    async with connected(config) as server:
        names = {t.name for t in server.tools}
        assert names == {"time__get_current_time", "time__convert_time"}
        answer = json.loads(
            await server.call(
                "convert_time",
                {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
            )
        )
        assert answer["target"]["datetime"].startswith(answer["source"]["datetime"][:10])
        assert "T21:00" in answer["target"]["datetime"]
        with pytest.raises(ToolError):
            await server.call("get_current_time", {"timezone": "Mars/Olympus"})


# --- whole sessions on worker processes -----------------------------------------------------


@pytest.fixture
def mcp_config(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "notes.jsonl"
    config = {
        "servers": [
            {
                "name": "notes",
                "transport": "stdio",
                "command": sys.executable,
                "args": NOTES_SERVER,
                "cwd": REPO,
                "env": {"NOTES_SERVER_LOG": str(log)},
                "requireApproval": ["add"],
                "timeoutSeconds": 1.5,
            }
        ]
    }
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(config))
    return path, log


async def test_sessions_use_mcp_tools(
    api: ServerProcess, key: str, start_worker: StartWorker, mcp_config: tuple[Path, Path]
) -> None:
    path, log = mcp_config
    await ready(start_worker({"FERRYMAN_MCP_SERVERS": str(path)}))
    async with client(api.url, key) as http:
        listed = {t["name"]: t for t in (await http.get("/api/tools")).json()["tools"]}
        assert listed["notes__echo"]["source"] == "mcp:notes"
        assert listed["notes__add"]["requiresApproval"] is True
        assert listed["notes__echo"]["requiresApproval"] is False
        assert listed["put_note"]["source"] == "builtin"

        call = {"name": "notes__echo", "arguments": {"text": "via MCP"}}
        sid = await new_session(http, script=[{"toolCalls": [call]}, {"text": "done"}])
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
        (result,) = of_type(await transcript(http, sid), "tool_result")
        assert result["data"]["content"] == "via MCP" and result["data"]["isError"] is False

        # Approval by the server's config.
        add = {"name": "notes__add", "arguments": {"a": 1, "b": 2}}
        sid = await new_session(http, script=[{"toolCalls": [add]}, {"text": "done"}])
        await wait_for_status(http, sid, {"waiting"})
        request = of_type(await transcript(http, sid), "tool_approval_requested")[0]["data"]
        decided = await http.post(
            f"/api/agent/{sid}/tool-calls/{request['toolCallId']}/approval",
            json={"approved": True},
        )
        assert decided.status_code == 202
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
        (result,) = of_type(await transcript(http, sid), "tool_result")
        assert result["data"]["content"] == "3"

        # The server's own timeout: the call is cancelled on the server too.
        slow = {"name": "notes__slow", "arguments": {"seconds": 30}}
        sid = await new_session(http, script=[{"toolCalls": [slow]}, {"text": "done"}])
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
        (result,) = of_type(await transcript(http, sid), "tool_result")
        assert result["data"]["timedOut"] is True
        await until(lambda: {"event": "cancelled", "tool": "slow"} in events(log))


async def test_cancelling_a_session_cancels_its_mcp_call(
    api: ServerProcess, key: str, start_worker: StartWorker, mcp_config: tuple[Path, Path]
) -> None:
    path, log = mcp_config
    config = json.loads(path.read_text())
    config["servers"][0]["timeoutSeconds"] = 60
    path.write_text(json.dumps(config))
    await ready(start_worker({"FERRYMAN_MCP_SERVERS": str(path)}))
    slow = {"name": "notes__slow", "arguments": {"seconds": 30}}
    async with client(api.url, key) as http:
        sid = await new_session(http, script=[{"toolCalls": [slow]}])
        await wait_event(http, sid, lambda e: e["type"] == "tool_call_start")
        await until(lambda: any(e.get("tool") == "slow" for e in events(log)))
        started = time.monotonic()
        answer = await http.post(f"/api/agent/{sid}/cancel", params={"wait": "true"})
        assert answer.json()["status"] == "cancelled"
        assert time.monotonic() - started < 3
    await until(lambda: {"event": "cancelled", "tool": "slow"} in events(log))


def test_a_bad_config_stops_the_worker_with_a_message(isolated_db: str, tmp_path: Path) -> None:
    path = write(tmp_path, "mcp.json", '{"servers": [{"name": "x", "transport": "stdio"}]}')
    env = {**os.environ, "DATABASE_URL": isolated_db, "FERRYMAN_MCP_SERVERS": str(path)}
    done = subprocess.run(
        [sys.executable, "-m", "app", "worker"], env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 2
    err = done.stderr.decode()
    assert "FERRYMAN_MCP_SERVERS" in err and "needs a `command`" in err
    assert "Traceback" not in err


def test_a_missing_command_is_named_and_fails_at_once(isolated_db: str, tmp_path: Path) -> None:
    """The worker says which command is not there and where it is configured, and does not
    wait out FERRYMAN_MCP_CONNECT_TIMEOUT for a server that cannot start."""
    path = write(
        tmp_path,
        "mcp.json",
        json.dumps(
            {"servers": [{"name": "ghost", "transport": "stdio", "command": "ferryman-ghost-mcp"}]}
        ),
    )
    worker = WorkerProcess(
        isolated_db,
        env={**WORKER_ENV, "FERRYMAN_MCP_SERVERS": str(path), "FERRYMAN_MCP_CONNECT_TIMEOUT": "60"},
    ).start()
    try:
        started = time.monotonic()
        asyncio.run(ready(worker, timeout=60))
        assert time.monotonic() - started < 20
        logs = worker.logs()
        assert "'ferryman-ghost-mcp' is not on PATH" in logs, logs
        assert f"fix `command` of server 'ghost' in {path}" in logs, logs
        assert "not up after" not in logs
    finally:
        worker.stop()


async def tool_list(http: httpx.AsyncClient) -> tuple[dict[str, dict[str, Any]], int]:
    body = (await http.get("/api/tools")).json()
    return {t["name"]: t for t in body["tools"]}, body["workers"]


async def test_the_catalog_is_the_live_workers_tools(
    api: ServerProcess, key: str, start_worker: StartWorker, mcp_config: tuple[Path, Path]
) -> None:
    """A worker's tools leave GET /api/tools when it stops or dies; each tool says how many
    live workers offer it. A session may still name the tools of a worker seen lately."""
    path, _ = mcp_config
    plain = start_worker()
    with_mcp = start_worker({"FERRYMAN_MCP_SERVERS": str(path)})
    await ready(plain, with_mcp)
    async with client(api.url, key) as http:
        tools, workers = await tool_list(http)
        assert workers == 2
        assert tools["put_note"]["workers"] == 2
        assert tools["notes__echo"]["workers"] == 1
        assert tools["notes__echo"]["source"] == "mcp:notes"

        with_mcp.stop()  # stopped: marks itself stopped
        tools, workers = await tool_list(http)
        assert workers == 1 and "notes__echo" not in tools
        assert tools["put_note"]["workers"] == 1

        # Seen a moment ago: its tools are names a session may still use (a deploy), a
        # misspelling of them is not.
        accepted = await http.post("/api/agent", json={"prompt": "x", "tools": ["notes__echo"]})
        assert accepted.status_code == 201, accepted.text
        await http.post(f"/api/agent/{accepted.json()['id']}/cancel")
        refused = await http.post("/api/agent", json={"prompt": "x", "tools": ["notes__ecoh"]})
        assert refused.status_code == 422
        assert "'notes__ecoh' (closest: notes__echo" in refused.json()["detail"]

        killed = start_worker({"FERRYMAN_MCP_SERVERS": str(path)})
        await ready(killed)
        assert (await tool_list(http))[0]["notes__echo"]["workers"] == 1
        killed.signal(signal.SIGKILL)  # dead: the survivor's death watch reaps it at once
        deadline = time.monotonic() + 5
        while "notes__echo" in (await tool_list(http))[0]:
            assert time.monotonic() < deadline, "a dead worker's tools are still listed"
            await asyncio.sleep(0.1)
        assert (await tool_list(http))[1] == 1


async def test_a_session_naming_a_tool_runs_only_on_a_worker_that_offers_it(
    api: ServerProcess, key: str, start_worker: StartWorker, mcp_config: tuple[Path, Path]
) -> None:
    path, _ = mcp_config
    # A worker with the tool was seen a moment ago, so a session may name it.
    seen = start_worker({"FERRYMAN_MCP_SERVERS": str(path)})
    await ready(seen)
    seen.stop()
    plain = start_worker()
    await ready(plain)
    echo = {"name": "notes__echo", "arguments": {"text": "on B"}}
    async with client(api.url, key) as http:
        named = await new_session(
            http, script=[{"toolCalls": [echo]}, {"text": "done"}], tools=["notes__echo"]
        )
        anywhere = await new_session(http, "no tools named")
        assert (await wait_for_status(http, anywhere, TERMINAL))["status"] == "succeeded"
        await asyncio.sleep(2)  # ten claim intervals of the worker without the tool
        assert (await http.get(f"/api/agent/{named}")).json()["status"] == "queued"

        with_mcp = start_worker({"FERRYMAN_MCP_SERVERS": str(path)})
        await ready(with_mcp)
        assert (await wait_for_status(http, named, TERMINAL))["status"] == "succeeded"
        events = await transcript(http, named)
    (start,) = of_type(events, "session_start")
    assert start["data"]["pid"] == with_mcp.pid
    (result,) = of_type(events, "tool_result")
    assert result["data"]["content"] == "on B"
