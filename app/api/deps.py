"""Dependencies as `Annotated` aliases: the services, the database, the calling owner."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.db.pool import Database
from app.errors import AuthRequired, InvalidApiKey, TokenInvalid
from app.services import Services
from app.store import keys
from app.tokens import TokenVerifier

LOCAL_OWNER = "local"

_bearer = HTTPBearer(auto_error=False, description="An API key from `ferryman keys create`.")


# Dependencies are `async def` even when they do not await: FastAPI runs a plain `def` one in
# its thread pool, a thread handoff on every request.
async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_db(services: ServicesDep) -> Database:
    return services.db


DatabaseDep = Annotated[Database, Depends(get_db)]


async def resolve_owner(services: Services, request: Request, token: str | None) -> str:
    """The one place a request's credential becomes its owner, in every auth mode."""
    if services.tokens is not None:
        return await _token_owner(services.tokens, request, token)
    if token is None and request.headers.get("authorization"):
        raise InvalidApiKey("the Authorization header must be `Bearer <api key>`")
    if token:
        async with services.db.connection() as conn:
            owner = await keys.owner_for_key(conn, token)
        if owner is None:
            raise InvalidApiKey("the API key is unknown or revoked")
        return owner
    if services.settings.auth_mode == "local":
        return LOCAL_OWNER
    raise AuthRequired("an API key is required: send `Authorization: Bearer <key>`")


async def _token_owner(tokens: TokenVerifier, request: Request, token: str | None) -> str:
    if token:
        return await tokens.owner(token)
    if request.headers.get("authorization"):
        raise TokenInvalid("the Authorization header must be `Bearer <token>`")
    raise AuthRequired(
        "a token of the identity provider is required: send `Authorization: Bearer <token>`"
    )


async def current_owner(
    services: ServicesDep,
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    token = credentials.credentials if credentials else None
    return await resolve_owner(services, request, token)


async def current_stream_owner(
    services: ServicesDep,
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    access_token: Annotated[
        str | None,
        Query(
            alias="access_token",
            description="The API key (or, with FERRYMAN_AUTH=jwt, the token), for browsers'"
            " EventSource, which cannot send headers. Access logs are off, so it is not logged.",
        ),
    ] = None,
) -> str:
    token = credentials.credentials if credentials else access_token
    return await resolve_owner(services, request, token)


async def current_protocol_owner(
    services: ServicesDep,
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The Agent Protocol's caller: the LangGraph SDKs send the key as `x-api-key`."""
    token = credentials.credentials if credentials else request.headers.get("x-api-key")
    return await resolve_owner(services, request, token or None)


Owner = Annotated[str, Depends(current_owner)]
ProtocolOwner = Annotated[str, Depends(current_protocol_owner)]
StreamOwner = Annotated[str, Depends(current_stream_owner)]
