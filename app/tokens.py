"""Bearer JWTs of an identity provider (FERRYMAN_AUTH=jwt): its key set (JWKS), cached, and
the checks a token passes before its claim names the owner. Every refusal is an Unauthorized
error (401); nothing here logs a token."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx2
import jwt

from app.config import Settings
from app.domain import check_owner_id
from app.errors import TokenExpired, TokenInvalid, TokenKeysUnavailable

log = logging.getLogger(__name__)

# A key set bigger than this is refused: a few dozen keys take a few kilobytes.
MAX_JWKS_BYTES = 1_048_576

JWK = dict[str, Any]


class KeySetUnavailable(Exception):
    """The key set could not be fetched, or what came is not one; the message says which."""


class KeySet:
    """The identity provider's signing keys by `kid`, fetched when first needed, again once
    `max_age` old, and again when a token names a `kid` the set lacks (rotation): every fetch
    at most once per `refetch_interval`, one at a time. A failed fetch keeps the keys it had."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        refetch_interval: float,
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.refetch_interval = refetch_interval
        self.max_age = max_age
        self.clock = clock
        self._keys: dict[str, JWK] = {}
        self._parsed: dict[tuple[str, str], jwt.PyJWK] = {}
        self._fetched_at: float | None = None
        self._tried_at: float | None = None
        self._error = "not fetched yet"
        self._lock = asyncio.Lock()

    async def key(self, kid: str, algorithm: str) -> jwt.PyJWK:
        """The key `kid` for `algorithm`; TokenInvalid if the set has none such,
        TokenKeysUnavailable if the set was never fetched."""
        if self._stale() and self._may_try():
            await self._refresh()
        if kid not in self._keys:
            if self._may_try():
                await self._refresh()
            elif self._lock.locked():  # a fetch under way may bring it
                async with self._lock:
                    pass
        jwk = self._keys.get(kid)
        if jwk is None:
            if self._fetched_at is None:
                raise TokenKeysUnavailable(
                    "the identity provider's keys (FERRYMAN_JWT_JWKS_URL) cannot be fetched"
                    f" ({self._error}), so no token can be checked; retry later"
                )
            raise TokenInvalid(
                f"the identity provider's key set has no key {kid[:80]!r} (the token's `kid`)"
            )
        return self._parse(kid, algorithm, jwk)

    def _stale(self) -> bool:
        return self._fetched_at is None or self.clock() - self._fetched_at >= self.max_age

    def _may_try(self) -> bool:
        return self._tried_at is None or self.clock() - self._tried_at >= self.refetch_interval

    async def _refresh(self) -> None:
        tried = self._tried_at
        async with self._lock:
            if self._tried_at != tried:  # fetched while this request waited for the lock
                return
            self._tried_at = self.clock()
            try:
                keys = await fetch_key_set(self.url, self.timeout)
            except KeySetUnavailable as exc:
                self._error = str(exc)
                log.warning(
                    "the identity provider's keys at %s cannot be fetched: %s", self.url, exc
                )
                return
            self._keys, self._parsed, self._fetched_at = keys, {}, self._tried_at

    def _parse(self, kid: str, algorithm: str, jwk: JWK) -> jwt.PyJWK:
        declared = jwk.get("alg")
        if declared is not None and declared != algorithm:
            raise TokenInvalid(f"key {kid[:80]!r} is for {declared}, the token says {algorithm}")
        parsed = self._parsed.get((kid, algorithm))
        if parsed is None:
            try:
                parsed = jwt.PyJWK(jwk, algorithm=algorithm)
            # The set is another server's data: a key of the wrong type (an RSA key for
            # ES256) or a broken one is the token's failure, not ours.
            except (jwt.PyJWTError, ValueError, KeyError, TypeError) as exc:
                raise TokenInvalid(
                    f"key {kid[:80]!r} of the identity provider's set is no {algorithm} key"
                    f" ({type(exc).__name__})"
                ) from exc
            self._parsed[(kid, algorithm)] = parsed
        return parsed


