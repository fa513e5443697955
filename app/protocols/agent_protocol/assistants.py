"""The Agent Protocol's assistants (SPEC section 9), as the LangGraph SDKs call them: Ferryman's
stored assistants (section 8) in the protocol's shape.

- `graph_id` is always `ferryman`, the one agent loop Ferryman runs; a create naming another
  graph is 422, a search for another finds nothing.
- The agent definition travels in the assistant's `context` and/or `config.configurable`, under
  the native field names (`DEFINITION_KEYS`: model, instructions, modelSettings, tools,
  approvalRequired, and whatever else a stored assistant takes); where both name a key,
  `context` wins. An answer carries the definition in both. `config` takes `configurable` alone.
- An update writes a new version: keys given replace the current ones, `null` clears one, keys
  left out stay; metadata merges. `POST /{id}/latest` writes the chosen version again as a new
  latest one (Ferryman's versions only move forward).
- The default assistant, `ferryman` (by that name or by `DEFAULT_ASSISTANT_ID`), is every
  owner's and is not stored: the server's own definition (FERRYMAN_MODEL, every tool). It reads
  like any other (get, versions, schemas, graph) but does not change (501); search and count
  list stored assistants alone.
- Everything is checked as the native API checks it (unknown tools are 422), another owner's
  assistant is 404, and `not_served` answers every path of the prefix no route serves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import cache
from typing import Annotated, Any, Literal, TypeVar
from uuid import UUID

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.routing import Match
from starlette.types import Scope

from app.api import schemas
from app.api.definitions import assistant_changes, assistant_definition
from app.api.deps import ProtocolCaller, ProtocolOwner, ServicesDep
from app.api.problems import problem
from app.domain import MAX_ASSISTANT_VERSIONS, MAX_ASSISTANTS_PER_OWNER, assistant_view, rfc3339
from app.errors import AssistantNotFound, NotFound, NotServed, ProblemCode
from app.protocols.agent_protocol.service import DEFAULT_ASSISTANT_ID, GRAPH_ID
from app.store import assistants as assistant_store

# The agent definition's fields, under their native names (the protocol's own fields are name,
# description and metadata).
DEFINITION_KEYS = tuple(schemas.Definition.model_fields)
_EMPTY_IS_UNSET = frozenset({"modelSettings", "approvalRequired", "compaction", "delegates"})
_KEYS_SAID = ", ".join(DEFINITION_KEYS)
UNTITLED = "Untitled"  # the protocol's name for an assistant created without one
# The default assistant: not stored, one for every owner, the server's own definition (as a
# LangGraph server has one per graph). Its id is fixed; `assistant_id: "ferryman"` names it too.
_STARTED = rfc3339(datetime.now(UTC))
MAX_ASSISTANT_SEARCH_LIMIT = 1000
MAX_ASSISTANT_SEARCH_OFFSET = 1_000_000
# The protocol's resources, for telling a path Ferryman does not serve (501) from one the
# protocol does not have either (404).
PROTOCOL_RESOURCES = frozenset(
    {"assistants", "threads", "runs", "crons", "store", "mcp", "a2a", "info", "ok"}
)

router = APIRouter(prefix="/assistants", tags=["agent-protocol"])
# `not_served` (below) is registered last in the package's router: what no route above serves.


# --- bodies -------------------------------------------------------------------------------------


ModelT = TypeVar("ModelT", bound=BaseModel)
T = TypeVar("T")
SortBy = Literal["assistant_id", "graph_id", "name", "created_at", "updated_at"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AssistantConfig(_Body):
    configurable: dict[str, Any] | None = Field(
        default=None, description="The agent definition, under the native field names."
    )


GraphId = Annotated[
    Literal["ferryman"], Field(description="Ferryman's agent loop, the one graph it serves.")
]
Definition = Annotated[
    dict[str, Any] | None,
    Field(description=f"The agent definition: {', '.join(DEFINITION_KEYS)} (native names)."),
]


class CreateAssistant(_Body):
    graph_id: GraphId
    assistant_id: UUID | None = None
    config: AssistantConfig | None = None
    context: Definition = None
    metadata: schemas.JsonObject | None = None
    if_exists: Literal["raise", "do_nothing"] = "raise"
    name: str | None = None
    description: str | None = None


class UpdateAssistant(_Body):
    graph_id: GraphId | None = None
    config: AssistantConfig | None = None
    context: Definition = None
    metadata: schemas.JsonObject | None = None
    name: str | None = None
    description: str | None = None


class SearchAssistants(_Body):
    metadata: schemas.JsonObject | None = None
    graph_id: str | None = None
    name: str | None = Field(default=None, max_length=200)
    limit: int = Field(default=10, ge=1, le=MAX_ASSISTANT_SEARCH_LIMIT)
    offset: int = Field(default=0, ge=0, le=MAX_ASSISTANT_SEARCH_OFFSET)
    sort_by: SortBy | None = None
    sort_order: Literal["asc", "desc"] | None = None
    select: list[Literal[
        "assistant_id", "graph_id", "name", "description", "config", "context",
        "created_at", "updated_at", "metadata", "version",
    ]] | None = None  # fmt: skip


class CountAssistants(_Body):
    metadata: schemas.JsonObject | None = None
    graph_id: str | None = None
    name: str | None = Field(default=None, max_length=200)


class ListVersions(_Body):
    metadata: schemas.JsonObject | None = None
    limit: int = Field(default=10, ge=1, le=MAX_ASSISTANT_SEARCH_LIMIT)
    offset: int = Field(default=0, ge=0, le=MAX_ASSISTANT_SEARCH_OFFSET)


class SetLatest(_Body):
    version: int = Field(ge=1)


# --- the shape the SDKs read --------------------------------------------------------------------


def protocol_view(assistant: dict[str, Any], *, with_updated_at: bool = True) -> dict[str, Any]:
    """A native assistant (its wire form) as the SDK's `Assistant` (or `AssistantVersion`)."""
    definition = _definition_of(assistant)
    view = {
        "assistant_id": assistant["id"],
        "graph_id": GRAPH_ID,
        "config": {"configurable": definition},
        "context": dict(definition),
        "metadata": assistant.get("metadata") or {},
        "version": assistant["version"],
        "name": assistant["name"],
        "description": assistant.get("description"),
        "created_at": assistant["createdAt"],
    }
    if with_updated_at:
        view["updated_at"] = assistant["updatedAt"]
    return view


