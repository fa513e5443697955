"""Assistants: an owner's stored agent definitions. Each edit writes an immutable version (the
`assistant_versions` rows are never updated), so a session created from one copies what it
pinned and an edit or a delete later changes nothing for it. Every function runs inside the
caller's transaction and takes the owner: another owner's assistant is AssistantNotFound, like
an unknown or a deleted one.

The rows these functions answer are an assistant joined with one of its versions, for
`domain.assistant_view`: `created_at` is the assistant's, `updated_at` the version's."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any
from uuid import UUID, uuid4

from psycopg.types.json import Jsonb

from app.db.pool import Connection
from app.domain import MAX_ASSISTANT_VERSIONS, MAX_ASSISTANTS_PER_OWNER
from app.errors import AssistantExists, AssistantLimitReached, AssistantNotFound
from app.store.sessions import PageKey, like_literal
from app.store.statements import statement


@dataclass(frozen=True)
class AssistantDefinition:
    """What one version holds."""

    name: str
    model: str
    description: str | None = None
    instructions: str | None = None
    model_settings: dict[str, Any] | None = None
    tools: list[str] | None = None
    approval_required: list[str] | None = None
    metadata: dict[str, Any] | None = None
    compaction: dict[str, Any] | None = None
    # Assistant ids it may hand work to, and the scripted model's turns (docs/delegation.md).
    delegates: list[str] | None = None
    script: list[dict[str, Any]] | None = None


# The fields of a definition, as `update` takes its changes.
DEFINITION_FIELDS = frozenset(AssistantDefinition.__dataclass_fields__)

_VIEW_COLUMNS = """
    a.id, a.owner_id, v.version, a.created_at, v.created_at AS updated_at, v.name,
    v.description, v.model, v.instructions, v.model_settings, v.tools, v.approval_required,
    v.metadata, v.compaction, v.delegates, v.script
"""
# `version %(version)s`: that version; NULL: the latest.
_GET = statement(
    "get_assistant",
    f"""
    SELECT {_VIEW_COLUMNS}
    FROM assistants a
    JOIN assistant_versions v
      ON v.assistant_id = a.id AND v.version = coalesce(%(version)s, a.version)
    WHERE a.id = %(id)s AND a.owner_id = %(owner)s AND a.deleted_at IS NULL
    """,
)
_SEARCH = statement(
    "search_assistants",
    f"""
    SELECT {_VIEW_COLUMNS}
    FROM assistants a
    JOIN assistant_versions v ON v.assistant_id = a.id AND v.version = a.version
    WHERE a.owner_id = %(owner)s AND a.deleted_at IS NULL
      AND (%(after_ts)s::timestamptz IS NULL OR (a.created_at, a.id) < (%(after_ts)s, %(after_id)s))
      AND (%(pattern)s::text IS NULL OR v.name ILIKE %(pattern)s)
      AND (%(exact)s::text IS NULL OR v.name = %(exact)s)
      AND (%(metadata)s::jsonb IS NULL OR v.metadata @> %(metadata)s::jsonb)
    ORDER BY a.created_at DESC, a.id DESC
    LIMIT %(limit)s OFFSET %(offset)s
    """,
)
_VERSIONS = statement(
    "assistant_versions",
    f"""
    SELECT {_VIEW_COLUMNS}
    FROM assistants a
    JOIN assistant_versions v ON v.assistant_id = a.id
    WHERE a.id = %(id)s AND (%(before)s::integer IS NULL OR v.version < %(before)s)
    ORDER BY v.version DESC
    LIMIT %(limit)s
    """,
)
_INSERT_VERSION = statement(
    "insert_assistant_version",
    """
    INSERT INTO assistant_versions (assistant_id, version, name, description, model,
                                    instructions, model_settings, tools, approval_required,
                                    metadata, compaction, delegates, script)
    VALUES (%(id)s, %(version)s, %(name)s, %(description)s, %(model)s, %(instructions)s,
            %(model_settings)s, %(tools)s, %(approval_required)s, %(metadata)s, %(compaction)s,
            %(delegates)s, %(script)s)
    """,
)
_LOCK = statement(
    "lock_assistant",
    """
    SELECT version FROM assistants
    WHERE id = %s AND owner_id = %s AND deleted_at IS NULL FOR UPDATE
    """,
)


async def create(
    conn: Connection,
    owner_id: str,
    definition: AssistantDefinition,
    assistant_id: UUID | None = None,
) -> dict[str, Any]:
    """A new assistant at version 1; AssistantLimitReached past MAX_ASSISTANTS_PER_OWNER.
    `assistant_id`: the caller's choice (the Agent Protocol's), AssistantExists when taken
    (by anyone's assistant, deleted or not: an id is never reused)."""
    # One owner's creates take turns, so two of them cannot both pass the count.
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('assistants:' || %s))", (owner_id,))
    cur = await conn.execute(
        "SELECT count(*) AS n FROM assistants WHERE owner_id = %s AND deleted_at IS NULL",
        (owner_id,),
    )
    counted = await cur.fetchone()
    assert counted is not None
    if counted["n"] >= MAX_ASSISTANTS_PER_OWNER:
        raise AssistantLimitReached(
            f"this owner has {MAX_ASSISTANTS_PER_OWNER} assistants, the most allowed"
            " (MAX_ASSISTANTS_PER_OWNER); delete one first"
        )
    assistant_id = assistant_id or uuid4()
    cur = await conn.execute(
        "INSERT INTO assistants (id, owner_id, version) VALUES (%s, %s, 1)"
        " ON CONFLICT (id) DO NOTHING RETURNING id",
        (assistant_id, owner_id),
    )
    if await cur.fetchone() is None:
        raise AssistantExists(str(assistant_id))
    await _insert_version(conn, assistant_id, 1, definition)
    return await get(conn, owner_id, assistant_id)


