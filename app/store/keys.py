"""API keys. Only a SHA-256 digest of each key is stored: keys are 256-bit random tokens, so a
fast digest is as safe as a slow password hash and costs nothing per request."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from typing import Any
from uuid import UUID, uuid4

from psycopg.types.json import Jsonb

from app.db.pool import Connection
from app.domain import check_owner_id
from app.scopes import check_scopes

KEY_PREFIX = "fm_"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


_KEY_COLUMNS = "id, owner_id, name, prefix, policy, created_at, last_used_at, revoked_at"


async def create_key(
    conn: Connection, owner_id: str, name: str, policy: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], str]:
    """Store a new key for `owner_id` with its `policy` (docs/tenants.md; None: `{}`, the
    defaults); return its row and the plaintext (shown once). The policy's scope fields
    (`tools`, `models`, `approverFor`, app/scopes.py) are checked: ValueError saying what is
    wrong."""
    check_owner_id(owner_id)
    stored = {**(policy or {}), **check_scopes(policy or {})}
    key = new_key()
    cur = await conn.execute(
        f"""
        INSERT INTO api_keys (id, owner_id, name, prefix, key_hash, policy)
        VALUES (%s, %s, %s, %s, %s, %s)
        RETURNING {_KEY_COLUMNS}
        """,
        (uuid4(), owner_id, name, key[:10], hash_key(key), Jsonb(stored)),
    )
    row = await cur.fetchone()
    assert row is not None
    return row, key


async def find_key(conn: Connection, key: str) -> dict[str, Any] | None:
    """An unrevoked key's id, owner and policy, or None."""
    cur = await conn.execute(
        "SELECT id, owner_id, policy FROM api_keys WHERE key_hash = %s AND revoked_at IS NULL",
        (hash_key(key),),
    )
    return await cur.fetchone()


async def policy_of(conn: Connection, key_id: UUID) -> dict[str, Any]:
    """A key's policy, revoked or not (`{}` for an id that names no key)."""
    cur = await conn.execute("SELECT policy FROM api_keys WHERE id = %s", (key_id,))
    row = await cur.fetchone()
    return {} if row is None else dict(row["policy"])


async def any_active(conn: Connection) -> bool:
    cur = await conn.execute("SELECT 1 FROM api_keys WHERE revoked_at IS NULL LIMIT 1")
    return await cur.fetchone() is not None


async def list_keys(conn: Connection, owner_id: str | None) -> list[dict[str, Any]]:
    cur = await conn.execute(
        f"""
        SELECT {_KEY_COLUMNS}
        FROM api_keys
        WHERE %(owner)s::text IS NULL OR owner_id = %(owner)s ORDER BY created_at
        """,
        {"owner": owner_id},
    )
    return await cur.fetchall()


async def revoke_key(conn: Connection, key_id: UUID) -> bool:
    cur = await conn.execute(
        "UPDATE api_keys SET revoked_at = clock_timestamp() WHERE id = %s AND revoked_at IS NULL"
        " RETURNING id",
        (key_id,),
    )
    return await cur.fetchone() is not None


async def get_key(conn: Connection, key_id: UUID) -> dict[str, Any] | None:
    """A key's row (never its plaintext, which is not stored), revoked or not; None: none."""
    cur = await conn.execute(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = %s", (key_id,))
    return await cur.fetchone()


async def update_key(
    conn: Connection, key_id: UUID, name: str | None, policy: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Rename an unrevoked key (`name` None: as it is) and merge `policy` into its policy: a
    field set to None is removed (back to the default). None: no such unrevoked key."""
    cleared = [field for field, value in policy.items() if value is None]
    given = {field: value for field, value in policy.items() if value is not None}
    cur = await conn.execute(
        f"""
        UPDATE api_keys SET name = coalesce(%s, name), policy = (policy - %s::text[]) || %s
        WHERE id = %s AND revoked_at IS NULL
        RETURNING {_KEY_COLUMNS}
        """,
        (name, cleared, Jsonb(given), key_id),
    )
    return await cur.fetchone()