# --- the definition in, checked as the native API checks it --------------------------------------


def _given_definition(
    config: AssistantConfig | None, context: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, tuple[str, ...]]]:
    """The definition keys a body gives, and where each came from (for errors at their field).
    Unknown keys are 422."""
    given: dict[str, Any] = {}
    origin: dict[str, tuple[str, ...]] = {}
    sources = (
        (("config", "configurable"), config.configurable if config else None),
        (("context",), context),  # second: where both name a key, context wins
    )
    errors = []
    for where, values in sources:
        for key, value in (values or {}).items():
            if key not in DEFINITION_KEYS:
                errors.append(
                    {
                        "type": "unknown_definition_key",
                        "loc": ("body", *where, key),
                        "msg": f"is not a key of the agent definition ({_KEYS_SAID})",
                        "input": value,
                    }
                )
                continue
            given[key], origin[key] = value, where
    if errors:
        raise RequestValidationError(errors)
    return given, origin


def _located(errors: list[Any], origin: dict[str, tuple[str, ...]]) -> list[Any]:
    """Native validation errors (`body.tools`) at the protocol's field (`body.context.tools`)."""
    moved = []
    for err in errors:
        loc = tuple(err.get("loc", ()))
        parts = loc[1:] if loc[:1] == ("body",) else loc
        where = origin.get(str(parts[0])) if parts else None
        moved.append({**err, "loc": ("body", *(where or ()), *parts)})
    return moved


