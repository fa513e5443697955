"""The tool catalog: each worker's tools, kept with its `workers` row (and deleted with it).

The catalog is computed from the workers alive now. A worker counts as alive while it has not
stopped and its last heartbeat is within the lease TTL: a worker that stops marks itself
stopped, a dead one is marked by the survivor that reaps it (at once), or, with no survivor,
falls out when its heartbeat is older than the TTL.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg.types.json import Jsonb

from app.db.pool import Connection
from app.store.statements import statement

# The tools of the workers seen in this window before the last one seen stay names a session may
# use: a deploy that replaces every worker, or a database outage, must not refuse sessions for
# the MCP tools the workers will offer again once they are up.
RECENT_WORKER_SECONDS = 900.0

_LIVE_WORKERS = """
    SELECT id, started_at FROM workers
    WHERE stopped_at IS NULL AND heartbeat_at > clock_timestamp() - make_interval(secs => %(ttl)s)
"""


LIVE_CATALOG_SQL = statement(
    "live_tool_catalog",
    f"""
    WITH live AS ({_LIVE_WORKERS})
    SELECT DISTINCT ON (t.name) t.name, t.description, t.parameters, t.idempotent,
           t.requires_approval, t.source, count(*) OVER (PARTITION BY t.name) AS workers
    FROM worker_tools t JOIN live ON live.id = t.worker_id
    ORDER BY t.name, live.started_at DESC
    """,
)
LIVE_WORKER_COUNT_SQL = statement(
    "live_worker_count", f"SELECT count(*) AS n FROM ({_LIVE_WORKERS}) live"
)


async def publish_worker_tools(
    conn: Connection, worker_id: str, tools: Iterable[dict[str, Any]]
) -> None:
    """Replace the tools `worker_id` offers with `tools` (catalog entries, as GET /api/tools
    shows them), and forget the tools of workers not seen for RECENT_WORKER_SECONDS. In the
    caller's transaction."""
    # A worker publishes again when an MCP server connects, maybe while it publishes already:
    # one after the other, not into each other's rows.
    await conn.execute("SELECT FROM workers WHERE id = %s FOR UPDATE", (worker_id,))
    await conn.execute(
        "DELETE FROM worker_tools t USING workers w WHERE w.id = t.worker_id"
        " AND (w.id = %s OR w.heartbeat_at < clock_timestamp() - make_interval(secs => %s))",
        (worker_id, RECENT_WORKER_SECONDS),
    )
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO worker_tools (worker_id, name, description, parameters, idempotent,"
            " requires_approval, source) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [
                (
                    worker_id,
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


async def read_catalog(conn: Connection, ttl: float) -> tuple[list[dict[str, Any]], int]:
    """The tools the live workers offer, each with `workers`, how many of them offer it (its
    description is the one of the newest worker that offers it), and how many workers live."""
    cur = await conn.execute(LIVE_CATALOG_SQL, {"ttl": ttl})
    tools = [
        {
            "name": r["name"],
            "description": r["description"],
            "parameters": r["parameters"],
            "idempotent": r["idempotent"],
            "requiresApproval": r["requires_approval"],
            "source": r["source"],
            "workers": r["workers"],
        }
        for r in await cur.fetchall()
    ]
    cur = await conn.execute(LIVE_WORKER_COUNT_SQL, {"ttl": ttl})
    row = await cur.fetchone()
    return tools, int(row["n"]) if row else 0


async def recent_tool_names(conn: Connection) -> set[str]:
    """The names of the tools of the workers seen within RECENT_WORKER_SECONDS before the last
    worker was seen (live ones included)."""
    cur = await conn.execute(
        """
        SELECT DISTINCT t.name FROM worker_tools t JOIN workers w ON w.id = t.worker_id
        WHERE w.heartbeat_at >= (SELECT max(heartbeat_at) FROM workers)
                                - make_interval(secs => %s)
        """,
        (RECENT_WORKER_SECONDS,),
    )
    return {r["name"] for r in await cur.fetchall()}
