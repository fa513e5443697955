"""A rate-limiting proxy in front of a real model server (the tests' llama.cpp server): it lets
`limit` requests through at once and answers 429 with Retry-After beyond, like a provider's
concurrency limit, and counts what it saw: requests, 429s, the most in flight at once, and
when each request came and went. A real HTTP server (uvicorn, in a thread, on an ephemeral
127.0.0.1 port), forwarding each request with httpx and streaming the answer back.

    with limiting_proxy(llm.base_url, limit=4) as proxy:
        env = {"FERRYMAN_OPENAI_BASE_URL": proxy.base_url}
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class LimitingProxy:
    upstream: str  # the model server's base URL, ".../v1"
    limit: int | None = None  # None: every request goes through
    retry_after: float = 1.0
    port: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    requests: int = 0
    refused: int = 0
    # (start, end) of each request let through, by the proxy's monotonic clock.
    spans: list[tuple[float, float]] = field(default_factory=list)
    # Requests to refuse whatever the limit (a 429 on cue), and the arrival times of requests.
    refuse_next: int = 0
    arrivals: list[float] = field(default_factory=list)
    _client: httpx.AsyncClient | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def reset(self) -> None:
        self.max_in_flight = self.requests = self.refused = self.refuse_next = 0
        self.spans.clear()
        self.arrivals.clear()

    async def handle(self, request: Request) -> Response:
        self.requests += 1
        self.arrivals.append(time.monotonic())
        if self.refuse_next > 0 or (self.limit is not None and self.in_flight >= self.limit):
            self.refuse_next = max(self.refuse_next - 1, 0)
            self.refused += 1
            return JSONResponse(
                {"error": {"message": "Too many requests", "type": "rate_limit_exceeded"}},
                status_code=429,
                headers={"retry-after": f"{self.retry_after:g}"},
            )
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        started = time.monotonic()
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10))
        upstream = self._client.build_request(
            request.method,
            self.upstream + request.url.path.removeprefix("/v1"),
            content=await request.body(),
            headers={"content-type": request.headers.get("content-type", "application/json")},
        )
        try:
            answer = await self._client.send(upstream, stream=True)
        except BaseException:
            self._done(started)
            raise

        async def body() -> AsyncIterator[bytes]:
            async for piece in answer.aiter_raw():
                yield piece

        async def close() -> None:
            await answer.aclose()
            self._done(started)

        return StreamingResponse(
            body(),
            status_code=answer.status_code,
            media_type=answer.headers.get("content-type"),
            background=BackgroundTask(close),
        )

    def _done(self, started: float) -> None:
        self.in_flight -= 1
        self.spans.append((started, time.monotonic()))

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/{path:path}", self.handle, methods=["GET", "POST"])])


@contextmanager
def limiting_proxy(
    upstream: str, limit: int | None = None, retry_after: float = 1.0
) -> Iterator[LimitingProxy]:
    proxy = LimitingProxy(upstream, limit, retry_after)
    config = uvicorn.Config(
        proxy.app(), host="127.0.0.1", port=0, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="limiting-proxy", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the proxy failed to start"
        time.sleep(0.02)
    proxy.port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield proxy
    finally:
        server.should_exit = True
        thread.join(10)


def overlapping(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one time."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most
