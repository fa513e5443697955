"""FERRYMAN_AUTH=jwt: a real server checks tokens the tests sign with keys they generate,
against a JWKS served by a real HTTP server in the test process (key rotation, the bounded
refetch, the key set down), on the native API, its streams and the Agent Protocol."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph_sdk import get_client
from langgraph_sdk.errors import NotFoundError

from app.config import Settings
from app.errors import Unauthorized
from app.tokens import MAX_JWKS_BYTES, KeySetUnavailable, TokenVerifier, fetch_key_set
from tests.support import (
    ServerProcess,
    assert_problem,
    client,
    create_session,
    free_port,
    sse,
)
from tests.test_ag_ui import run, run_input, scripted, user

ISSUER = "https://idp.test/"
AUDIENCE = "ferryman-test"
SigningKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


def new_rsa() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_jwk(key: SigningKey, kid: str) -> dict[str, Any]:
    if isinstance(key, rsa.RSAPrivateKey):
        text = jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key())
    else:
        text = jwt.algorithms.ECAlgorithm.to_jwk(key.public_key())
    return {**json.loads(text), "kid": kid, "use": "sig"}


@dataclass
class IdentityProvider:
    """A JWKS endpoint (a thread of the test process) on an ephemeral port: its document can
    change, and it notes the time of each fetch on the system's monotonic clock, the one the
    server's refetch interval is measured on (so a test can wait until the interval is past)."""

    port: int = 0
    body: bytes = b'{"keys": []}'
    fetches: list[float] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/.well-known/jwks.json"

    def publish(self, *keys: tuple[SigningKey, str]) -> None:
        self.body = json.dumps({"keys": [public_jwk(key, kid) for key, kid in keys]}).encode()

    def start(self) -> IdentityProvider:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                provider.fetches.append(time.monotonic())
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(provider.body)))
                self.end_headers()
                self.wfile.write(provider.body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()


def claims(sub: str | None = "alice", **more: Any) -> dict[str, Any]:
    now = int(time.time())
    base: dict[str, Any] = {"iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 600}
    if sub is not None:
        base["sub"] = sub
    return {**base, **more}


def sign(key: SigningKey, kid: str, payload: dict[str, Any] | None = None, alg: str = "") -> str:
    alg = alg or ("RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256")
    return jwt.encode(payload or claims(), key, algorithm=alg, headers={"kid": kid})


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(header: dict[str, Any], payload: dict[str, Any]) -> str:
    """header.payload, as JSON base64url, with no signature yet."""
    return f"{b64(json.dumps(header).encode())}.{b64(json.dumps(payload).encode())}"


def server_env(provider: IdentityProvider, **more: str) -> dict[str, str]:
    return {
        "FERRYMAN_AUTH": "jwt",
        "FERRYMAN_JWT_JWKS_URL": provider.url,
        "FERRYMAN_JWT_ISSUER": ISSUER,
        "FERRYMAN_JWT_AUDIENCE": AUDIENCE,
        **more,
    }


def assert_refused(response: httpx.Response, code: str) -> None:
    assert_problem(response, 401, code)
    assert response.headers["www-authenticate"].startswith("Bearer"), response.headers


# --- one provider and one server for the module ------------------------------------------------

RSA_KEY = new_rsa()
EC_KEY = ec.generate_private_key(ec.SECP256R1())


@pytest.fixture(scope="module")
def provider() -> Iterator[IdentityProvider]:
    idp = IdentityProvider()
    idp.publish((RSA_KEY, "rsa-1"), (EC_KEY, "ec-1"))
    idp.start()
    yield idp
    idp.stop()


@pytest.fixture(scope="module")
def jwt_server(database_url: str, provider: IdentityProvider) -> Iterator[ServerProcess]:
    # With a worker, for the AG-UI run.
    proc = ServerProcess(database_url, env=server_env(provider), worker=True).start()
    yield proc
    proc.stop()


def token_for(sub: str) -> str:
    return sign(RSA_KEY, "rsa-1", claims(sub))


def a_subject() -> str:
    return f"user-{uuid.uuid4().hex[:10]}"


async def test_a_token_names_its_owner_and_owners_are_apart(jwt_server: ServerProcess) -> None:
    alice, bob = a_subject(), a_subject()
    async with (
        client(jwt_server.url, token_for(alice)) as a,
        client(jwt_server.url, sign(EC_KEY, "ec-1", claims(bob))) as b,
    ):
        session = await create_session(a, "alice's")
        assert session["ownerId"] == alice
        listed = (await a.get("/api/agent")).json()["sessions"]
        assert [s["id"] for s in listed] == [session["id"]]
        # Bob (an ES256 token) sees none of it: 404, never 403.
        assert_problem(await b.get(f"/api/agent/{session['id']}"), 404, "SESSION_NOT_FOUND")
        assert (await b.get("/api/agent")).json()["sessions"] == []
        # A new token of the same subject is the same owner.
        a.headers["Authorization"] = f"Bearer {token_for(alice)}"
        assert (await a.get(f"/api/agent/{session['id']}")).status_code == 200
        # /metrics wants FERRYMAN_METRICS_TOKEN, which is not set here: no owner's token reads it.
        assert_problem(await a.get("/metrics"), 403, "METRICS_TOKEN_REQUIRED")


def bad_tokens() -> dict[str, tuple[str, str]]:
    """Each way a token can be wrong: (token, code)."""
    now = int(time.time())
    good = token_for("mallory")
    header, payload, _ = good.split(".")
    forged_payload = b64(json.dumps(claims("alice")).encode())
    public_pem = RSA_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    hs_unsigned = unsigned({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}, claims("alice"))
    hs_signature = hmac.new(public_pem, hs_unsigned.encode(), hashlib.sha256).digest()
    return {
        "another key's signature": (sign(new_rsa(), "rsa-1"), "TOKEN_INVALID"),
        "a changed payload": (f"{header}.{forged_payload}.{good.split('.')[2]}", "TOKEN_INVALID"),
        "no signature": (f"{header}.{payload}.", "TOKEN_INVALID"),
        "expired": (
            sign(RSA_KEY, "rsa-1", claims(exp=now - 120, iat=now - 720)),
            "TOKEN_EXPIRED",
        ),
        "not valid yet": (sign(RSA_KEY, "rsa-1", claims(nbf=now + 600)), "TOKEN_INVALID"),
        "another issuer": (sign(RSA_KEY, "rsa-1", claims(iss="https://evil/")), "TOKEN_INVALID"),
        "another audience": (sign(RSA_KEY, "rsa-1", claims(aud="someone-else")), "TOKEN_INVALID"),
        "no exp": (
            sign(RSA_KEY, "rsa-1", {k: v for k, v in claims().items() if k != "exp"}),
            "TOKEN_INVALID",
        ),
        "alg none": (
            unsigned({"alg": "none", "typ": "JWT", "kid": "rsa-1"}, claims()) + ".",
            "TOKEN_INVALID",
        ),
        "HS256 keyed with the RSA public key": (
            f"{hs_unsigned}.{b64(hs_signature)}",
            "TOKEN_INVALID",
        ),
        "RS256 naming the EC key": (
            unsigned({"alg": "RS256", "kid": "ec-1"}, claims()) + ".AAAA",
            "TOKEN_INVALID",
        ),
        "no kid": (jwt.encode(claims(), RSA_KEY, algorithm="RS256"), "TOKEN_INVALID"),
        "no owner claim": (sign(RSA_KEY, "rsa-1", claims(sub=None)), "TOKEN_INVALID"),
        "an empty owner": (sign(RSA_KEY, "rsa-1", claims(sub="")), "TOKEN_INVALID"),
        "an owner of another form": (sign(RSA_KEY, "rsa-1", claims("auth0|42")), "TOKEN_INVALID"),
        "not a JWT": ("fm_0123456789abcdef", "TOKEN_INVALID"),
    }


async def test_each_bad_token_is_401_with_its_code(jwt_server: ServerProcess) -> None:
    sid = str(uuid.uuid4())
    async with client(jwt_server.url) as http:
        for name, (token, code) in bad_tokens().items():
            headers = {"Authorization": f"Bearer {token}"}
            for response in (
                await http.get("/api/agent", headers=headers),
                await http.post("/api/agent", json={"prompt": "x"}, headers=headers),
                await http.get("/api/agent/owner-events", headers=headers),
                await http.get(f"/api/agent/{sid}/events", params={"access_token": token}),
                await http.post("/agent-protocol/threads/search", json={}, headers=headers),
                await http.post(
                    "/agent-protocol/threads/search", json={}, headers={"x-api-key": token}
                ),
                await http.post("/ag-ui/agent", json={}, headers=headers),
            ):
                try:
                    assert_refused(response, code)
                except AssertionError as exc:
                    raise AssertionError(f"{name}: {response.request.url.path}") from exc
        # No credential; a header of another scheme.
        assert_refused(await http.get("/api/agent"), "AUTH_REQUIRED")
        for headers in ({"Authorization": "Basic x"}, {"Authorization": "Bearer"}):
            assert_refused(await http.get("/api/agent", headers=headers), "TOKEN_INVALID")
        # The probes stay open.
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).status_code == 200


async def test_streams_take_the_token(jwt_server: ServerProcess) -> None:
    subject = a_subject()
    token = token_for(subject)
    async with client(jwt_server.url, token) as http, client(jwt_server.url) as browser:
        async with sse(http, "/api/agent/owner-events") as owner_events:
            assert (await anext(owner_events)).event == "caught_up"
            session = await create_session(http, "streamed")
            async with asyncio.timeout(10):
                event = await anext(owner_events)
            assert (event.event, event.json()["sessionId"]) == ("session_created", session["id"])
        # An EventSource's way: the token as `access_token`, no header.
        path = f"/api/agent/{session['id']}/events"
        async with sse(browser, path, access_token=token) as events:
            async with asyncio.timeout(10):
                first = await anext(events)
            assert (first.event, first.json()["data"]["text"]) == ("user_message", "streamed")
        other = token_for(a_subject())
        response = await browser.get(path, params={"access_token": other})
        assert_problem(response, 404, "SESSION_NOT_FOUND")


async def test_the_agent_protocol_sdk_sends_the_token(jwt_server: ServerProcess) -> None:
    mine = get_client(url=f"{jwt_server.url}/agent-protocol", api_key=token_for(a_subject()))
    theirs = get_client(url=f"{jwt_server.url}/agent-protocol", api_key=token_for(a_subject()))
    thread = await mine.threads.create(metadata={"via": "jwt"})
    assert (await mine.threads.get(thread["thread_id"]))["metadata"]["via"] == "jwt"
    with pytest.raises(NotFoundError):
        await theirs.threads.get(thread["thread_id"])


async def test_ag_ui_takes_the_token(jwt_server: ServerProcess) -> None:
    thread_id = str(uuid.uuid4())
    body = run_input(thread_id, [user("hi")], forwardedProps=scripted([{"text": "Hello."}]))
    async with client(jwt_server.url, token_for(subject := a_subject())) as http:
        events = await run(http, "/ag-ui/agent", body)
        assert events[-1].type == "RUN_FINISHED"
        session = (await http.get(f"/api/agent/{thread_id}")).json()
        assert session["ownerId"] == subject
    async with client(jwt_server.url, token_for(a_subject())) as other:
        response = await other.get(f"/api/agent/{thread_id}")
        assert_problem(response, 404, "SESSION_NOT_FOUND")


def test_tokens_never_reach_the_logs(jwt_server: ServerProcess) -> None:
    """Runs after the tests above (file order), which sent good and bad tokens in headers and
    as `access_token`: nothing like a JWT (its header's JSON, base64url, begins `eyJ`) is in
    the server's log, nor the token that is no JWT."""
    logs = jwt_server.logs(tail=None)
    assert "Ferryman on" in logs  # the right log
    assert "eyJ" not in logs
    assert bad_tokens()["not a JWT"][0] not in logs


# --- key rotation and the bounded refetch --------------------------------------------------------

REFETCH = 4.0  # FERRYMAN_JWT_JWKS_REFETCH_INTERVAL of the servers below


def wait_past(moment: float, margin: float = 0.3) -> None:
    time.sleep(max(0.0, moment + REFETCH + margin - time.monotonic()))


async def test_rotation_refetches_at_a_bounded_rate(database_url: str) -> None:
    old, new = new_rsa(), new_rsa()
    idp = IdentityProvider()
    idp.publish((old, "old"))
    idp.start()
    proc = ServerProcess(
        database_url, env=server_env(idp, FERRYMAN_JWT_JWKS_REFETCH_INTERVAL=str(REFETCH))
    ).start()
    try:
        subject = a_subject()
        async with client(proc.url) as http:

            async def get(key: SigningKey, kid: str) -> httpx.Response:
                token = sign(key, kid, claims(subject))
                return await http.get("/api/agent", headers={"Authorization": f"Bearer {token}"})

            assert (await get(old, "old")).status_code == 200
            assert len(idp.fetches) == 1
            assert (await get(old, "old")).status_code == 200  # cached
            assert len(idp.fetches) == 1

            # The provider rotates: "new" replaces "old". Within the interval, tokens with the
            # new kid (many at once) fetch nothing.
            idp.publish((new, "new"))
            for response in await asyncio.gather(*(get(new, "new") for _ in range(10))):
                assert_refused(response, "TOKEN_INVALID")
            assert len(idp.fetches) == 1
            # Once the interval is past, one of them fetches the set again: the new key works,
            # the withdrawn one no longer does.
            wait_past(idp.fetches[-1])
            assert (await get(new, "new")).status_code == 200
            assert len(idp.fetches) == 2
            assert_refused(await get(old, "old"), "TOKEN_INVALID")
            assert_refused(await get(new, "made-up"), "TOKEN_INVALID")
            assert len(idp.fetches) == 2

            # The provider goes away: the cached key still checks tokens, and an unknown kid,
            # past the interval, tries once and is refused, not a 5xx.
            idp.stop()
            wait_past(idp.fetches[-1])
            assert_refused(await get(new, "newer"), "TOKEN_INVALID")
            assert (await get(new, "new")).status_code == 200
        assert "cannot be fetched" in proc.logs(tail=None)
    finally:
        proc.stop()


async def test_an_unreachable_key_set_is_401_until_it_answers(database_url: str) -> None:
    key = new_rsa()
    idp = IdentityProvider(port=free_port())  # nothing listens there yet
    proc = ServerProcess(
        database_url,
        env=server_env(
            idp,
            FERRYMAN_JWT_JWKS_REFETCH_INTERVAL=str(REFETCH),
            FERRYMAN_JWT_OWNER_CLAIM="email",  # a configured claim, while at it
        ),
    ).start()
    try:
        token = sign(key, "k", claims("ignored", email="ann@example.com"))
        async with client(proc.url, token) as http:
            response = await http.get("/api/agent")
            started = time.monotonic()  # after the server's failed fetch
            assert_refused(response, "TOKEN_KEYS_UNAVAILABLE")
            assert "cannot be fetched" in response.json()["detail"]
            assert_refused(await http.get("/api/agent/owner-events"), "TOKEN_KEYS_UNAVAILABLE")

            # It answers, but not a key set: still unavailable, after the interval.
            idp.body = b"<html>not json</html>"
            idp.start()
            wait_past(started)
            assert_refused(await http.get("/api/agent"), "TOKEN_KEYS_UNAVAILABLE")
            assert len(idp.fetches) == 1

            idp.publish((key, "k"))
            wait_past(idp.fetches[-1])
            session = await create_session(http, "at last")
            assert session["ownerId"] == "ann@example.com"
            assert len(idp.fetches) == 2
        idp.stop()
    finally:
        proc.stop()


async def test_what_a_key_set_may_hold() -> None:
    other = IdentityProvider().start()
    try:
        rsa_jwk = public_jwk(RSA_KEY, "good")
        other.body = json.dumps(
            {
                "keys": [
                    rsa_jwk,
                    {k: v for k, v in rsa_jwk.items() if k != "kid"},
                    {**rsa_jwk, "kid": "for-encryption", "use": "enc"},
                    {**rsa_jwk, "kid": "private", "d": "AQAB"},
                    "not a key",
                ]
            }
        ).encode()
        assert list(await fetch_key_set(other.url, timeout=5)) == ["good"]
        for body, why in (
            (b"[" * 100_000, "not JSON"),
            (b'{"keys": {}}', "not a JWK set"),
            (b" " * (MAX_JWKS_BYTES + 1), f"over {MAX_JWKS_BYTES} bytes"),
        ):
            other.body = body
            with pytest.raises(KeySetUnavailable, match=why):
                await fetch_key_set(other.url, timeout=5)
    finally:
        other.stop()
    with pytest.raises(KeySetUnavailable, match="ConnectError"):
        await fetch_key_set(other.url, timeout=5)


def test_settings_name_what_jwt_mode_lacks() -> None:
    with pytest.raises(ValueError, match="FERRYMAN_JWT_JWKS_URL and FERRYMAN_JWT_AUDIENCE"):
        Settings(auth="jwt", jwt_issuer=ISSUER)
    with pytest.raises(ValueError, match="HS256 is not accepted"):
        Settings(jwt_algorithms="RS256,HS256")
    with pytest.raises(ValueError, match="none is not accepted"):
        Settings(jwt_algorithms="none")
    with pytest.raises(ValueError, match="http"):
        Settings(jwt_jwks_url="file:///etc/passwd")


# --- anything at all as a token is a 401, never an error -----------------------------------------


@pytest.fixture(scope="module")
def verifier(provider: IdentityProvider) -> TokenVerifier:
    return TokenVerifier(
        Settings(auth="jwt", jwt_jwks_url=provider.url, jwt_issuer=ISSUER, jwt_audience=AUDIENCE)
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
headers = st.fixed_dictionaries(
    {},
    optional={
        "alg": st.sampled_from(["RS256", "ES256", "HS256", "none", "PS256"]) | json_values,
        "kid": st.sampled_from(["rsa-1", "ec-1", "nope"]) | json_values,
        "typ": json_values,
        "crit": json_values,
    },
)
payloads = st.dictionaries(
    st.sampled_from(["iss", "aud", "sub", "exp", "nbf", "iat"]) | st.text(max_size=4), json_values
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    header=headers,
    payload=payloads,
    signature=st.binary(max_size=64),
    junk=st.text(max_size=40),
)
def test_any_token_is_refused_as_unauthorized(
    verifier: TokenVerifier,
    header: dict[str, Any],
    payload: dict[str, Any],
    signature: bytes,
    junk: str,
) -> None:
    for token in (f"{unsigned(header, payload)}.{b64(signature)}", junk):
        try:
            asyncio.run(verifier.owner(token))
        except Unauthorized:
            continue
        raise AssertionError(f"accepted {token!r}")
