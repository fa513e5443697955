"""Builds the FastAPI app (its lifespan opens the pool and the bus, and closes them) and the
uvicorn server that runs it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from types import FrameType

import uvicorn
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi_offline import FastAPIOffline

from app import __version__, tracing, web
from app.api import (
    approvals,
    assistants,
    forks,
    openapi,
    ops,
    problems,
    schedules,
    sessions,
    streams,
    tools,
)
from app.api import keys as keys_api
from app.api import webhooks as webhook_api
from app.api.middleware import BodyLimit, LocalOnly, RequestMetrics, ServerSend
from app.config import Settings, get_settings
from app.db import bootstrap
from app.db.pool import UNAVAILABLE_ERRORS
from app.protocols import ag_ui, agent_protocol
from app.protocols.agent_protocol import service as agent_protocol_service
from app.runtime.worker import Worker
from app.services import Services, calm_garbage_collector
from app.store import retention
from app.store.notify import RUNS_CHANNEL, STREAMS_CHANNEL
from app.webhooks.sender import Sender

# What a page of another origin may read of a response beyond the simple headers: where a
# created or streaming resource is (the LangGraph SDKs follow Content-Location to rejoin a
# run), a list's next page, when to retry.
CORS_EXPOSED_HEADERS = ["Location", "Content-Location", "X-Pagination-Next", "Retry-After"]
# How long a browser may keep a preflight's answer, in seconds.
CORS_MAX_AGE = 600

log = logging.getLogger(__name__)


async def _retention_loop(services: Services) -> None:
    settings = services.settings
    while True:
        try:
            pruned = await retention.prune(
                services.db,
                owner_events_older_than=timedelta(days=settings.owner_event_retention_days),
                deleted_sessions_older_than=timedelta(days=settings.deleted_session_retention_days),
                idempotency_keys_older_than=timedelta(
                    hours=settings.idempotency_key_retention_hours
                ),
            )
            log.info("retention pruned %s", pruned)
            # Stateless runs' threads their own API process did not live to delete.
            deleted = await agent_protocol_service.delete_ended_stateless(services)
            if deleted:
                log.info("retention deleted %s stateless threads", deleted)
        except UNAVAILABLE_ERRORS as exc:
            log.warning("retention skipped: %s", exc)
        await asyncio.sleep(settings.retention_interval)


def create_app(
    settings: Settings | None = None,
    database_url: str | None = None,
    *,
    with_worker: bool = False,
) -> FastAPI:
    """The API; with `with_worker`, an in-process worker runs beside it."""
    settings = settings or get_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = database_url
        if url is None:
            url = await asyncio.to_thread(bootstrap.prepare, settings)
        channels = (STREAMS_CHANNEL, RUNS_CHANNEL) if with_worker else (STREAMS_CHANNEL,)
        services = Services.create(settings, url, channels)
        app.state.services = services
        # Whatever has started is stopped in reverse order, also when a later step fails (a
        # plug-in the worker cannot load): a half-started process would never exit.
        async with contextlib.AsyncExitStack() as running:
            running.push_async_callback(services.stop)
            await services.start()
            running.push_async_callback(
                _cancel, asyncio.create_task(_retention_loop(services), name="retention")
            )
            if settings.webhook_send and not with_worker:  # a worker sends them itself
                sender = Sender(settings, services.db).run()
                running.push_async_callback(_cancel, asyncio.create_task(sender, name="webhooks"))
            if with_worker:
                worker = Worker(settings, services.db, services.bus)
                task = asyncio.create_task(worker.run(), name="worker")
                # Runs release their leases before the pool closes.
                running.push_async_callback(_stop_worker, worker, task)
            running.callback(services.shutdown.set)  # first: open streams end
            yield

    # Swagger UI's and ReDoc's files served from the package, not a CDN: /docs works offline.
    # Their pages are the workbench's (app.web: its CSP, no inline script), not FastAPI's.
    app = FastAPIOffline(
        docs_url=None,
        redoc_url=None,
        static_url=web.DOCS_STATIC,
        title="Ferryman",
        version=__version__,
        summary="Durable LLM agent sessions: leases, fenced writes, crash recovery, SSE.",
        lifespan=lifespan,
        # FastAPI's own HTTP server spans, made once `tracing.setup` installed a provider: one
        # span a request, no probes; its metrics and logs stay ours (/metrics, structlog).
        telemetry={
            "operation_spans": False,
            "metrics": False,
            "logs": False,
            "exclude": tracing.untraced,
        },
    )
    problems.install(app)
    openapi.install(app)
    # Its own contract (the LangGraph SDKs'), not the native API's: docs/langgraph.md. First,
    # as its router rules out any path outside its prefix at once (PrefixRouter).
    app.include_router(agent_protocol.router, include_in_schema=False)
    app.include_router(ag_ui.router, include_in_schema=False)
    app.include_router(streams.router)  # before sessions: /owner-events is not a session id
    app.include_router(sessions.router)
    app.include_router(forks.router)
    app.include_router(approvals.router)
    app.include_router(tools.router)
    app.include_router(assistants.router)
    app.include_router(schedules.router)
    app.include_router(webhook_api.router)
    app.include_router(keys_api.router)
    app.include_router(ops.router)

    web.install(app)

    app.add_middleware(RequestMetrics)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    if settings.auth_mode == "local":
        # Outside the rest: a request local mode refuses reaches nothing else.
        app.add_middleware(LocalOnly, extra_hosts=settings.local_hosts.split(","))
    if settings.cors_origins:
        # Outside the rest, so a preflight is answered before anything else looks at it.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=[o.strip() for o in settings.cors_origins.split(",") if o.strip()],
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=CORS_EXPOSED_HEADERS,
            max_age=CORS_MAX_AGE,
        )
    app.add_middleware(ServerSend)  # outside every middleware that wraps `send` or `receive`
    return app


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _stop_worker(worker: Worker, task: asyncio.Task[None]) -> None:
    worker.stop()
    await asyncio.gather(task, return_exceptions=True)


class Server(uvicorn.Server):
    """uvicorn, but a signal first tells open SSE streams to end, so shutdown is not held up
    by clients that never hang up; and `on_started` runs once the app has started and its
    sockets listen."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)  # exits the process if the app fails to start
        # After start-up, so that what it built is frozen out of every collection.
        calm_garbage_collector()
        self.on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        services = getattr(getattr(self.config.app, "state", None), "services", None)
        if services is not None:
            loop = asyncio.get_event_loop()
            loop.call_soon_threadsafe(services.shutdown.set)
        super().handle_exit(sig, frame)