def _validated(
    model: type[ModelT], fields: dict[str, Any], origin: dict[str, tuple[str, ...]]
) -> ModelT:
    """A native body of these fields; its errors at the protocol's fields."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise RequestValidationError(_located(exc.errors(), origin)) from None


async def _relocated(checked: Awaitable[T], origin: dict[str, tuple[str, ...]]) -> T:
    """What a native check answers (the tool names); its errors at the protocol's fields."""
    try:
        return await checked
    except RequestValidationError as exc:
        raise RequestValidationError(_located(list(exc.errors()), origin)) from None


def _definition_of(assistant: dict[str, Any]) -> dict[str, Any]:
    """The definition keys an assistant sets. Unset ones are left out: null, and the empty
    values that mean unset (no settings, no approvals; but `tools: []` is no tools at all)."""
    return {
        key: value
        for key in DEFINITION_KEYS
        if (value := assistant.get(key)) is not None and not (key in _EMPTY_IS_UNSET and not value)
    }


def is_default(raw_id: str) -> bool:
    """Whether an `assistant_id` names the default assistant (by the graph's name, as the
    SDKs' examples do, or by its id)."""
    return raw_id in (GRAPH_ID, str(DEFAULT_ASSISTANT_ID))


def default_assistant(services: ServicesDep) -> dict[str, Any]:
    """The default assistant, in the native wire form: the server's own definition."""
    return {
        "id": str(DEFAULT_ASSISTANT_ID),
        "name": GRAPH_ID,
        "description": "The server's default agent: FERRYMAN_MODEL, every tool.",
        "model": services.settings.model,
        "metadata": {"created_by": "system"},
        "version": 1,
        "createdAt": _STARTED,
        "updatedAt": _STARTED,
    }


def _stored_id(raw_id: str) -> UUID:
    """The id of a stored assistant (the default one is not stored: it cannot change)."""
    if is_default(raw_id):
        raise NotServed(
            f"the default assistant {GRAPH_ID!r} is the server's configuration and does not"
            " change; create an assistant for a definition of your own",
            path=f"/assistants/{raw_id}",
        )
    try:
        return UUID(raw_id)
    except ValueError:
        raise AssistantNotFound() from None


async def current_assistant(services: ServicesDep, owner: str, raw_id: str) -> dict[str, Any]:
    """The caller's assistant that an `assistant_id` names (a stored one's latest version, or
    the default one), in the native wire form; 404 for any other. What a run's
    `assistant_id` resolves to."""
    if is_default(raw_id):
        return default_assistant(services)
    async with services.db.connection() as conn:
        row = await assistant_store.get(conn, owner, _stored_id(raw_id))
    return assistant_view(row)


# --- the routes ---------------------------------------------------------------------------------


@router.post("", operation_id="agentProtocolCreateAssistant")
async def create_assistant(
    body: CreateAssistant, services: ServicesDep, owner: ProtocolOwner, caller: ProtocolCaller
) -> dict[str, Any]:
    """A new assistant (version 1). With the `assistant_id` of an existing one: 409, or with
    `if_exists: do_nothing` the caller's existing one as it is."""
    definition, origin = _given_definition(body.config, body.context)
    fields = {"model": services.settings.model, **definition, "name": body.name or UNTITLED}
    fields |= {
        k: v
        for k, v in (("description", body.description), ("metadata", body.metadata))
        if v is not None
    }
    native = _validated(schemas.CreateAssistant, fields, origin)
    stored = await _relocated(assistant_definition(services, native, caller), origin)
    async with services.db.transaction() as conn:
        if body.assistant_id is not None and body.if_exists == "do_nothing":
            with contextlib.suppress(AssistantNotFound):
                return protocol_view(
                    assistant_view(await assistant_store.get(conn, owner, body.assistant_id))
                )
        row = await assistant_store.create(conn, owner, stored, body.assistant_id)
    return protocol_view(assistant_view(row))


