"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest

from app.api.deps import ServicesDep
from app.api.problems import problem
from app.db import migrate
from app.db.pool import UNAVAILABLE_ERRORS

router = APIRouter(tags=["operations"])

_NOT_READY_ERRORS: tuple[type[Exception], ...] = (*UNAVAILABLE_ERRORS, TimeoutError)
POOL_SIZE = Gauge("ferryman_db_pool_connections", "Connections in the pool", ["state"])


@router.get("/healthz", operation_id="healthz")
async def healthz() -> dict[str, str]:
    """The process is up (it may still be unable to reach the database)."""
    return {"status": "ok"}


@router.get("/readyz", operation_id="readyz", responses={503: {"description": "Not ready"}})
async def readyz(services: ServicesDep) -> Response:
    """Ready when the database answers, the LISTEN connection is up and migrations are at head."""
    checks: dict[str, Any] = {}
    try:
        async with asyncio.timeout(2), services.db.connection() as conn:
            cur = await conn.execute("SELECT version_num FROM alembic_version")
            row = await cur.fetchone()
        checks["database"] = "ok"
        at_head = row is not None and row["version_num"] == migrate.head_revision()
        checks["migrations"] = "ok" if at_head else "behind"
    except _NOT_READY_ERRORS:
        checks["database"] = "unavailable"
        checks["migrations"] = "unknown"
    checks["listen"] = "ok" if services.bus.connected.is_set() else "disconnected"
    if all(value == "ok" for value in checks.values()):
        return JSONResponse({"status": "ready", "checks": checks})
    return problem(
        503, "NOT_READY", "Service Unavailable", "a dependency is not ready", checks=checks
    )


@router.get("/metrics", operation_id="metrics", response_class=Response)
async def metrics(services: ServicesDep) -> Response:
    stats = services.db.stats()
    POOL_SIZE.labels("size").set(stats.get("pool_size", 0))
    POOL_SIZE.labels("available").set(stats.get("pool_available", 0))
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
