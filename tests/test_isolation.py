"""Owners see only their own sessions and events (404, never 403), and authentication."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from httpx_sse import ServerSentEvent

from tests.support import (
    ServerProcess,
    assert_problem,
    client,
    create_owner_key,
    create_session,
    sse,
)


def foreign_requests(http: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    """Every endpoint that names a session, as awaitables (each a fresh request)."""
    return {
        "get": lambda: http.get(f"/api/agent/{sid}"),
        "patch": lambda: http.patch(f"/api/agent/{sid}", json={"title": "stolen"}),
        "delete": lambda: http.delete(f"/api/agent/{sid}"),
        "cancel": lambda: http.post(f"/api/agent/{sid}/cancel"),
        "cancel-wait": lambda: http.post(f"/api/agent/{sid}/cancel", params={"wait": "true"}),
        "messages": lambda: http.post(f"/api/agent/{sid}/messages", json={"text": "hi"}),
        "transcript": lambda: http.get(f"/api/agent/{sid}/transcript"),
        "events": lambda: http.get(f"/api/agent/{sid}/events", params={"follow": "false"}),
        "events-resume": lambda: http.get(
            f"/api/agent/{sid}/events", headers={"Last-Event-ID": "1"}
        ),
    }


async def test_foreign_session_is_404_on_every_endpoint(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    _, key_a = owner_key
    _, key_b = create_owner_key(database_url)
    async with client(server.url, key_a) as a, client(server.url, key_b) as b:
        mine = await create_session(a, "A's secret")
        before = (await a.get(f"/api/agent/{mine['id']}")).json()
        nobody = str(uuid.uuid4())

        for name, call in foreign_requests(b, mine["id"]).items():
            foreign = await call()
            assert foreign.status_code == 404, (name, foreign.status_code, foreign.text)
            missing = await foreign_requests(b, nobody)[name]()
            # Indistinguishable from a session that does not exist.
            assert foreign.json() == missing.json(), name
            assert_problem(foreign, 404, "SESSION_NOT_FOUND")

        # The stream also refuses it when the key comes as ?access_token=.
        async with client(server.url) as anonymous:
            response = await anonymous.get(
                f"/api/agent/{mine['id']}/events",
                params={"follow": "false", "access_token": key_b},
            )
            assert_problem(response, 404, "SESSION_NOT_FOUND")

        # B sees none of A's sessions, and nothing B tried changed A's.
        assert (await b.get("/api/agent")).json()["sessions"] == []
        after = (await a.get(f"/api/agent/{mine['id']}")).json()
        assert after == before
        transcript = (await a.get(f"/api/agent/{mine['id']}/transcript")).json()
        assert [e["type"] for e in transcript["events"]] == ["user_message"]
        assert [s["id"] for s in (await a.get("/api/agent")).json()["sessions"]] == [mine["id"]]


async def test_local_owner_sees_none_of_a_keyed_owners_sessions(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    async with client(server.url, key) as a, client(server.url) as local:
        mine = await create_session(a)
        listed = (await local.get("/api/agent", params={"limit": 200})).json()["sessions"]
        assert mine["id"] not in {s["id"] for s in listed}
        assert all(s["ownerId"] == "local" for s in listed)
        for name, call in foreign_requests(local, mine["id"]).items():
            response = await call()
            assert response.status_code == 404, (name, response.text)

        # And the other way round: a local session is invisible to a keyed owner.
        theirs = await create_session(local, "local's")
        assert theirs["ownerId"] == "local"
        assert_problem(await a.get(f"/api/agent/{theirs['id']}"), 404, "SESSION_NOT_FOUND")
        assert theirs["id"] not in {s["id"] for s in (await a.get("/api/agent")).json()["sessions"]}


async def _until(
    events: Any, predicate: Any, seen: list[ServerSentEvent], timeout: float = 10
) -> None:
    async with asyncio.timeout(timeout):
        async for event in events:
            if event.event in ("caught_up", "resync_required"):
                continue
            seen.append(event)
            if predicate(event):
                return


async def test_owner_stream_carries_only_the_owners_events(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    owner_a, key_a = owner_key
    owner_b, key_b = create_owner_key(database_url)
    async with (
        client(server.url, key_a) as a,
        client(server.url, key_b) as b,
        client(server.url) as local,
        sse(b, "/api/agent/owner-events") as b_events,
        sse(local, "/api/agent/owner-events") as local_events,
        sse(a, "/api/agent/owner-events") as a_events,
    ):
        # Each stream is live once it says caught_up.
        for events in (b_events, local_events, a_events):
            async with asyncio.timeout(10):
                first = await anext(events)
            assert first.event == "caught_up"

        # A is busy while B (and local) listen.
        a_ids = []
        for i in range(3):
            session = await create_session(a, f"a{i}")
            a_ids.append(session["id"])
            await a.patch(f"/api/agent/{session['id']}", json={"title": f"A title {i}"})
            await a.post(f"/api/agent/{session['id']}/cancel")
            await a.post(f"/api/agent/{session['id']}/messages", json={"text": "again"})
        await a.delete(f"/api/agent/{a_ids[0]}")

        # Then B and local each do one thing; their streams must show only that.
        b_session = await create_session(b, "b")
        local_session = await create_session(local, "local")

        b_seen: list[ServerSentEvent] = []
        await _until(b_events, lambda e: e.json()["sessionId"] == b_session["id"], b_seen)
        assert [(e.event, e.json()["ownerId"], e.json()["sessionId"]) for e in b_seen] == [
            ("session_created", owner_b, b_session["id"])
        ]

        local_seen: list[ServerSentEvent] = []
        await _until(
            local_events, lambda e: e.json()["sessionId"] == local_session["id"], local_seen
        )
        assert all(e.json()["ownerId"] == "local" for e in local_seen)
        assert not {e.json()["sessionId"] for e in local_seen} & set(a_ids)

        # A's own stream did carry A's events (so there was something to leak).
        a_seen: list[ServerSentEvent] = []
        await _until(a_events, lambda e: e.event == "session_deleted", a_seen)
        assert {e.json()["ownerId"] for e in a_seen} == {owner_a}
        assert len(a_seen) == 3 * 4 + 2  # created, title, status x2 per session; delete
        assert {e.event for e in a_seen} == {
            "session_created",
            "session_title",
            "session_status",
            "session_deleted",
        }


# --- authentication -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keys_server(database_url: str) -> Iterator[ServerProcess]:
    proc = ServerProcess(database_url, env={"FERRYMAN_AUTH": "keys"}).start()
    yield proc
    proc.stop()


def revoke(database_url: str, key_owner: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE api_keys SET revoked_at = now() WHERE owner_id = %s", (key_owner,))


async def test_keys_mode_requires_a_key(keys_server: ServerProcess) -> None:
    sid = str(uuid.uuid4())
    async with client(keys_server.url) as anonymous:
        for response in (
            await anonymous.get("/api/agent"),
            await anonymous.post("/api/agent", json={"prompt": "x"}),
            await anonymous.get(f"/api/agent/{sid}"),
            await anonymous.post(f"/api/agent/{sid}/cancel"),
            await anonymous.get("/api/agent/owner-events"),
            await anonymous.get(f"/api/agent/{sid}/events"),
        ):
            assert_problem(response, 401, "AUTH_REQUIRED")
            assert response.headers["www-authenticate"] == "Bearer"
        # Operations endpoints stay open for probes.
        assert (await anonymous.get("/healthz")).status_code == 200
        assert (await anonymous.get("/readyz")).status_code == 200


async def test_keys_mode_rejects_bad_keys(keys_server: ServerProcess, database_url: str) -> None:
    owner, key = create_owner_key(database_url)
    async with client(keys_server.url, key) as good:
        assert (await good.get("/api/agent")).status_code == 200
        session = await create_session(good)
        assert session["ownerId"] == owner

    bad_headers = [
        {"Authorization": "Bearer fm_not-a-real-key"},
        {"Authorization": f"Bearer {key}x"},
        {"Authorization": "Basic x"},
        {"Authorization": f"Basic {key}"},
        {"Authorization": "Bearer"},
        {"Authorization": "Token abc"},
        {"Authorization": key},
    ]
    async with client(keys_server.url) as http:
        for headers in bad_headers:
            response = await http.get("/api/agent", headers=headers)
            assert_problem(response, 401, "INVALID_API_KEY")
            response = await http.get("/api/agent/owner-events", headers=headers)
            assert_problem(response, 401, "INVALID_API_KEY")


async def test_revoked_key_is_refused(keys_server: ServerProcess, database_url: str) -> None:
    owner, key = create_owner_key(database_url)
    async with client(keys_server.url, key) as http:
        session = await create_session(http)
        revoke(database_url, owner)
        assert_problem(await http.get("/api/agent"), 401, "INVALID_API_KEY")
        assert_problem(await http.get(f"/api/agent/{session['id']}"), 401, "INVALID_API_KEY")
    async with client(keys_server.url) as http:
        response = await http.get("/api/agent/owner-events", params={"access_token": key})
        assert_problem(response, 401, "INVALID_API_KEY")


async def test_sse_accepts_access_token(keys_server: ServerProcess, database_url: str) -> None:
    owner, key = create_owner_key(database_url)
    async with client(keys_server.url, key) as http:
        session = await create_session(http)
    async with client(keys_server.url) as browser:
        async with sse(
            browser, f"/api/agent/{session['id']}/events", follow="false", access_token=key
        ) as events:
            seen = [e async for e in events]
        assert [e.event for e in seen] == ["user_message", "caught_up"]
        assert seen[0].json()["ownerId"] == owner

        async with sse(browser, "/api/agent/owner-events", access_token=key) as events:
            async with asyncio.timeout(10):
                first = await anext(events)
            assert first.event == "caught_up"

        response = await browser.get("/api/agent/owner-events", params={"access_token": "nope"})
        assert_problem(response, 401, "INVALID_API_KEY")
        # A query token is for EventSource only: the JSON API wants the header.
        response = await browser.get("/api/agent", params={"access_token": key})
        assert_problem(response, 401, "AUTH_REQUIRED")
    # A key in a URL is a secret in a URL: no log line of the server may carry it.
    assert key not in keys_server.logs(tail=None)


async def test_local_mode_still_refuses_bad_keys(server: ServerProcess) -> None:
    async with client(server.url) as http:
        assert (await http.get("/api/agent")).status_code == 200  # no key: owner `local`
        for headers in ({"Authorization": "Bearer fm_bogus"}, {"Authorization": "Basic x"}):
            assert_problem(await http.get("/api/agent", headers=headers), 401, "INVALID_API_KEY")
            response = await http.post("/api/agent", json={"prompt": "x"}, headers=headers)
            assert_problem(response, 401, "INVALID_API_KEY")
        response = await http.get("/api/agent/owner-events", params={"access_token": "fm_bogus"})
        assert_problem(response, 401, "INVALID_API_KEY")
