"""Builds the FastAPI app; the lifespan opens the pool and the bus, and closes them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from app import __version__
from app.api import ops, problems, sessions, streams, tools
from app.api.middleware import BodyLimit, RequestMetrics
from app.config import Settings, get_settings
from app.db import bootstrap
from app.db.pool import UNAVAILABLE_ERRORS
from app.runtime.worker import Worker
from app.services import Services
from app.store import retention

log = logging.getLogger(__name__)


async def _retention_loop(services: Services) -> None:
    settings = services.settings
    while True:
        try:
            async with services.db.transaction() as conn:
                pruned = await retention.prune(
                    conn,
                    owner_events_older_than=timedelta(days=settings.owner_event_retention_days),
                    deleted_sessions_older_than=timedelta(
                        days=settings.deleted_session_retention_days
                    ),
                    idempotency_keys_older_than=timedelta(
                        hours=settings.idempotency_key_retention_hours
                    ),
                )
            log.info("retention pruned %s", pruned)
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
        services = Services.create(settings, url)
        app.state.services = services
        await services.start()
        retention_task = asyncio.create_task(_retention_loop(services), name="retention")
        worker = Worker(settings, services.db, services.bus) if with_worker else None
        worker_task = asyncio.create_task(worker.run(), name="worker") if worker else None
        try:
            yield
        finally:
            services.shutdown.set()
            if worker is not None and worker_task is not None:
                worker.stop()  # runs release their leases before the pool closes
                await asyncio.gather(worker_task, return_exceptions=True)
            retention_task.cancel()
            await asyncio.gather(retention_task, return_exceptions=True)
            await services.stop()

    app = FastAPI(
        title="Ferryman",
        version=__version__,
        summary="Durable LLM agent sessions: leases, fenced writes, crash recovery, SSE.",
        lifespan=lifespan,
    )
    problems.install(app)
    app.include_router(streams.router)  # before sessions: /owner-events is not a session id
    app.include_router(sessions.router)
    app.include_router(tools.router)
    app.include_router(ops.router)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def workbench() -> HTMLResponse:
        page = resources.files("app.web").joinpath("index.html").read_text()
        return HTMLResponse(page)

    app.add_middleware(RequestMetrics)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app
