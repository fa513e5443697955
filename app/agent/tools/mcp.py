"""Tools from Model Context Protocol servers (FERRYMAN_MCP_SERVERS).

Each configured server is one `McpServer`: a task of its own opens the connection (a stdio child
process, or streamable HTTP), lists the tools, and holds the connection until it ends, then
restarts it with backoff, and lists the tools again when the server says they changed
(`notifications/tools/list_changed`). Runs call through it from their own tasks. The MCP SDK's
transports are anyio task groups, which must be left by the task that entered them, so only
the owner task ever enters or leaves them; a call from inside that task would be cancelled, not
failed, if the transport broke.

The tools are offered to the model as `<server>__<tool>`, with the same timeout, cancel and
fencing as built-in tools: the runner's timeout or abort cancels the call, and the SDK tells the
server (`notifications/cancelled`). A call that never reached the server (its connection was
refused, or a restarted server no longer knew the session) is sent again once the server is
back; one that may have reached it is not.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import tomllib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
import httpx2
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.agent.tools.registry import Tool, ToolContext, ToolError
from app.backoff import Backoff

log = logging.getLogger(__name__)

SERVER_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,40}$"
# Model providers take function names of [A-Za-z0-9_-], at most 64 characters.
MAX_TOOL_NAME_CHARS = 64
SEPARATOR = "__"
SESSION_HEADER = "mcp-session-id"
CONNECTION_CLOSED = -32000  # the SDK's error for a request whose connection ended

_E = TypeVar("_E", bound=BaseException)


class _Delivery:
    """Whether one call's request is known not to have reached the server."""

    unsent = False


# Set by `McpServer.call`; the SDK runs each HTTP POST in the context of the task that sent
# the request, so the HTTP transport can tell that call what became of its request.
_delivery: ContextVar[_Delivery | None] = ContextVar("mcp_delivery", default=None)


class McpConfigError(ValueError):
    """FERRYMAN_MCP_SERVERS names a file that cannot be used; the message says why."""


# What a stdio server inherits from the worker, `env` then added: enough to find programs and
# a home, and none of the worker's secrets (DATABASE_URL, provider keys). Ours, not the SDK's
# default, which could grow.
INHERITED_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")


def stdio_environment(configured: dict[str, str]) -> dict[str, str]:
    """The environment of a stdio server whose config's `env` is `configured`."""
    inherited = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
    return inherited | configured


class McpServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=SERVER_NAME_PATTERN)
    transport: Literal["stdio", "http"]
    # stdio: the command, run without a shell, with a minimal environment (HOME, PATH, USER,
    # ...) plus `env`: the worker's own secrets are not handed to the server.
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    # http: the streamable HTTP endpoint and the headers to send (an Authorization, say).
    url: str | None = Field(default=None, pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict)
    # Policies: for every tool of the server, or for the tools named.
    idempotent: bool | list[str] = False
    requireApproval: bool | list[str] = False
    timeoutSeconds: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _fits_its_transport(self) -> McpServerConfig:
        if self.transport == "stdio" and not self.command:
            raise ValueError("a stdio server needs a `command`")
        if self.transport == "http" and not self.url:
            raise ValueError("an http server needs a `url`")
        if self.transport == "stdio" and (self.url or self.headers):
            raise ValueError("`url` and `headers` are for http servers")
        if self.transport == "http" and (self.command or self.args or self.env or self.cwd):
            raise ValueError("`command`, `args`, `env` and `cwd` are for stdio servers")
        return self

    def applies(self, policy: bool | list[str], tool: str) -> bool:
        """Whether a policy set for the server covers one of its tools (by its own name or
        the name the model sees)."""
        if isinstance(policy, bool):
            return policy
        return tool in policy or offered_name(self.name, tool) in policy


class McpConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    servers: list[McpServerConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names_are_unique(self) -> McpConfig:
        names = [server.name for server in self.servers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"server names must be unique: {', '.join(duplicates)}")
        return self


def load_config(path: Path) -> list[McpServerConfig]:
    """The servers a TOML or JSON config file lists."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise McpConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(raw.decode())
        elif path.suffix == ".json":
            data = json.loads(raw)
        else:
            raise McpConfigError(f"{path}: use a .toml or .json file")
        return McpConfig.model_validate(data).servers
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise McpConfigError(f"{path} is not valid {path.suffix[1:].upper()}: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or '(file)'}: {error['msg']}"
            for error in exc.errors()
        )
        raise McpConfigError(f"{path}: {problems}") from None


def offered_name(server: str, tool: str) -> str:
    """The name the model sees: `<server>__<tool>`, in the characters providers accept."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", tool)
    return f"{server}{SEPARATOR}{safe}"[:MAX_TOOL_NAME_CHARS]


def result_text(result: Any) -> str:
    """A `CallToolResult` as the text a tool result carries: its text blocks, a line for
    anything else, or the structured content when there is no text."""
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and hasattr(block.resource, "text"):
            parts.append(block.resource.text)
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        else:
            mime = getattr(block, "mime_type", None) or getattr(block, "mimeType", "")
            parts.append(f"[{kind} {mime}]".replace(" ]", "]"))
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content)
    return "\n".join(parts)