async def get(conn: Connection, owner_id: str, assistant_id: UUID) -> dict[str, Any]:
    """The owner's live assistant at its latest version."""
    return await get_version(conn, owner_id, assistant_id, None)


async def get_version(
    conn: Connection, owner_id: str, assistant_id: UUID, version: int | None
) -> dict[str, Any]:
    """The owner's live assistant at `version` (None: the latest)."""
    cur = await conn.execute(_GET, {"id": assistant_id, "owner": owner_id, "version": version})
    row = await cur.fetchone()
    if row is None:
        if version is None:
            raise AssistantNotFound()
        raise AssistantNotFound(f"no such assistant, or it has no version {version}")
    return row


async def search(
    conn: Connection,
    owner_id: str,
    *,
    name: str | None = None,
    exact_name: str | None = None,
    metadata: dict[str, Any] | None = None,
    limit: int = 50,
    offset: int = 0,
    after: PageKey | None = None,
) -> tuple[list[dict[str, Any]], PageKey | None]:
    """One page of the owner's assistants at their latest versions, newest first, and the key
    of the next page (None at the end). `name`: the name contains it (case-insensitive, taken
    literally); `exact_name`: the name is it; `metadata`: the metadata contains it (`@>`).
    Page by `after` (the key a page answered) or by `offset`."""
    cur = await conn.execute(
        _SEARCH,
        {
            "owner": owner_id,
            "after_ts": after.created_at if after else None,
            "after_id": after.id if after else None,
            "pattern": None if name is None else f"%{like_literal(name)}%",
            "exact": exact_name,
            "metadata": Jsonb(metadata) if metadata is not None else None,
            "limit": limit + 1,
            "offset": offset,
        },
    )
    rows = await cur.fetchall()
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, PageKey(rows[-1]["created_at"], rows[-1]["id"])


async def update(
    conn: Connection, owner_id: str, assistant_id: UUID, changes: dict[str, Any]
) -> dict[str, Any]:
    """Write version n + 1: the latest with `changes` (fields of AssistantDefinition) applied;
    AssistantLimitReached past MAX_ASSISTANT_VERSIONS."""
    unknown = set(changes) - DEFINITION_FIELDS
    if unknown:
        raise ValueError(f"not fields of an assistant: {sorted(unknown)}")
    cur = await conn.execute(_LOCK, (assistant_id, owner_id))
    locked = await cur.fetchone()
    if locked is None:
        raise AssistantNotFound()
    latest = await get(conn, owner_id, assistant_id)
    if latest["version"] >= MAX_ASSISTANT_VERSIONS:
        raise AssistantLimitReached(
            f"this assistant has {MAX_ASSISTANT_VERSIONS} versions, the most allowed"
            " (MAX_ASSISTANT_VERSIONS); create a new assistant instead"
        )
    definition = AssistantDefinition(**{**definition_of(latest), **changes})
    version = int(latest["version"]) + 1
    await _insert_version(conn, assistant_id, version, definition)
    await conn.execute(
        "UPDATE assistants SET version = %s, updated_at = clock_timestamp() WHERE id = %s",
        (version, assistant_id),
    )
    return await get(conn, owner_id, assistant_id)


async def delete(conn: Connection, owner_id: str, assistant_id: UUID) -> None:
    """Hide the assistant (its versions stay, for the sessions that pinned one)."""
    cur = await conn.execute(
        "UPDATE assistants SET deleted_at = clock_timestamp(), updated_at = clock_timestamp()"
        " WHERE id = %s AND owner_id = %s AND deleted_at IS NULL RETURNING id",
        (assistant_id, owner_id),
    )
    if await cur.fetchone() is None:
        raise AssistantNotFound()


async def versions(
    conn: Connection,
    owner_id: str,
    assistant_id: UUID,
    *,
    limit: int = 50,
    before: int | None = None,
) -> tuple[list[dict[str, Any]], int | None]:
    """The owner's live assistant's versions, newest first, older than `before` if given; and
    the `before` of the next page (None at the end)."""
    await get(conn, owner_id, assistant_id)  # AssistantNotFound for another owner's
    cur = await conn.execute(_VERSIONS, {"id": assistant_id, "before": before, "limit": limit + 1})
    rows = await cur.fetchall()
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, int(rows[-1]["version"])


def definition_of(row: dict[str, Any]) -> dict[str, Any]:
    """The AssistantDefinition fields of a row these functions answer."""
    return {name: row[name] for name in DEFINITION_FIELDS}


async def _insert_version(
    conn: Connection, assistant_id: UUID, version: int, definition: AssistantDefinition
) -> None:
    fields = asdict(definition)
    await conn.execute(
        _INSERT_VERSION,
        {
            **fields,
            "id": assistant_id,
            "version": version,
            "model_settings": Jsonb(definition.model_settings or {}),
            "metadata": Jsonb(definition.metadata or {}),
            "compaction": Jsonb(definition.compaction) if definition.compaction else None,
            "tools": Jsonb(definition.tools) if definition.tools is not None else None,
            "approval_required": Jsonb(definition.approval_required)
            if definition.approval_required is not None
            else None,
            "delegates": Jsonb(definition.delegates) if definition.delegates else None,
            "script": Jsonb(definition.script) if definition.script is not None else None,
        },
    )
