"""The check of the tool names an agent definition uses (a session's, an assistant's): each
must be one a worker offers."""

from __future__ import annotations

import difflib
from collections.abc import Collection
from typing import Any

from fastapi.exceptions import RequestValidationError

from app.api import schemas
from app.services import Services
from app.store import tools as tool_store

# Suggestions for an unknown name: at most this many, at least this alike (difflib's ratio).
CLOSEST_NAMES = 3
CLOSEST_CUTOFF = 0.6


async def check_tool_names(
    services: Services,
    tools: list[str] | None,
    approval_required: list[str] | None,
    model_settings: dict[str, Any] | None,
) -> None:
    """Refuse (422 VALIDATION_ERROR) tool names in `tools`, `approvalRequired` and a named
    `modelSettings.toolChoice` that no worker offers, naming the closest ones that exist.

    Known: the built-ins and plug-ins this process loads, and the tools of every worker seen
    within RECENT_WORKER_SECONDS before the last worker was seen, so that a deploy or an outage
    with no worker alive does not refuse the MCP tools the workers come back with."""
    choice = (model_settings or {}).get("toolChoice")
    modes = {None, *schemas.ToolChoiceMode}
    named = {
        "tools": tools or [],
        "approvalRequired": approval_required or [],
        "modelSettings.toolChoice": [] if choice in modes else [str(choice)],
    }
    if not any(named.values()):
        return
    async with services.db.connection() as conn:
        known = await tool_store.recent_tool_names(conn)
    known |= set(services.local_tools().names())
    errors = [
        {
            "type": "unknown_tool",
            "loc": ("body", *field.split(".")),
            "msg": _unknown(unknown, known),
            "input": names,
        }
        for field, names in named.items()
        if (unknown := [name for name in dict.fromkeys(names) if name not in known])
    ]
    if errors:
        raise RequestValidationError(errors)


def _unknown(unknown: list[str], known: Collection[str]) -> str:
    """`names a tool no worker offers: 'get_nte' (closest: get_note); GET ...`."""

    def said(name: str) -> str:
        closest = difflib.get_close_matches(name, known, CLOSEST_NAMES, CLOSEST_CUTOFF)
        return f"{name!r} (closest: {', '.join(closest)})" if closest else f"{name!r} (none close)"

    return (
        f"names {'a tool' if len(unknown) == 1 else 'tools'} no worker offers: "
        + ", ".join(said(name) for name in unknown)
        + "; GET /api/tools lists them"
    )