# Search sorts by these in memory (an owner has at most MAX_ASSISTANTS_PER_OWNER), except by
# the native order, newest first, which pages in the database.
_SORT_KEYS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "assistant_id": lambda row: str(row["id"]),
    "graph_id": lambda row: row["created_at"],  # one graph: as created
    "name": lambda row: row["name"],
    "created_at": lambda row: row["created_at"],
    "updated_at": lambda row: row["updated_at"],
}


async def _matching(
    services: ServicesDep,
    owner: str,
    *,
    name: str | None,
    metadata: dict[str, Any] | None,
    limit: int = MAX_ASSISTANTS_PER_OWNER,
    offset: int = 0,
) -> tuple[list[dict[str, Any]], bool]:
    """The owner's assistants (rows) whose name contains `name` and whose metadata holds
    `metadata`, newest first; and whether more follow."""
    async with services.db.connection() as conn:
        rows, more = await assistant_store.search(
            conn, owner, name=name or None, metadata=metadata or None, limit=limit, offset=offset
        )
    return rows, more is not None


@router.post("/search", operation_id="agentProtocolSearchAssistants")
async def search_assistants(
    body: SearchAssistants, services: ServicesDep, owner: ProtocolOwner, response: Response
) -> list[dict[str, Any]]:
    """The caller's assistants, `limit` from `offset`; `X-Pagination-Next` is the offset of the
    next page when there is one."""
    if body.graph_id not in (None, GRAPH_ID):
        return []
    sort_by, descending = body.sort_by or "created_at", (body.sort_order or "desc") == "desc"
    if sort_by == "created_at" and descending:
        rows, more = await _matching(
            services,
            owner,
            name=body.name,
            metadata=body.metadata,
            limit=body.limit,
            offset=body.offset,
        )
    else:
        every, _ = await _matching(services, owner, name=body.name, metadata=body.metadata)
        key = _SORT_KEYS[sort_by]
        every.sort(key=lambda row: (key(row), str(row["id"])), reverse=descending)
        rows = every[body.offset : body.offset + body.limit]
        more = len(every) > body.offset + body.limit
    if more:
        response.headers["X-Pagination-Next"] = str(body.offset + body.limit)
    views = [protocol_view(assistant_view(row)) for row in rows]
    if body.select:
        views = [{k: v for k, v in view.items() if k in body.select} for view in views]
    return views


@router.post("/count", operation_id="agentProtocolCountAssistants")
async def count_assistants(
    body: CountAssistants, services: ServicesDep, owner: ProtocolOwner
) -> int:
    if body.graph_id not in (None, GRAPH_ID):
        return 0
    rows, _ = await _matching(services, owner, name=body.name, metadata=body.metadata)
    return len(rows)


@router.get("/{assistant_id}", operation_id="agentProtocolGetAssistant")
async def get_assistant(
    assistant_id: str, services: ServicesDep, owner: ProtocolOwner
) -> dict[str, Any]:
    return protocol_view(await current_assistant(services, owner, assistant_id))


@router.patch("/{assistant_id}", operation_id="agentProtocolUpdateAssistant")
async def update_assistant(
    assistant_id: str,
    body: UpdateAssistant,
    services: ServicesDep,
    owner: ProtocolOwner,
    caller: ProtocolCaller,
) -> dict[str, Any]:
    """A new version: the definition keys given replace the current ones (`null` clears one),
    the others stay; `metadata` merges into the current metadata. Nothing to change: the
    assistant as it is."""
    stored = _stored_id(assistant_id)
    async with services.db.connection() as conn:
        latest = await assistant_store.get(conn, owner, stored)
    changes, origin = _given_definition(body.config, body.context)
    if body.name is not None:
        changes["name"] = body.name
    if body.description is not None:
        changes["description"] = body.description
    if body.metadata is not None:
        changes["metadata"] = {**(latest["metadata"] or {}), **body.metadata}
    if not changes:
        return protocol_view(assistant_view(latest))
    update = _validated(schemas.UpdateAssistant, changes, origin)
    native = await _relocated(assistant_changes(services, latest, update, caller), origin)
    async with services.db.transaction() as conn:
        row = await assistant_store.update(conn, owner, stored, native)
    return protocol_view(assistant_view(row))