async def fetch_key_set(url: str, timeout: float) -> dict[str, JWK]:
    """The signing keys of the JWK set at `url`, by `kid`, within `timeout` seconds in all."""
    try:
        async with (
            asyncio.timeout(timeout),
            httpx2.AsyncClient(timeout=timeout) as http,
            http.stream("GET", url, headers={"Accept": "application/json"}) as answer,
        ):
            if answer.status_code != 200:
                raise KeySetUnavailable(f"it answered HTTP {answer.status_code}")
            body = bytearray()
            async for chunk in answer.aiter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise KeySetUnavailable(f"it is over {MAX_JWKS_BYTES} bytes")
    except TimeoutError as exc:
        raise KeySetUnavailable(f"no answer in {timeout:g} s (FERRYMAN_JWT_JWKS_TIMEOUT)") from exc
    except httpx2.HTTPError as exc:
        raise KeySetUnavailable(f"{type(exc).__name__}: {exc}") from exc
    return signing_keys(bytes(body))


def signing_keys(body: bytes) -> dict[str, JWK]:
    """The keys of a JWK set a token can name: those with a `kid`, for signatures, public.
    An encryption key or one with private parts (a misconfigured set) is never used."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise KeySetUnavailable("it is not JSON") from exc
    keys = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(keys, list):
        raise KeySetUnavailable("it is not a JWK set (no `keys` list)")
    return {
        key["kid"]: key
        for key in keys
        if isinstance(key, dict)
        and isinstance(key.get("kid"), str)
        and key.get("use", "sig") == "sig"
        and "d" not in key
    }


class TokenVerifier:
    """The owner a bearer JWT names, once its signature, algorithm, issuer, audience and times
    are checked."""

    def __init__(self, settings: Settings) -> None:
        assert settings.jwt_jwks_url and settings.jwt_issuer and settings.jwt_audience
        self.issuer = settings.jwt_issuer
        self.audience = settings.jwt_audience
        self.owner_claim = settings.jwt_owner_claim
        self.algorithms = frozenset(settings.jwt_algorithm_names())
        self.leeway = settings.jwt_leeway
        self.keys = KeySet(
            settings.jwt_jwks_url,
            timeout=settings.jwt_jwks_timeout,
            refetch_interval=settings.jwt_jwks_refetch_interval,
            max_age=settings.jwt_jwks_max_age,
        )

    async def owner(self, token: str) -> str:
        header = _header(token)
        algorithm, kid = header.get("alg"), header.get("kid")
        # Pinned before any key is looked at: `none` and HS256 (which would take the public
        # key as its secret) never reach PyJWT.
        if not isinstance(algorithm, str) or algorithm not in self.algorithms:
            raise TokenInvalid(
                f"a token signed with {str(algorithm)[:20]!r} is not accepted; tokens must be"
                f" signed with one of {', '.join(sorted(self.algorithms))}"
                " (FERRYMAN_JWT_ALGORITHMS)"
            )
        if not isinstance(kid, str):
            raise TokenInvalid("the token's header names no key (`kid`)")
        key = await self.keys.key(kid, algorithm)
        return self._owner(self._claims(token, key, algorithm))

    def _claims(self, token: str, key: jwt.PyJWK, algorithm: str) -> dict[str, Any]:
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=[algorithm],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise TokenExpired("the token has expired; get a new one") from exc
        except jwt.InvalidSignatureError as exc:
            raise TokenInvalid("the token's signature does not verify") from exc
        except jwt.InvalidIssuerError as exc:
            raise TokenInvalid("the token's `iss` is not FERRYMAN_JWT_ISSUER") from exc
        except jwt.InvalidAudienceError as exc:
            raise TokenInvalid("the token's `aud` does not name FERRYMAN_JWT_AUDIENCE") from exc
        except jwt.ImmatureSignatureError as exc:
            raise TokenInvalid("the token is not valid yet (`nbf` or `iat`)") from exc
        except jwt.PyJWTError as exc:  # PyJWT's messages never quote the token
            raise TokenInvalid(f"the token is not valid: {exc}") from exc
        return claims

    def _owner(self, claims: dict[str, Any]) -> str:
        owner = claims.get(self.owner_claim)
        if not isinstance(owner, str) or not owner:
            raise TokenInvalid(
                f"the token has no `{self.owner_claim}` claim (FERRYMAN_JWT_OWNER_CLAIM) to"
                " name its owner"
            )
        try:
            return check_owner_id(owner)
        except ValueError as exc:
            raise TokenInvalid(f"the token's `{self.owner_claim}` claim: {exc}") from exc


def _header(token: str) -> dict[str, Any]:
    try:
        return jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise TokenInvalid(
            "the bearer token is not a JWT (API keys are not taken when FERRYMAN_AUTH=jwt)"
        ) from exc
