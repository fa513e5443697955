"""Pure ASGI middleware (no BaseHTTPMiddleware: it would buffer nothing but cost on every SSE
chunk): the request body limit, request metrics, local mode's guard, and the SSE body's
shortcut past the `send` wrappers."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterable
from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.problems import problem
from app.errors import ProblemCode

REQUESTS = Counter("ferryman_http_requests_total", "HTTP requests", ["method", "route", "status"])
LATENCY = Histogram(
    "ferryman_http_request_seconds",
    "Time to the response headers",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


class BodyLimit:
    """Refuse bodies over `max_bytes` with 413, by Content-Length or while streaming."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _TooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem(
            413,
            ProblemCode.PAYLOAD_TOO_LARGE,
            "Payload Too Large",
            _too_large_detail(self.max_bytes),
        )
        await response(scope, receive, send)


class _TooLarge(HTTPException):
    """Raised from `receive`. An HTTPException, because FastAPI turns any other error raised
    while it reads the body into a 400; the problem handler answers it 413."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, _too_large_detail(max_bytes))


def _too_large_detail(max_bytes: int) -> str:
    return f"the request body exceeds {max_bytes} bytes (FERRYMAN_MAX_BODY_BYTES)"


# Scope key of `send` as ServerSend got it. An SSE response sends its start through the whole
# chain (the metrics and error handlers see the status), then its body chunks to this `send`:
# each wrapper in between (the metrics', Starlette's exception handlers') cost a coroutine per
# chunk of every stream. So no middleware inside ServerSend may rewrite bodies (SSE must not
# be compressed anyway).
SERVER_SEND = "ferryman.server_send"
# Scope key of the server's own request object (uvicorn's request-response cycle, which its
# `receive` is a method of), through which an SSE stream may write to the connection directly
# (app/streams/shortcuts.py `uvicorn_direct_write`).
SERVER_CONNECTION = "ferryman.server_connection"


class ServerSend:
    """Puts its `send` in the scope under SERVER_SEND, and the server's request object under
    SERVER_CONNECTION; add it outside every middleware that wraps `send` or `receive`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[SERVER_SEND] = send
            scope[SERVER_CONNECTION] = getattr(receive, "__self__", None)
        await self.app(scope, receive, send)


class RequestMetrics:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status: dict[str, Any] = {}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                route = scope.get("route")
                path = getattr(route, "path", "unmatched")
                LATENCY.labels(scope["method"], path).observe(time.perf_counter() - start)
                REQUESTS.labels(scope["method"], path, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, send_wrapper)


# --- local mode -------------------------------------------------------------------------------

# Headers a proxy adds to what it relays. Through a proxy the peer is the proxy, so a loopback
# peer says nothing about who is calling.
_FORWARDING_HEADERS = frozenset({b"forwarded", b"x-real-ip", b"via"})
_FORWARDING_PREFIX = b"x-forwarded-"
# Reads: a page of another site cannot see their answers (there is no CORS), so only writes
# need their Origin checked.
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class LocalOnly:
    """Local mode acts for whoever asks as the owner `local`, so it answers only this machine's
    own callers and pages:

    - the peer must be a loopback address, and the request must not have come through a proxy
      (one that says so with a forwarding header; a proxy that forwards silently cannot be
      told from a local client, which is why local mode does not belong behind one);
    - the Host must name this machine (a loopback name or address, or one of `extra_hosts`):
      a page of another site that rebinds its DNS name to 127.0.0.1 still sends its own name;
    - a write's Origin, when there is one, must be such a name too: a page of another site
      may send requests here, but not have them acted on.

    A request without a Host (HTTP/1.0) passes: browsers always send one, and the peer is local.
    """

    def __init__(self, app: ASGIApp, extra_hosts: Iterable[str] = ()) -> None:
        self.app = app
        self.extra_hosts = frozenset(_normal_name(h) for h in extra_hosts if h.strip())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await refusal(scope, receive, send)

    def _refusal(self, scope: Scope) -> JSONResponse | None:
        headers = dict(scope["headers"])
        client = scope.get("client")
        if client is None or not _is_loopback_address(client[0]):
            return _not_local(f"it came from {client[0] if client else 'an unknown peer'}")
        if any(n in _FORWARDING_HEADERS or n.startswith(_FORWARDING_PREFIX) for n in headers):
            return _not_local("it came through a proxy")
        host = headers.get(b"host", b"").decode("latin-1")
        if host and not self._is_local(_authority_host(host)):
            return problem(
                421,
                ProblemCode.HOST_NOT_ALLOWED,
                "Misdirected Request",
                f"local mode answers only names of this machine, not Host {host!r}: open it "
                "at localhost, *.localhost, 127.0.0.0/8 or [::1], or add the name to "
                "FERRYMAN_LOCAL_HOSTS",
            )
        origin = headers.get(b"origin", b"").decode("latin-1")
        writes = scope["method"] not in _SAFE_METHODS
        if writes and origin and not self._is_local(_origin_host(origin)):
            return problem(
                403,
                ProblemCode.CROSS_SITE_REQUEST,
                "Forbidden",
                f"in local mode only pages of this machine may make changes, not a page of "
                f"Origin {origin!r}",
            )
        return None

    def _is_local(self, name: str | None) -> bool:
        if name is None:
            return False
        return (
            name == "localhost"
            or name.endswith(".localhost")
            or name in self.extra_hosts
            or _is_loopback_address(name)
        )


def _not_local(why: str) -> JSONResponse:
    return problem(
        403,
        ProblemCode.LOCAL_MODE_NOT_LOCAL,
        "Forbidden",
        f"local mode answers only requests made on this machine, and {why}; serve with "
        "FERRYMAN_AUTH=keys and send an API key",
    )


def _is_loopback_address(text: str) -> bool:
    """An IP address of this machine's loopback (an IPv4-mapped one too)."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback  # a dual-stack socket's view of 127.0.0.1
    return address.is_loopback


def _authority_host(authority: str) -> str | None:
    """The host of `name[:port]` or `[v6]:port`, normalized; None if it is not of that form."""
    if authority.startswith("["):
        name, bracket, port = authority[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            return None
        port = port[1:]
    else:
        name, _, port = authority.partition(":")
    if port and not port.isdigit():
        return None
    return _normal_name(name) or None


def _origin_host(origin: str) -> str | None:
    """The host of an Origin (`scheme://host[:port]`); None for `null` or anything odd."""
    scheme, separator, authority = origin.partition("://")
    if not separator or scheme.lower() not in ("http", "https"):
        return None
    return _authority_host(authority)


def _normal_name(name: str) -> str:
    # "localhost." is the same name as "localhost"; names are case-insensitive.
    return name.strip().lower().removesuffix(".")
