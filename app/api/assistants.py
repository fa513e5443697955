"""The assistants API of SPEC section 8: an owner's stored agent definitions, versioned."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response, status
from fastapi.exceptions import RequestValidationError

from app.api import schemas
from app.api.definitions import assistant_changes, assistant_definition, parse_assistant_id
from app.api.deps import CallerDep, DatabaseDep, Owner, ServicesDep
from app.api.openapi import problems
from app.api.sessions import ANY_ERRORS, BODY_ERRORS, decode_page_token, encode_page_token
from app.domain import MAX_ASSISTANT_NAME_CHARS, MAX_METADATA_BYTES, assistant_view
from app.errors import InvalidPageToken
from app.store import assistants as assistant_store

router = APIRouter(prefix="/api/assistants", tags=["assistants"])

# An assistant's operations: 404 for an id that names none of the caller's assistants.
ASSISTANT_ERRORS = (*ANY_ERRORS, 404)

AssistantId = Annotated[
    str, Path(description="The assistant's id.", json_schema_extra={"format": "uuid"})
]
Limit = Annotated[int, Query(ge=1, le=200)]
PageToken = Annotated[str | None, Query(alias="pageToken", max_length=512)]


@router.post(
    "",
    operation_id="createAssistant",
    status_code=status.HTTP_201_CREATED,
    response_model=schemas.Assistant,
    responses=problems(*ANY_ERRORS, *BODY_ERRORS, 409),  # ASSISTANT_LIMIT_REACHED
)
async def create_assistant(
    body: schemas.CreateAssistant, caller: CallerDep, services: ServicesDep, response: Response
) -> dict[str, Any]:
    owner = caller.owner
    definition = await assistant_definition(services, body, caller, owner)
    async with services.db.transaction() as conn:
        row = await assistant_store.create(conn, owner, definition)
    response.headers["Location"] = f"/api/assistants/{row['id']}"
    return assistant_view(row)


@router.get(
    "",
    operation_id="listAssistants",
    response_model=schemas.AssistantList,
    responses=problems(*ANY_ERRORS, 400, 422),  # INVALID_PAGE_TOKEN, a bad limit or filter
)
async def list_assistants(
    owner: Owner,
    db: DatabaseDep,
    name: Annotated[
        schemas.Text | None,
        Query(
            min_length=1,
            max_length=MAX_ASSISTANT_NAME_CHARS,
            description="Only assistants whose name contains this text (case-insensitive).",
        ),
    ] = None,
    metadata: Annotated[
        str | None,
        Query(
            max_length=MAX_METADATA_BYTES,
            description="A JSON object: only assistants whose metadata contains it"
            ' (`{"team": "a"}` matches `{"team": "a", "tier": 1}`).',
        ),
    ] = None,
    limit: Limit = 50,
    page_token: PageToken = None,
) -> dict[str, Any]:
    """The owner's assistants at their latest versions, newest first."""
    after = decode_page_token(page_token) if page_token else None
    contains = _metadata_filter(metadata) if metadata is not None else None
    async with db.connection() as conn:
        rows, next_key = await assistant_store.search(
            conn, owner, name=name, metadata=contains, limit=limit, after=after
        )
    return {
        "assistants": [assistant_view(row) for row in rows],
        "nextPageToken": encode_page_token(next_key) if next_key else None,
    }


@router.get(
    "/{assistant_id}",
    operation_id="getAssistant",
    response_model=schemas.Assistant,
    responses=problems(*ASSISTANT_ERRORS),
)
async def get_assistant(assistant_id: AssistantId, owner: Owner, db: DatabaseDep) -> dict[str, Any]:
    async with db.connection() as conn:
        row = await assistant_store.get(conn, owner, parse_assistant_id(assistant_id))
    return assistant_view(row)


@router.patch(
    "/{assistant_id}",
    operation_id="updateAssistant",
    response_model=schemas.Assistant,
    responses=problems(*ASSISTANT_ERRORS, *BODY_ERRORS, 409),  # ASSISTANT_LIMIT_REACHED
)
async def update_assistant(
    assistant_id: AssistantId,
    body: schemas.UpdateAssistant,
    caller: CallerDep,
    services: ServicesDep,
) -> dict[str, Any]:
    """Write the next version: the latest with the fields given changed. Sessions created from
    an earlier version keep it."""
    aid, owner = parse_assistant_id(assistant_id), caller.owner
    async with services.db.connection() as conn:
        latest = await assistant_store.get(conn, owner, aid)
    changes = await assistant_changes(services, latest, body, caller)
    async with services.db.transaction() as conn:
        row = await assistant_store.update(conn, owner, aid, changes)
    return assistant_view(row)


@router.get(
    "/{assistant_id}/versions",
    operation_id="listAssistantVersions",
    response_model=schemas.AssistantVersions,
    responses=problems(*ASSISTANT_ERRORS, 400, 422),
)
async def list_versions(
    assistant_id: AssistantId,
    owner: Owner,
    db: DatabaseDep,
    limit: Limit = 50,
    page_token: PageToken = None,
) -> dict[str, Any]:
    """The assistant as each of its versions has it, newest first."""
    before = _decode_version_token(page_token) if page_token else None
    async with db.connection() as conn:
        rows, next_before = await assistant_store.versions(
            conn, owner, parse_assistant_id(assistant_id), limit=limit, before=before
        )
    return {
        "versions": [assistant_view(row) for row in rows],
        "nextPageToken": _encode_version_token(next_before) if next_before else None,
    }


@router.delete(
    "/{assistant_id}",
    operation_id="deleteAssistant",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problems(*ASSISTANT_ERRORS),
)
async def delete_assistant(assistant_id: AssistantId, owner: Owner, db: DatabaseDep) -> Response:
    """Sessions created from it go on with the version they pinned."""
    async with db.transaction() as conn:
        await assistant_store.delete(conn, owner, parse_assistant_id(assistant_id))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def _metadata_filter(raw: str) -> dict[str, Any]:
    """The `metadata` query parameter as the object to match; 422 when it is not one."""
    problem = 'must be a JSON object, such as {"team": "a"}'
    try:
        value = json.loads(raw)
        if isinstance(value, dict):
            schemas.storable(value)
            return value
    except ValueError as exc:
        problem = f"must be a JSON object that could be stored: {exc}"
    raise RequestValidationError(
        [{"type": "json_object", "loc": ("query", "metadata"), "msg": problem, "input": raw}]
    )


def _encode_version_token(before: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"v": before}).encode()).decode().rstrip("=")


def _decode_version_token(token: str) -> int:
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        before = data["v"]
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError):
        before = None
    if not isinstance(before, int) or isinstance(before, bool) or not 1 <= before <= 2**31 - 1:
        raise InvalidPageToken("pageToken is not one this server issued")
    return before