@router.delete(
    "/{assistant_id}",
    operation_id="agentProtocolDeleteAssistant",
    status_code=status.HTTP_204_NO_CONTENT,
)
async def delete_assistant(
    assistant_id: str,
    services: ServicesDep,
    owner: ProtocolOwner,
    delete_threads: Annotated[
        bool, Query(description="Not served: sessions outlive their assistant.")
    ] = False,
) -> Response:
    """Deletes the assistant; the sessions created from it go on with the version they pinned."""
    stored = _stored_id(assistant_id)
    if delete_threads:
        raise NotServed(
            "delete_threads: sessions created from an assistant outlive it; delete them as threads",
            path=f"/assistants/{assistant_id}?delete_threads=true",
        )
    async with services.db.transaction() as conn:
        await assistant_store.delete(conn, owner, stored)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{assistant_id}/versions", operation_id="agentProtocolListAssistantVersions")
async def list_versions(
    assistant_id: str, body: ListVersions, services: ServicesDep, owner: ProtocolOwner
) -> list[dict[str, Any]]:
    """The assistant's versions, newest first, those whose metadata holds `metadata`."""
    if is_default(assistant_id):
        versions = [default_assistant(services)]
    else:
        async with services.db.connection() as conn:
            rows, _ = await assistant_store.versions(
                conn, owner, _stored_id(assistant_id), limit=MAX_ASSISTANT_VERSIONS
            )
        versions = [assistant_view(row) for row in rows]
    wanted = (body.metadata or {}).items()
    matching = [v for v in versions if wanted <= (v.get("metadata") or {}).items()]
    page = matching[body.offset : body.offset + body.limit]
    return [protocol_view(v, with_updated_at=False) for v in page]


@router.post("/{assistant_id}/latest", operation_id="agentProtocolSetLatestAssistantVersion")
async def set_latest(
    assistant_id: str, body: SetLatest, services: ServicesDep, owner: ProtocolOwner
) -> dict[str, Any]:
    """Makes `version` the one new sessions take: Ferryman's versions only move forward, so
    that version is written again as a new latest one (unless it is the latest)."""
    stored = _stored_id(assistant_id)
    async with services.db.transaction() as conn:
        latest = await assistant_store.get(conn, owner, stored)
        if body.version == latest["version"]:
            return protocol_view(assistant_view(latest))
        chosen = await assistant_store.get_version(conn, owner, stored, body.version)
        row = await assistant_store.update(
            conn, owner, stored, assistant_store.definition_of(chosen)
        )
    return protocol_view(assistant_view(row))


@router.get(
    "/{assistant_id}/schemas",
    operation_id="agentProtocolGetAssistantSchemas",
)
async def get_schemas(
    assistant_id: str, services: ServicesDep, owner: ProtocolOwner
) -> dict[str, Any]:
    """JSON schemas of Ferryman's agent loop: the input a run takes, the state a thread shows,
    and the definition an assistant carries (in `config.configurable` and in `context`)."""
    await current_assistant(services, owner, assistant_id)
    return graph_schemas()


@router.get(
    "/{assistant_id}/graph",
    operation_id="agentProtocolGetAssistantGraph",
)
async def get_graph(
    assistant_id: str,
    services: ServicesDep,
    owner: ProtocolOwner,
    xray: Annotated[bool | int, Query(description="Accepted; the loop has no subgraphs.")] = False,
) -> dict[str, Any]:
    """The agent loop as a drawable graph: the model, then the tools while it calls any."""
    await current_assistant(services, owner, assistant_id)
    return AGENT_LOOP


