"""Delegation's reads (docs/delegation.md): a definition's delegates resolved into the tools
they are offered as, the owner's graph of delegates (for the cycle check), and the child
session a delegate call makes. A child's end and the cascades are in `sessions`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from app.agent import delegation
from app.db.pool import Connection
from app.domain import default_title
from app.errors import AssistantNotFound
from app.store import assistants as assistant_store
from app.store.sessions import NewSession
from app.store.statements import statement

_NAMES = statement(
    "delegate_names",
    """
    SELECT a.id, v.name, v.description
    FROM assistants a JOIN assistant_versions v ON v.assistant_id = a.id AND v.version = a.version
    WHERE a.owner_id = %s AND a.id = ANY(%s::uuid[]) AND a.deleted_at IS NULL
    """,
)
_GRAPH = statement(
    "delegate_graph",
    """
    SELECT a.id::text AS id, v.delegates
    FROM assistants a JOIN assistant_versions v ON v.assistant_id = a.id AND v.version = a.version
    WHERE a.owner_id = %s AND a.deleted_at IS NULL AND v.delegates IS NOT NULL
    """,
)


async def resolve(
    conn: Connection, owner_id: str, ids: Sequence[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The owner's live assistants `ids` names as a session stores its delegates
    (`{assistantId, tool, description}`, in the order given), and the ids that name none."""
    ids = list(dict.fromkeys(ids))  # one tool per assistant
    uuids = {i: _uuid(i) for i in ids}
    cur = await conn.execute(_NAMES, (owner_id, [u for u in uuids.values() if u is not None]))
    found = {str(r["id"]): r for r in await cur.fetchall()}
    known = [str(uuids[i]) for i in ids if str(uuids[i]) in found]
    missing = [i for i in ids if str(uuids[i]) not in found]
    tools = delegation.tool_names([found[i]["name"] for i in known])
    resolved = [
        {
            "assistantId": i,
            "tool": tool,
            "description": delegation.description(found[i]["name"], found[i]["description"]),
        }
        for i, tool in zip(known, tools, strict=True)
    ]
    return resolved, missing


def _uuid(raw: str) -> UUID | None:
    try:
        return UUID(raw)
    except ValueError:
        return None


async def graph(conn: Connection, owner_id: str) -> dict[str, list[str]]:
    """Each of the owner's live assistants' delegates (latest versions; none: left out)."""
    cur = await conn.execute(_GRAPH, (owner_id,))
    return {r["id"]: [str(d) for d in r["delegates"]] for r in await cur.fetchall()}


async def child_session(
    conn: Connection, parent: dict[str, Any], assistant_id: str, call_id: str, task: str
) -> NewSession | None:
    """The session a delegate call makes: of the parent's owner, from the assistant's latest
    version, the task as its prompt; None when the assistant is gone."""
    owner = parent["owner_id"]
    try:
        pinned = await assistant_store.get(conn, owner, UUID(assistant_id))
    except AssistantNotFound:
        return None
    delegates, _ = await resolve(conn, owner, pinned["delegates"] or [])
    return NewSession(
        prompt=task,
        title=default_title(f"{pinned['name']}: {task}"),
        model=pinned["model"],
        script=pinned["script"],
        tools=pinned["tools"],
        metadata={},
        instructions=pinned["instructions"],
        model_settings=pinned["model_settings"] or {},
        approval_required=pinned["approval_required"],
        assistant_id=pinned["id"],
        assistant_version=pinned["version"],
        compaction=pinned["compaction"],
        delegates=delegates or None,
        parent_session_id=parent["id"],
        parent_tool_call_id=call_id,
        depth=int(parent["depth"]) + 1,
        created_by_key_id=parent["created_by_key_id"],
        priority=int(parent.get("priority") or 0),  # a child runs at its parent's priority
    )
