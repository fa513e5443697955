"""Pure ASGI middleware (no BaseHTTPMiddleware: it would buffer nothing but cost on every SSE
chunk): the request body limit and request metrics."""

from __future__ import annotations

import time
from typing import Any

from fastapi import HTTPException
from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.problems import problem

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
            "PAYLOAD_TOO_LARGE",
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