@router.get(
    "/{assistant_id}/subgraphs",
    operation_id="agentProtocolGetAssistantSubgraphs",
)
@router.get("/{assistant_id}/subgraphs/{namespace}", include_in_schema=False)
async def get_subgraphs(
    assistant_id: str,
    services: ServicesDep,
    owner: ProtocolOwner,
    recurse: bool = False,
) -> dict[str, Any]:
    """None: the agent loop has no subgraphs."""
    await current_assistant(services, owner, assistant_id)
    return {}


# --- what the agent loop looks like -------------------------------------------------------------

_MESSAGE = {
    "type": "object",
    "description": "A message as the SDKs parse it (LangChain's message format).",
    "properties": {
        "type": {"enum": ["human", "ai", "tool", "system"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array"}]},
        "id": {"type": "string"},
        "tool_calls": {"type": "array"},
        "tool_call_id": {"type": "string"},
    },
    "required": ["type", "content"],
}
_MESSAGES = {"type": "array", "items": _MESSAGE}


@cache
def graph_schemas() -> dict[str, Any]:
    native = schemas.Definition.model_json_schema()
    definition = {
        "title": "AgentDefinition",
        "type": "object",
        "properties": {k: native["properties"][k] for k in DEFINITION_KEYS},
        "additionalProperties": False,
    }
    if "$defs" in native:
        definition["$defs"] = native["$defs"]
    state = {
        "title": "FerrymanState",
        "type": "object",
        "properties": {"messages": _MESSAGES},
        "required": ["messages"],
    }
    return {
        "graph_id": GRAPH_ID,
        "input_schema": {
            "title": "FerrymanInput",
            "type": "object",
            "properties": {"messages": _MESSAGES},
            "description": "`messages` become user messages of the thread's session.",
        },
        "output_schema": state,
        "state_schema": state,
        "config_schema": {
            "title": "Config",
            "type": "object",
            "properties": {"configurable": definition},
        },
        "context_schema": definition,
    }


AGENT_LOOP: dict[str, Any] = {
    "nodes": [
        {"id": "__start__", "type": "schema", "data": "__start__"},
        {"id": "model", "type": "runnable", "data": {"name": "model"}},
        {"id": "tools", "type": "runnable", "data": {"name": "tools"}},
        {"id": "__end__", "type": "schema", "data": "__end__"},
    ],
    "edges": [
        {"source": "__start__", "target": "model"},
        {"source": "model", "target": "tools", "conditional": True},
        {"source": "model", "target": "__end__", "conditional": True},
        {"source": "tools", "target": "model"},
    ],
}


# --- what the prefix does not serve -------------------------------------------------------------

_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
# A request scope with this key asks which other routes take a path: the catch-all declines it.
_PROBE = "ferryman.not_served_probe"


class _CatchAll(APIRoute):
    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope.get(_PROBE):
            return Match.NONE, {}
        return super().matches(scope)


not_served = APIRouter(tags=["agent-protocol"], route_class=_CatchAll)


@not_served.api_route("/{path:path}", methods=_METHODS, include_in_schema=False)
async def not_served_path(path: str, request: Request) -> JSONResponse:
    """A path of the protocol Ferryman does not serve (crons, the store, ...): 501
    AGENT_PROTOCOL_NOT_SERVED naming it; a path the protocol has not either: 404. A path
    served with other methods: 405, with the methods it takes."""
    allowed = [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method, _PROBE: True})[0] == Match.FULL
            for route in request.app.router.routes
        )
    ]
    if allowed:
        return problem(
            405,
            ProblemCode.METHOD_NOT_ALLOWED,
            "Method Not Allowed",
            f"{request.method} is not a method of this path",
            {"Allow": ", ".join(allowed)},
        )
    served = request.url.path
    if path.split("/", 1)[0] in PROTOCOL_RESOURCES:
        raise NotServed(
            f"{request.method} {served} is part of the Agent Protocol that Ferryman does not"
            " serve (docs/langgraph.md lists what it serves)",
            path=served,
        )
    raise NotFound(f"no such path: {served}")
