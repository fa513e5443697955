"""The tool catalog: the tools workers offer, published by the last worker to look."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg.types.json import Jsonb

from app.db.pool import Connection


async def publish_catalog(conn: Connection, tools: Iterable[dict[str, Any]]) -> None:
    """Replace the catalog with `tools` (catalog entries, as GET /api/tools shows them)."""
    # Workers starting together publish one after the other, not into each other's rows.
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('ferryman.tool_catalog'))")
    await conn.execute("DELETE FROM tool_catalog")
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO tool_catalog (name, description, parameters, idempotent,"
            " requires_approval, source) VALUES (%s, %s, %s, %s, %s, %s)",
            [
                (
                    t["name"],
                    t["description"],
                    Jsonb(t["parameters"]),
                    t["idempotent"],
                    t["requiresApproval"],
                    t["source"],
                )
                for t in tools
            ],
        )


async def read_catalog(conn: Connection) -> list[dict[str, Any]]:
    cur = await conn.execute(
        "SELECT name, description, parameters, idempotent, requires_approval, source"
        " FROM tool_catalog ORDER BY name"
    )
    return [
        {
            "name": r["name"],
            "description": r["description"],
            "parameters": r["parameters"],
            "idempotent": r["idempotent"],
            "requiresApproval": r["requires_approval"],
            "source": r["source"],
        }
        for r in await cur.fetchall()
    ]
