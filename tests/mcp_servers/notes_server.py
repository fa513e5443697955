"""A tiny MCP server for Ferryman's MCP client tests (built on mcp 2.x `MCPServer`).

Run over stdio:  python -m tests.mcp_servers.notes_server --transport stdio
Run over HTTP:   python -m tests.mcp_servers.notes_server --transport http --port N
                 (streamable HTTP at http://127.0.0.1:N/mcp; --port 0 picks a free port,
                 which is reported in the "start" event and on stderr)
                 --legacy: speak only the 2025 protocol, whose sessions (Mcp-Session-Id) a
                 restarted server no longer knows, as most deployed servers do

Environment:
  NOTES_SERVER_LOG    file to append one JSON line per event to:
                      {"event": "start", "pid": ..., "transport": ..., "port": ...}
                      {"event": "call", "tool": ..., "args": {...}}
                      {"event": "cancelled", "tool": ...}   (the in-flight call was cancelled)
  NOTES_SERVER_TOKEN  HTTP only: refuse (401) requests without "Authorization: Bearer <token>".
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

LOG_ENV = "NOTES_SERVER_LOG"
TOKEN_ENV = "NOTES_SERVER_TOKEN"

# WARNING keeps the expected `fail` tool error (logged at INFO by the SDK) off stderr.
server: MCPServer = MCPServer("notes", version="1.0", log_level="WARNING")


def record(event: str, **fields: Any) -> None:
    """Append one JSON event line to $NOTES_SERVER_LOG, if set (one write per line)."""
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"event": event, **fields}) + "\n")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    record("call", tool="echo", args={"text": text})
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Return a + b."""
    record("call", tool="add", args={"a": a, "b": b})
    return a + b


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep for `seconds`, then return "slept"."""
    record("call", tool="slow", args={"seconds": seconds})
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        # The SDK cancels the handler's scope on `notifications/cancelled` (stdio,
        # 2025 HTTP) or on the client closing the POST (2026 HTTP): prove it reached us.
        record("cancelled", tool="slow")
        raise
    return "slept"


@server.tool()
def fail() -> str:
    """Always fail: the call returns a result with isError=true."""
    record("call", tool="fail", args={})
    raise ToolError("fail was asked to fail")


@server.tool()
def crash() -> str:
    """Kill this server process at once (no response is ever sent)."""
    record("call", tool="crash", args={})
    os._exit(1)


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Register a tool `name` that answers its own name, and tell the client the list changed."""
    record("call", tool="add_tool", args={"name": name})

    def added() -> str:
        record("call", tool=name, args={})
        return name

    server.add_tool(added, name=name, description=f"added by add_tool: {name}")
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        await ctx.notify_tools_changed()  # to the client's subscriptions/listen stream
    else:
        await ctx.session.send_tool_list_changed()
    return f"added {name}"


class BearerGate:
    """ASGI wrapper refusing HTTP requests that lack `Authorization: Bearer <token>`."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        authorization = dict(scope.get("headers", [])).get(b"authorization")
        if scope["type"] == "http" and authorization != self.expected:
            await PlainTextResponse("unauthorized", status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)  # lifespan passes through: it runs the session manager


class LegacyOnly:
    """ASGI wrapper answering 2026 requests as a 2025-only server does (404: no such
    method), so the client falls back to the initialize handshake and a session."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = dict(scope.get("headers", [])).get(b"mcp-protocol-version")
        if (
            scope["type"] == "http"
            and version
            and version.decode() not in HANDSHAKE_PROTOCOL_VERSIONS
        ):
            await PlainTextResponse("not found", status_code=404)(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def serve_http(port: int, legacy: bool) -> None:
    import uvicorn

    app: ASGIApp = server.streamable_http_app()
    if legacy:
        app = LegacyOnly(app)
    if token := os.environ.get(TOKEN_ENV):
        app = BearerGate(app, token)
    # Bind the socket ourselves so --port 0 works and the real port can be reported.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    bound = sock.getsockname()[1]
    record("start", pid=os.getpid(), transport="http", port=bound)
    print(f"notes_server listening on http://127.0.0.1:{bound}/mcp", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--legacy", action="store_true")
    args = parser.parse_args()
    if args.transport == "stdio":
        record("start", pid=os.getpid(), transport="stdio")
        server.run("stdio")
    else:
        anyio.run(serve_http, args.port, args.legacy)


if __name__ == "__main__":
    main()
