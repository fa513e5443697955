"""Agent definitions from request bodies: the session a create body asks for, with the
assistant version it names resolved and copied in, and an assistant's definition. Shared by
the sessions and assistants routes and by the protocols that create sessions from assistants,
so each checks a definition the same way."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from fastapi.exceptions import RequestValidationError

from app.agent.delegation import find_cycle
from app.api import schemas
from app.api.deps import Caller
from app.api.tool_names import check_tool_names
from app.domain import default_title
from app.errors import AssistantNotFound, DelegateCycle
from app.scopes import check_definition, parse_scopes
from app.services import Services
from app.store import assistants as assistant_store
from app.store import delegation as delegation_store
from app.store.assistants import AssistantDefinition
from app.store.sessions import NewSession, request_fingerprint

# UpdateAssistant's fields, by the AssistantDefinition field each changes.
_ASSISTANT_FIELDS = {
    "name": "name",
    "description": "description",
    "model": "model",
    "instructions": "instructions",
    "modelSettings": "model_settings",
    "tools": "tools",
    "approvalRequired": "approval_required",
    "metadata": "metadata",
    "compaction": "compaction",
    "delegates": "delegates",
    "script": "script",
}


def parse_assistant_id(raw: str) -> UUID:
    """An assistant id; anything that is not a UUID names no assistant (404, like a foreign
    one)."""
    try:
        return UUID(raw)
    except ValueError:
        raise AssistantNotFound() from None


def check_caller_definition(
    services: Services, caller: Caller, tools: list[str] | None, model: str
) -> None:
    """Refuse (403 TOOL_NOT_ALLOWED, MODEL_NOT_ALLOWED) a definition the caller's key may not
    use (docs/tenants.md, "What a key may use")."""
    settings = services.settings
    scripted_allowed = settings.auth_mode != "keys" or settings.scripted_model
    check_definition(parse_scopes(caller.policy), tools, model, scripted_allowed)


async def resolve_session(
    services: Services, caller: Caller, body: schemas.CreateSession
) -> NewSession:
    """The session to store for `body`: with `assistantId`, that assistant version's
    definition (AssistantNotFound for none of the owner's), overridden by the fields the body
    gives (`modelSettings` key by key); the tool names checked (422 naming the unknown ones),
    then what the caller's key may use (403)."""
    owner = caller.owner
    base: dict[str, Any] = {}
    pinned: dict[str, Any] | None = None
    if body.assistantId is not None:
        async with services.db.connection() as conn:
            pinned = await assistant_store.get_version(
                conn, owner, parse_assistant_id(body.assistantId), body.assistantVersion
            )
        base = assistant_store.definition_of(pinned)
    tools = body.tools if body.tools is not None else base.get("tools")
    approval_required = (
        body.approvalRequired
        if body.approvalRequired is not None
        else base.get("approval_required")
    )
    model_settings = {**(base.get("model_settings") or {}), **(body.settings_dict() or {})}
    if pinned is not None:
        check_tool_choice(model_settings, tools)
    await check_tool_names(services, tools, approval_required, model_settings)
    model = body.model or base.get("model") or services.settings.model
    check_caller_definition(services, caller, tools, model)
    client_tools = _client_tools(services, body, tools)
    delegate_ids = body.delegates if body.delegates is not None else base.get("delegates")
    node = None if pinned is None else str(pinned["id"])
    delegates = await check_delegates(services, owner, delegate_ids, node)
    return NewSession(
        prompt=body.prompt,
        title=body.title or default_title(body.prompt or ""),
        model=model,
        script=_script(body.script) if body.script is not None else base.get("script"),
        tools=tools,
        metadata=body.metadata or {},
        instructions=body.instructions
        if body.instructions is not None
        else base.get("instructions"),
        model_settings=model_settings,
        approval_required=approval_required,
        assistant_id=None if pinned is None else pinned["id"],
        assistant_version=None if pinned is None else pinned["version"],
        request=None if pinned is None else body.model_dump(mode="json", exclude_unset=True),
        client_tools=client_tools,
        compaction=body.compaction_dict()
        if body.compaction is not None
        else base.get("compaction"),
        delegates=delegates,
        created_by_key_id=caller.key_id,
        priority=body.priority if body.priority is not None else caller.priority,
    )


async def check_delegates(
    services: Services, owner: str, ids: list[str] | None, node: str | None
) -> list[dict[str, Any]] | None:
    """`ids` resolved as a definition stores them (None: none), after the checks: 422 naming
    the ids that are none of the owner's assistants, DelegateCycle (422) when a chain of
    delegates through the stored assistants would come back to one on it. `node`: the
    assistant whose definition this is, if any (a chain back to it is a cycle too)."""
    if not ids:
        return None
    async with services.db.connection() as conn:
        resolved, missing = await delegation_store.resolve(conn, owner, ids)
        graph = await delegation_store.graph(conn, owner) if not missing else {}
    if missing:
        raise invalid_field(
            "delegates", f"names no assistant of yours: {', '.join(missing)}", missing
        )
    root = node or "(this session)"
    graph[root] = [d["assistantId"] for d in resolved]
    cycle = find_cycle(graph, root)
    if cycle is not None:
        raise DelegateCycle(cycle)
    return resolved


def invalid_field(name: str, message: str, value: Any) -> RequestValidationError:
    """A 422 VALIDATION_ERROR naming one field of the body."""
    error = {"type": "value_error", "loc": ("body", name), "msg": message, "input": value}
    return RequestValidationError([error])


def _client_tools(
    services: Services, body: schemas.CreateSession, tools: list[str] | None
) -> list[dict[str, Any]] | None:
    """The body's client tools as stored (none: None), 422 for a name a server tool of the
    session has (the model could not tell the two apart)."""
    if not body.clientTools:
        return None
    server = set(tools if tools is not None else services.local_tools().names())
    taken = [t.name for t in body.clientTools if t.name in server]
    if taken:
        raise invalid_field(
            "clientTools", f"names server tools of the session: {', '.join(taken)}", taken
        )
    return [t.model_dump() for t in body.clientTools]


def assistant_request_fingerprint(body: schemas.CreateSession) -> str | None:
    """The fingerprint a create naming an assistant is kept under (None for any other), known
    before the assistant is read: a retry finds its session even once the assistant is gone."""
    if body.assistantId is None:
        return None
    return request_fingerprint(body.model_dump(mode="json", exclude_unset=True))


async def assistant_definition(
    services: Services, body: schemas.CreateAssistant, caller: Caller, owner: str | None = None
) -> AssistantDefinition:
    """The definition a create body gives, its tool names (and, for `owner`, its delegates)
    checked, and what the caller's key may use (its model unset: FERRYMAN_MODEL's)."""
    settings = body.settings_dict() or {}
    await check_tool_names(services, body.tools, body.approvalRequired, settings)
    check_caller_definition(services, caller, body.tools, body.model or services.settings.model)
    delegates = None
    if owner is not None:
        resolved = await check_delegates(services, owner, body.delegates, None)
        delegates = [d["assistantId"] for d in resolved or ()] or None
    return AssistantDefinition(
        name=body.name,
        model=body.model,
        description=body.description,
        instructions=body.instructions,
        model_settings=settings,
        tools=body.tools,
        approval_required=body.approvalRequired,
        metadata=body.metadata or {},
        compaction=body.compaction_dict(),
        delegates=delegates,
        script=_script(body.script),
    )


def _script(script: list[schemas.ScriptTurn] | None) -> list[dict[str, Any]] | None:
    return None if script is None else [turn.model_dump(exclude_none=True) for turn in script]


async def assistant_changes(
    services: Services, latest: dict[str, Any], body: schemas.UpdateAssistant, caller: Caller
) -> dict[str, Any]:
    """The AssistantDefinition fields `body` changes, checked as the version they make with
    `latest` (an assistant row) would be, for what the caller's key may use too."""
    changes: dict[str, Any] = {
        _ASSISTANT_FIELDS[name]: getattr(body, name) for name in body.model_fields_set
    }
    if "modelSettings" in body.model_fields_set:
        changes["model_settings"] = body.settings_dict() or {}
    if "metadata" in body.model_fields_set:
        changes["metadata"] = body.metadata or {}
    if "compaction" in body.model_fields_set:
        changes["compaction"] = body.compaction_dict()
    if "script" in body.model_fields_set:
        changes["script"] = _script(body.script)
    if "delegates" in body.model_fields_set:
        node = str(latest["id"])
        resolved = await check_delegates(services, latest["owner_id"], body.delegates, node)
        changes["delegates"] = [d["assistantId"] for d in resolved or ()] or None
    merged = {**assistant_store.definition_of(latest), **changes}
    check_tool_choice(merged["model_settings"], merged["tools"])
    model = merged["model"] or services.settings.model
    check_caller_definition(services, caller, merged["tools"], model)
    await check_tool_names(
        services,
        changes.get("tools"),
        changes.get("approval_required"),
        changes.get("model_settings"),
    )
    return changes


def check_tool_choice(model_settings: dict[str, Any], tools: list[str] | None) -> None:
    """422 when a definition put together from parts names a toolChoice its tools leave out."""
    problem = schemas.tool_choice_problem(model_settings, tools)
    if problem is not None:
        raise RequestValidationError(
            [
                {
                    "type": "value_error",
                    "loc": ("body", "modelSettings", "toolChoice"),
                    "msg": problem,
                    "input": model_settings.get("toolChoice"),
                }
            ]
        )
