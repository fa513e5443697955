"""Dependencies as `Annotated` aliases: the services, the database, the caller and its owner."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any
from uuid import UUID

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


@dataclass(frozen=True)
class Caller:
    """Who is calling: the owner and, in keys mode, the key with its policy (`api_keys.policy`,
    docs/tenants.md: `{}` is a key with the defaults). Local and jwt callers have no key."""

    owner: str
    key_id: UUID | None = None
    policy: Mapping[str, Any] = field(default_factory=dict)

    @property
    def priority(self) -> int:
        """The priority of the sessions it creates without one: its key's policy's, else 0."""
        return int(self.policy.get("priority", 0))


async def resolve_caller(services: Services, request: Request, token: str | None) -> Caller:
    """The one place a request's credential becomes its caller, in every auth mode."""
    if services.tokens is not None:
        return Caller(await _token_owner(services.tokens, request, token))
    if token is None and request.headers.get("authorization"):
        raise InvalidApiKey("the Authorization header must be `Bearer <api key>`")
    if token:
        async with services.db.connection() as conn:
            row = await keys.find_key(conn, token)
        if row is None:
            raise InvalidApiKey("the API key is unknown or revoked")
        return Caller(row["owner_id"], row["id"], row["policy"])
    if services.settings.auth_mode == "local":
        return Caller(LOCAL_OWNER)
    raise AuthRequired("an API key is required: send `Authorization: Bearer <key>`")


async def _token_owner(tokens: TokenVerifier, request: Request, token: str | None) -> str:
    if token:
        return await tokens.owner(token)
    if request.headers.get("authorization"):
        raise TokenInvalid("the Authorization header must be `Bearer <token>`")
    raise AuthRequired(
        "a token of the identity provider is required: send `Authorization: Bearer <token>`"
    )


# Each caller dependency is resolved once a request (FastAPI caches a dependency per request), so
# a route that takes both the Caller and its Owner reads the key once.
async def current_caller(
    services: ServicesDep,
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    token = credentials.credentials if credentials else None
    return await resolve_caller(services, request, token)


async def current_stream_caller(
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
) -> Caller:
    token = credentials.credentials if credentials else access_token
    return await resolve_caller(services, request, token)


async def current_protocol_caller(
    services: ServicesDep,
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    """The Agent Protocol's caller: the LangGraph SDKs send the key as `x-api-key`."""
    token = credentials.credentials if credentials else request.headers.get("x-api-key")
    return await resolve_caller(services, request, token or None)


CallerDep = Annotated[Caller, Depends(current_caller)]
ProtocolCaller = Annotated[Caller, Depends(current_protocol_caller)]
StreamCaller = Annotated[Caller, Depends(current_stream_caller)]


async def current_owner(caller: CallerDep) -> str:
    return caller.owner


async def current_protocol_owner(caller: ProtocolCaller) -> str:
    return caller.owner


async def current_stream_owner(caller: StreamCaller) -> str:
    return caller.owner


Owner = Annotated[str, Depends(current_owner)]
ProtocolOwner = Annotated[str, Depends(current_protocol_owner)]
StreamOwner = Annotated[str, Depends(current_stream_owner)]
