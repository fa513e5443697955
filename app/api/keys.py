"""The keys API (docs/tenants.md): an operator's, not an owner's. Every route wants
`Authorization: Bearer <FERRYMAN_ADMIN_TOKEN>`; with no token set, the API answers 404 as if it
were not there. A key's plaintext is shown once, by its create; only its digest is stored."""

from __future__ import annotations

import hmac
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status

from app.api import schemas
from app.api.deps import ServicesDep
from app.api.openapi import problems
from app.api.sessions import parse_id
from app.domain import rfc3339
from app.errors import AuthRequired, InvalidApiKey, KeyNotFound, NotFound
from app.store import keys as key_store


async def _admin_access(services: ServicesDep, request: Request) -> None:
    expected = services.settings.admin_token
    if expected is None:
        raise NotFound("Not Found")
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise AuthRequired("the keys API needs `Authorization: Bearer <FERRYMAN_ADMIN_TOKEN>`")
    if not hmac.compare_digest(token.encode(), expected.get_secret_value().encode()):
        raise InvalidApiKey("this is not FERRYMAN_ADMIN_TOKEN")


router = APIRouter(prefix="/api/keys", tags=["keys"], dependencies=[Depends(_admin_access)])
# Every route: no or a wrong admin token (401), no admin token set (404), the database (503).
KEY_ERRORS = (401, 404, 503)
KeyId = Annotated[str, Path(description="The key's id.", json_schema_extra={"format": "uuid"})]


def key_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": str(row["id"]),
        "ownerId": row["owner_id"],
        "name": row["name"],
        "prefix": row["prefix"],
        "policy": row["policy"],
        "createdAt": rfc3339(row["created_at"]),
        "lastUsedAt": rfc3339(row["last_used_at"]),
        "revokedAt": rfc3339(row["revoked_at"]),
    }


def _key_id(raw: str) -> UUID:
    return parse_id(raw, KeyNotFound)


@router.post(
    "",
    operation_id="createKey",
    status_code=status.HTTP_201_CREATED,
    response_model=schemas.CreatedKey,
    responses=problems(*KEY_ERRORS, 400, 413, 415, 422),
)
async def create_key(body: schemas.CreateKey, services: ServicesDep) -> dict[str, Any]:
    """A new key for `owner`, with its policy; the answer's `key` is shown this once."""
    async with services.db.transaction() as conn:
        row, key = await key_store.create_key(conn, body.owner, body.name, body.policy.stored())
    return {**key_view(row), "key": key}


@router.get(
    "",
    operation_id="listKeys",
    response_model=schemas.KeyList,
    responses=problems(*KEY_ERRORS, 422),
)
async def list_keys(
    services: ServicesDep,
    owner: Annotated[str | None, Query(max_length=128, description="Only its keys.")] = None,
) -> dict[str, Any]:
    """Every key (revoked ones too), oldest first; never the keys themselves."""
    async with services.db.connection() as conn:
        rows = await key_store.list_keys(conn, owner)
    return {"keys": [key_view(row) for row in rows]}


@router.patch(
    "/{key_id}",
    operation_id="updateKey",
    response_model=schemas.ApiKey,
    responses=problems(*KEY_ERRORS, 400, 413, 415, 422),
)
async def update_key(
    key_id: KeyId, body: schemas.UpdateKey, services: ServicesDep
) -> dict[str, Any]:
    """Rename a key or change its policy (merged: a field given as null goes back to the
    default). It applies from the key's next request. 404 KEY_NOT_FOUND for a revoked one."""
    policy = body.policy.model_dump(mode="json", exclude_unset=True) if body.policy else {}
    async with services.db.transaction() as conn:
        row = await key_store.update_key(conn, _key_id(key_id), body.name, policy)
    if row is None:
        raise KeyNotFound()
    return key_view(row)


@router.delete(
    "/{key_id}",
    operation_id="revokeKey",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problems(*KEY_ERRORS),
)
async def revoke_key(key_id: KeyId, services: ServicesDep) -> Response:
    """Revoke a key: its next request is 401. 404 KEY_NOT_FOUND if it is revoked already."""
    async with services.db.transaction() as conn:
        revoked = await key_store.revoke_key(conn, _key_id(key_id))
    if not revoked:
        raise KeyNotFound()
    return Response(status_code=status.HTTP_204_NO_CONTENT)