class McpServer:
    """One MCP server: its connection, held and restarted by an owner task, and its tools."""

    def __init__(
        self,
        config: McpServerConfig,
        on_tools: Callable[[McpServer], None] = lambda _: None,
        *,
        restart_cap: float = 30.0,
        config_file: Path | None = None,
    ) -> None:
        self.config = config
        self.config_file = config_file
        # Why the last connection attempt failed (None once one succeeds).
        self.last_error: str | None = None
        self.name = config.name
        self.source = f"mcp:{config.name}"
        self.tools: list[Tool] = []
        self.restarts = 0
        self._on_tools = on_tools
        self._client: Any = None
        self._ended = asyncio.Event()  # set when the current connection is known to be gone
        self._ready = asyncio.Event()
        self._tools_changed = asyncio.Event()
        self._attempted = asyncio.Event()  # set once a connection attempt succeeded or failed
        self._stop = asyncio.Event()
        self._owner: asyncio.Task[None] | None = None
        self._backoff = Backoff(first=0.25, cap=restart_cap)

    # --- life ------------------------------------------------------------------------------

    def start(self) -> None:
        self._owner = asyncio.create_task(self._own(), name=f"mcp {self.name}")

    async def wait_connected(self, timeout: float) -> bool:
        """Whether the first connection attempt connected, waiting at most `timeout` s for its
        outcome: an attempt that fails (a command that does not exist) answers at once."""
        try:
            await asyncio.wait_for(self._attempted.wait(), timeout)
        except TimeoutError:
            return False
        return self._ready.is_set()

    async def stop(self) -> None:
        self._stop.set()
        if self._owner is not None:
            await asyncio.gather(self._owner, return_exceptions=True)

    async def _own(self) -> None:
        from mcp import Client

        while not self._stop.is_set():
            ended = self._ended = asyncio.Event()

            def on_end(ended: asyncio.Event = ended) -> None:
                self._ready.clear()  # at once: callers wait for the restart instead
                ended.set()

            try:
                transport = _watched(self._transport(), on_end)
                async with (
                    Client(
                        transport,
                        cache=None,
                        client_info=_client_info(),
                        message_handler=self._on_message,
                    ) as client,
                    AsyncExitStack() as listening,
                ):
                    self._tools_changed.clear()
                    await self._listen(client, listening)
                    self.tools = self._tools(await _list_tools(client))
                    self._client = client
                    self._ready.set()
                    self._attempted.set()
                    self.last_error = None
                    self._backoff.reset()
                    log.info("MCP server %s connected: %d tools", self.name, len(self.tools))
                    self._on_tools(self)
                    while True:
                        changed = self._tools_changed
                        await _first(self._stop.wait(), ended.wait(), changed.wait())
                        if not changed.is_set() or ended.is_set() or self._stop.is_set():
                            break
                        changed.clear()
                        self.tools = self._tools(await _list_tools(client))
                        log.info("MCP server %s changed its tools: %d", self.name, len(self.tools))
                        self._on_tools(self)
                    if ended.is_set() and not self._stop.is_set():
                        log.warning("MCP server %s went away; restarting it", self.name)
            except Exception as exc:  # an HTTP transport's errors leave as exception groups
                self.last_error = self._why(exc)
                self._attempted.set()
                log.warning("MCP server %s unavailable: %s", self.name, self.last_error)
            finally:
                self._client = None
                self._ready.clear()
            if not self._stop.is_set():
                self.restarts += 1
                await _first(self._stop.wait(), self._backoff.wait())

    async def _on_message(self, message: Any) -> None:
        """The SDK's message handler: notices that the server's tools changed."""
        from mcp_types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            self._tools_changed.set()

    async def _listen(self, client: Any, listening: AsyncExitStack) -> None:
        """On 2026 connections, which have no standing stream, ask for tool-list changes
        (`subscriptions/listen`); 2025 servers send them unasked."""
        from mcp.client.subscriptions import ListenNotSupportedError
        from mcp.shared.exceptions import MCPError

        tools = client.server_capabilities.tools
        if tools is None or not tools.list_changed:
            return
        try:
            await listening.enter_async_context(client.listen(tools_list_changed=True))
        except ListenNotSupportedError:
            pass
        except MCPError as exc:
            log.info("MCP server %s: tool-list changes not followed: %s", self.name, exc)

    def _why(self, exc: BaseException) -> str:
        """What went wrong, and for a command that is not there, what to do about it."""
        command = self.config.command
        missing = _find(exc, FileNotFoundError)
        if (
            command is not None
            and missing is not None
            and missing.filename in (None, command)
            and shutil.which(command, path=self.config.env.get("PATH")) is None
        ):
            where = "does not exist" if os.sep in command else "is not on PATH"
            config = str(self.config_file) if self.config_file else "FERRYMAN_MCP_SERVERS"
            return (
                f"its command {command!r} {where}: install it, or fix `command` of server"
                f" {self.name!r} in {config}"
            )
        return _describe(exc)

    def _transport(self) -> AbstractAsyncContextManager[Any]:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        if self.config.transport == "stdio":
            assert self.config.command is not None
            params = StdioServerParameters(
                command=self.config.command,
                args=self.config.args,
                env=stdio_environment(self.config.env),
                cwd=self.config.cwd,
            )
            return stdio_client(params)
        return self._http_transport()

    @asynccontextmanager
    async def _http_transport(self) -> AsyncIterator[Any]:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        assert self.config.url is not None
        # A long read timeout: the server may hold a call's answer for 15 s between pings,
        # and a read timeout ends the whole connection. Calls are bounded by the runner.
        timeout = httpx2.Timeout(30.0, read=300.0)
        http = httpx2.AsyncClient(
            headers=self.config.headers,
            timeout=timeout,
            transport=_DeliveryWatch(httpx2.AsyncHTTPTransport()),
        )
        async with (
            http,
            streamable_http_client(self.config.url, http_client=http) as streams,
        ):
            yield streams

    # --- tools -----------------------------------------------------------------------------

    def _tools(self, listed: list[Any]) -> list[Tool]:
        """The listed tools the model can be offered; the others are logged and left out."""
        tools: dict[str, Tool] = {}
        for item in listed:
            try:
                tool = self._tool(item)
            except Exception as exc:  # an input schema that is not a JSON schema
                log.warning("MCP tool %s of %s left out: %s", item.name, self.name, exc)
                continue
            if tool.name in tools:
                log.warning("MCP tool %s of %s left out: its name is taken", item.name, self.name)
                continue
            tools[tool.name] = tool
        return list(tools.values())

    def _tool(self, listed: Any) -> Tool:
        mcp_name: str = listed.name

        async def run(arguments: dict[str, Any], _: ToolContext) -> str:
            return await self.call(mcp_name, arguments)

        return Tool(
            name=offered_name(self.name, mcp_name),
            description=listed.description or f"{mcp_name} (MCP server {self.name})",
            parameters=dict(listed.input_schema or {"type": "object"}),
            run=run,
            idempotent=self.config.applies(self.config.idempotent, mcp_name),
            timeout=self.config.timeoutSeconds,
            requires_approval=self.config.applies(self.config.requireApproval, mcp_name),
            source=self.source,
        )

    async def call(self, tool: str, arguments: dict[str, Any]) -> str:
        """Call a tool; waits out a restart (the runner's timeout bounds the wait). Cancelling
        the calling task cancels the call on the server."""
        from mcp.shared.exceptions import MCPError

        while True:
            client = await self._connected()
            delivery = _Delivery()
            token = _delivery.set(delivery)
            try:
                result = await client.call_tool(tool, arguments)
            except MCPError as exc:
                # CONNECTION_CLOSED: the server died under the call (or before it got it).
                if (exc.code == CONNECTION_CLOSED or delivery.unsent) and self._client is client:
                    self._ready.clear()  # the owner may not know yet (an HTTP server)
                    self._ended.set()
                if delivery.unsent:
                    log.info(
                        "MCP server %s: call of %s not received; sending it again", self.name, tool
                    )
                    continue
                if exc.code == CONNECTION_CLOSED:
                    raise ToolError(
                        f"the MCP server {self.name!r} went away during the call (it is being"
                        " restarted); the call may or may not have taken effect"
                    ) from exc
                raise ToolError(f"MCP error {exc.code}: {exc.message}") from exc
            except RuntimeError as exc:  # structured content that breaks the tool's own schema
                raise ToolError(f"the MCP server {self.name!r} answered badly: {exc}") from exc
            finally:
                _delivery.reset(token)
            break
        text = result_text(result)
        if result.is_error:
            raise ToolError(text or "the tool failed")
        return text

    async def _connected(self) -> Any:
        """The current client, once connected: waits out a restart."""
        while True:
            await self._ready.wait()
            client = self._client
            if client is not None and self._ready.is_set():
                return client
            await asyncio.sleep(0)


