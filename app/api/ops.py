"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

import psycopg
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest
from psycopg_pool import PoolTimeout

from app.api import schemas
from app.api.deps import ServicesDep
from app.api.openapi import problems
from app.api.problems import problem
from app.db import migrate
from app.db.pool import UNAVAILABLE_ERRORS
from app.errors import AuthRequired, InvalidApiKey, MetricsTokenRequired, ProblemCode
from app.services import Services
from app.store import limits as limit_store
from app.store import server as server_store

router = APIRouter(tags=["operations"])

# The server answered, but we could not get a turn: a saturated pool or a held lock.
_BUSY_ERRORS: tuple[type[Exception], ...] = (
    PoolTimeout,
    psycopg.errors.QueryCanceled,
    psycopg.errors.LockNotAvailable,
)
_NOT_READY_ERRORS: tuple[type[Exception], ...] = (*_BUSY_ERRORS, *UNAVAILABLE_ERRORS, TimeoutError)
POOL_SIZE = Gauge("ferryman_db_pool_connections", "Connections in the pool", ["state"])
# The queue per owner (docs/tenants.md), read at each scrape: the TOP_OWNERS owners with the
# most queued sessions by name, the rest as `other`, so the labels stay bounded.
QUEUE_DEPTH = Gauge("ferryman_owner_queued_sessions", "Queued sessions, by owner", ["owner"])
QUEUE_OLDEST = Gauge(
    "ferryman_owner_queued_oldest_seconds",
    "How long the owner's longest-queued session has waited (since its last change)",
    ["owner"],
)
TOP_OWNERS = 10


@router.get("/healthz", operation_id="healthz", response_model=schemas.Health)
async def healthz() -> dict[str, str]:
    """The process is up (it may still be unable to reach the database)."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    operation_id="readyz",
    responses={200: {"model": schemas.Readiness}, **problems(503)},
)
async def readyz(services: ServicesDep) -> Response:
    """Ready when the database answers, the LISTEN connection is up and migrations are at head."""
    checks: dict[str, Any] = {}
    listening = services.bus.connected.is_set()
    try:
        async with asyncio.timeout(2), services.db.connection() as conn:
            revision = await server_store.schema_revision(conn)
        checks["database"] = "ok"
        checks["migrations"] = "ok" if revision == migrate.head_revision() else "behind"
    except _NOT_READY_ERRORS as exc:
        # "busy": it is up (it answered, or our LISTEN connection to it lives) but gave us no
        # turn in time; "unavailable": it cannot be reached.
        up = isinstance(exc, _BUSY_ERRORS) or (isinstance(exc, TimeoutError) and listening)
        checks["database"] = "busy" if up else "unavailable"
        checks["migrations"] = "unknown"
    checks["listen"] = "ok" if listening else "disconnected"
    if all(value == "ok" for value in checks.values()):
        return JSONResponse({"status": "ready", "checks": checks})
    return problem(
        503,
        ProblemCode.NOT_READY,
        "Service Unavailable",
        "a dependency is not ready",
        checks=checks,
    )


async def _metrics_access(services: ServicesDep, request: Request) -> None:
    """In keys (or jwt) mode /metrics wants FERRYMAN_METRICS_TOKEN, and with none set answers
    403 METRICS_TOKEN_REQUIRED: its counts are every owner's, so no tenant's key (or token)
    reads them. Local mode answers everyone, like every route."""
    if services.settings.auth_mode == "local":
        return
    expected = services.settings.metrics_token
    if expected is None:
        raise MetricsTokenRequired(
            "/metrics shows every owner's counts: set FERRYMAN_METRICS_TOKEN on the server"
            " and scrape with `Authorization: Bearer <that token>`"
        )
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise AuthRequired("/metrics needs `Authorization: Bearer <FERRYMAN_METRICS_TOKEN>`")
    if not hmac.compare_digest(token.encode(), expected.get_secret_value().encode()):
        raise InvalidApiKey("this is not FERRYMAN_METRICS_TOKEN")


@router.get(
    "/metrics",
    operation_id="metrics",
    response_class=Response,
    dependencies=[Depends(_metrics_access)],
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}},
        **problems(401, 403),
    },
)
async def metrics(services: ServicesDep) -> Response:
    stats = services.db.stats()
    POOL_SIZE.labels("size").set(stats.get("pool_size", 0))
    POOL_SIZE.labels("available").set(stats.get("pool_available", 0))
    await _owner_queues(services)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


async def _owner_queues(services: Services) -> None:
    """Set the queue gauges. Owners are named: /metrics is the operator's alone (local mode,
    or FERRYMAN_METRICS_TOKEN, which keys and jwt mode require)."""
    try:
        async with asyncio.timeout(2), services.db.connection() as conn:
            rows = await limit_store.owner_queues(conn, TOP_OWNERS)
    except _NOT_READY_ERRORS:
        return  # the gauges keep their last values
    QUEUE_DEPTH.clear()
    QUEUE_OLDEST.clear()
    for row in rows:
        QUEUE_DEPTH.labels(row["owner"]).set(row["depth"])
        QUEUE_OLDEST.labels(row["owner"]).set(max(0.0, row["oldest"] or 0.0))
