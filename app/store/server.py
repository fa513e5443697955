"""What the server's processes ask of the database itself rather than of its data: the schema's
revision and a setting's value."""

from __future__ import annotations

from app.db.pool import Connection


async def schema_revision(conn: Connection) -> str | None:
    """The migration the schema is at (alembic's record), or None before the first."""
    cur = await conn.execute("SELECT version_num FROM alembic_version")
    row = await cur.fetchone()
    return None if row is None else str(row["version_num"])


async def setting(conn: Connection, name: str) -> str:
    """The value of the setting `name` for this connection's session."""
    cur = await conn.execute("SELECT current_setting(%s) AS value", (name,))
    row = await cur.fetchone()
    assert row is not None
    return str(row["value"])