class _DeliveryWatch(httpx2.AsyncBaseTransport):
    """An HTTP transport that marks the calling `_Delivery` unsent when its POST never
    reached the server: the connection was refused, or the server answered 404 to the
    session id (it restarted and forgot the session, so it ran nothing)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        delivery = _delivery.get() if request.method == "POST" else None
        try:
            response = await self._inner.handle_async_request(request)
        except httpx2.ConnectError:
            if delivery is not None:
                delivery.unsent = True
            raise
        if (
            delivery is not None
            and response.status_code == 404
            and SESSION_HEADER in request.headers
        ):
            delivery.unsent = True
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


async def _list_tools(client: Any) -> list[Any]:
    tools: list[Any] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools


def _client_info() -> Any:
    from mcp import Implementation

    from app import __version__

    return Implementation(name="ferryman", version=__version__)


async def _first(*waits: Any) -> None:
    """Return when the first of these awaitables is done; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _find(exc: BaseException, kind: type[_E]) -> _E | None:
    """`exc`, or the first exception of `kind` inside it (an exception group)."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


@asynccontextmanager
async def _watched(
    transport: AbstractAsyncContextManager[Any], on_end: Callable[[], None]
) -> AsyncIterator[Any]:
    """The transport, with a read stream that calls `on_end` when it ends: the only sign a
    stdio server died while no call was waiting."""
    async with transport as (read, write):
        yield _WatchedRead(read, on_end), write


class _WatchedRead:
    """A proxy of the transport's read stream (the SDK's `ReadStream` protocol)."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> Any:  # read by the SDK's dispatcher on HTTP
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WatchedRead:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
