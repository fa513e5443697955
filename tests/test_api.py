"""The REST API of SPEC section 3, against a real `ferryman serve` and a real PostgreSQL.

No worker runs in these servers, so sessions stay `queued` unless a test moves them with SQL.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any

import httpx

from tests.support import (
    ServerProcess,
    assert_problem,
    client,
    create_owner_key,
    create_session,
    owner_backlog,
    query,
    sse,
)

SESSION_FIELDS = {
    "id",
    "ownerId",
    "title",
    "status",
    "attempt",
    "resumes",
    "model",
    "prompt",
    "activeStage",
    "error",
    "cancelRequested",
    "lease",
    "lastSeq",
    "createdAt",
    "updatedAt",
    "metadata",
    "instructions",
    "modelSettings",
    "approvalRequired",
    "assistant",
    "usage",
}
ENVELOPE_FIELDS = {"id", "type", "sessionId", "ownerId", "ts", "phase", "seq", "attempt", "data"}
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


async def set_status(database_url: str, session_id: str, status: str) -> None:
    """Move a session to `status` behind the API's back (no worker runs here)."""
    await query(database_url, "UPDATE sessions SET status = %s WHERE id = %s", (status, session_id))


async def make_running(database_url: str, session_id: str) -> None:
    """What a worker's claim would do: the session is `running` under a live lease."""
    await query(
        database_url,
        "UPDATE sessions SET status = 'running', lease_worker_id = 'w-test', lease_pid = 4242,"
        " attempt = 1, lease_expires_at = now() + interval '1 min' WHERE id = %s",
        (session_id,),
    )


async def cursor_of(http: httpx.AsyncClient) -> str:
    response = await http.get("/api/agent", params={"limit": 1})
    assert response.status_code == 200
    cursor: str = response.json()["cursor"]
    return cursor


async def walk_pages(http: httpx.AsyncClient, **params: Any) -> tuple[list[str], int]:
    """List sessions from the first page to the last (`nextPageToken` null); their ids, and how
    many pages that took."""
    seen: list[str] = []
    pages = 0
    token: str | None = None
    while True:
        paging = {"pageToken": token} if token else {}
        page = (await http.get("/api/agent", params={**params, **paging})).json()
        pages += 1
        seen += [s["id"] for s in page["sessions"]]
        token = page["nextPageToken"]
        if token is None:
            return seen, pages
        assert isinstance(token, str) and token


async def cancel_accepted(http: httpx.AsyncClient, session_id: str, status: str) -> dict[str, Any]:
    """Cancel a session: 202, the request recorded with the session in `status`, as a read of
    the session confirms; that read."""
    response = await http.post(f"/api/agent/{session_id}/cancel")
    assert response.status_code == 202
    assert response.json() == {"id": session_id, "cancelRequested": True, "status": status}
    got: dict[str, Any] = (await http.get(f"/api/agent/{session_id}")).json()
    assert got["status"] == status
    assert got["cancelRequested"] is True
    return got


# --- create ---------------------------------------------------------------------------------


async def test_create_returns_session(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    owner, key = owner_key
    async with client(server.url, key) as http:
        response = await http.post("/api/agent", json={"prompt": "What is 2+2?\nThanks."})
        assert response.status_code == 201
        assert response.headers["content-type"].startswith("application/json")
        session = response.json()
        assert set(session) == SESSION_FIELDS
        assert response.headers["location"] == f"/api/agent/{session['id']}"
        assert uuid.UUID(session["id"])
        assert session["ownerId"] == owner
        assert session["title"] == "What is 2+2?"  # the prompt's first line
        assert session["status"] == "queued"
        assert session["attempt"] == 0
        assert session["resumes"] == 0
        assert session["model"] == "scripted"
        assert session["prompt"] == "What is 2+2?\nThanks."
        assert session["activeStage"] is None
        assert session["error"] is None
        assert session["cancelRequested"] is False
        assert session["lease"] is None
        assert session["lastSeq"] == 1
        assert session["metadata"] == {}
        assert RFC3339_UTC.match(session["createdAt"])
        assert RFC3339_UTC.match(session["updatedAt"])

        got = await http.get(response.headers["location"])
        assert got.status_code == 200
        assert got.json() == session

        # The prompt is the opening user_message, seq 1.
        transcript = (await http.get(f"/api/agent/{session['id']}/transcript")).json()
        assert [(e["seq"], e["type"]) for e in transcript["events"]] == [(1, "user_message")]
        assert transcript["events"][0]["data"]["text"] == session["prompt"]


async def test_create_with_every_field(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    _, key = owner_key
    body = {
        "prompt": "run the script",
        "title": "My title",
        "model": "scripted",
        "script": [
            {"text": "thinking", "toolCalls": [{"name": "sleep", "arguments": {"seconds": 0}}]},
            {"text": "done", "stopReason": "stop", "delayMs": 10, "chunks": 2},
        ],
        "tools": ["sleep", "put_note"],
        "metadata": {"ticket": 42, "tags": ["a", "b"], "nested": {"ok": True, "none": None}},
    }
    async with client(server.url, key) as http:
        session = await create_session(http, **body)
        assert session["title"] == "My title"
        assert session["metadata"] == body["metadata"]
        assert session["model"] == "scripted"
        openai = await create_session(http, "x", model="openai:gpt-4o-mini")
        assert openai["model"] == "openai:gpt-4o-mini"


async def test_default_titles(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        long = await create_session(http, "x" * 500)
        assert len(long["title"]) <= 80
        assert long["title"].startswith("xxxx")
        blank = await create_session(http, "   ")
        assert blank["title"]  # never empty
        leading = await create_session(http, "\n\n  first real line\nsecond")
        assert leading["title"] == "first real line"


async def test_prompt_at_the_limit(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        session = await create_session(http, "é" * 100_000)
        assert len(session["prompt"]) == 100_000


# --- idempotency ----------------------------------------------------------------------------


async def test_idempotency_key_replay_and_reuse(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    owner, key = owner_key
    idem = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    body = {"prompt": "once", "metadata": {"a": 1}}
    async with client(server.url, key) as http:
        first = await http.post("/api/agent", json=body, headers=idem)
        assert first.status_code == 201
        again = await http.post("/api/agent", json=body, headers=idem)
        assert again.status_code == 200
        assert again.json()["id"] == first.json()["id"]
        assert again.headers["location"] == first.headers["location"]

        other = await http.post("/api/agent", json={"prompt": "other"}, headers=idem)
        problem = assert_problem(other, 409, "IDEMPOTENCY_KEY_REUSED")
        assert problem["title"] == "Conflict"

        # A different key makes a different session.
        fresh = await http.post("/api/agent", json=body, headers={"Idempotency-Key": "another"})
        assert fresh.status_code == 201
        assert fresh.json()["id"] != first.json()["id"]

        listed = (await http.get("/api/agent")).json()["sessions"]
        assert len(listed) == 2

        # The session of a key is deleted: a replay names it gone, and makes no new one.
        assert (await http.delete(f"/api/agent/{first.json()['id']}")).status_code == 204
        gone = await http.post("/api/agent", json=body, headers=idem)
        assert_problem(gone, 404, "SESSION_NOT_FOUND")
    rows = await query(
        database_url, "SELECT count(*) AS n FROM sessions WHERE owner_id = %s", (owner,)
    )
    assert rows[0]["n"] == 2


async def test_idempotency_keys_are_per_owner(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    _, key_a = owner_key
    _, key_b = create_owner_key(database_url)
    idem = {"Idempotency-Key": "shared-key"}
    async with client(server.url, key_a) as a, client(server.url, key_b) as b:
        ra = await a.post("/api/agent", json={"prompt": "p"}, headers=idem)
        rb = await b.post("/api/agent", json={"prompt": "p"}, headers=idem)
        assert ra.status_code == rb.status_code == 201
        assert ra.json()["id"] != rb.json()["id"]


async def test_concurrent_creates_with_one_key_make_one_session(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    idem = {"Idempotency-Key": f"race-{uuid.uuid4()}"}
    body = {"prompt": "race", "title": "raced"}
    async with client(server.url, key) as http:
        responses = await asyncio.gather(
            *(http.post("/api/agent", json=body, headers=idem) for _ in range(10))
        )
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [200] * 9 + [201], [r.text for r in responses]
        assert len({r.json()["id"] for r in responses}) == 1
        listed = (await http.get("/api/agent")).json()
        assert [s["id"] for s in listed["sessions"]] == [responses[0].json()["id"]]
        # Exactly one session_created on the owner feed.
        created = [e for e in await owner_backlog(http, "0") if e.event == "session_created"]
        assert len(created) == 1


# --- list -----------------------------------------------------------------------------------


async def test_list_newest_first_and_status_filter(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        empty = await http.get("/api/agent")
        assert empty.status_code == 200
        assert empty.json() == {"sessions": [], "cursor": "0", "nextPageToken": None}

        made = [await create_session(http, f"s{i}") for i in range(5)]
        for session in made[:2]:
            assert (await http.post(f"/api/agent/{session['id']}/cancel")).status_code == 202

        listed = (await http.get("/api/agent")).json()
        assert [s["id"] for s in listed["sessions"]] == [s["id"] for s in reversed(made)]
        # Summaries: the session and `truncated` (none cut: these prompts are short).
        assert all(set(s) == {*SESSION_FIELDS, "truncated"} for s in listed["sessions"])
        assert all(s["truncated"] == [] for s in listed["sessions"])
        assert listed["nextPageToken"] is None

        def ids(response: httpx.Response) -> set[str]:
            assert response.status_code == 200, response.text
            return {s["id"] for s in response.json()["sessions"]}

        cancelled = {s["id"] for s in made[:2]}
        queued = {s["id"] for s in made[2:]}
        assert ids(await http.get("/api/agent", params={"status": "cancelled"})) == cancelled
        assert ids(await http.get("/api/agent", params={"status": "queued"})) == queued
        both = await http.get("/api/agent", params=[("status", "queued"), ("status", "cancelled")])
        assert ids(both) == cancelled | queued
        assert ids(await http.get("/api/agent", params={"status": "running"})) == set()
        for limit in (1, 200):
            response = await http.get("/api/agent", params={"limit": limit})
            assert len(response.json()["sessions"]) == min(limit, 5)


async def test_list_paging_walks_every_session_once(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        made = [(await create_session(http, f"page {i}"))["id"] for i in range(7)]
        seen, pages = await walk_pages(http, limit=3)
        assert pages == 3
        assert seen == list(reversed(made))

        # Paging with a filter: only cancelled ones, two per page.
        for sid in made[::2]:
            await http.post(f"/api/agent/{sid}/cancel")
        seen, _ = await walk_pages(http, limit=2, status="cancelled")
        assert seen == list(reversed(made[::2]))


async def test_list_searches_titles(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    """`?q=` keeps the sessions whose title contains it, case-insensitively and literally (a
    `%` or `_` is no wildcard), with paging and the status filter."""
    _, key = owner_key
    async with client(server.url, key) as http:
        titles = ["Deploy Friday", "deploy monday", "Lunch", "50% off", "snake_case", "snakeXcase"]
        made = {t: (await create_session(http, "x", title=t))["id"] for t in titles}
        await http.post(f"/api/agent/{made['deploy monday']}/cancel")

        async def found(**params: Any) -> list[str]:
            response = await http.get("/api/agent", params=params)
            assert response.status_code == 200, response.text
            return [s["title"] for s in response.json()["sessions"]]

        assert await found(q="DEPLOY") == ["deploy monday", "Deploy Friday"]
        assert await found(q="deploy", status="cancelled") == ["deploy monday"]
        assert await found(q="%") == ["50% off"]
        assert await found(q="e_c") == ["snake_case"]
        assert await found(q="nothing like it") == []
        page = (await http.get("/api/agent", params={"q": "deploy", "limit": 1})).json()
        assert [s["title"] for s in page["sessions"]] == ["deploy monday"]
        rest = await found(q="deploy", pageToken=page["nextPageToken"])
        assert rest == ["Deploy Friday"]
        for bad in ("", "x" * 201, "nul\x00"):
            response = await http.get("/api/agent", params={"q": bad})
            assert_problem(response, 422, "VALIDATION_ERROR")


async def test_list_cursor_is_the_owner_feed_head(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    owner, key = owner_key
    async with client(server.url, key) as http:
        first = await create_session(http)
        await http.patch(f"/api/agent/{first['id']}", json={"title": "renamed"})
        await http.post(f"/api/agent/{first['id']}/cancel")
        listed = (await http.get("/api/agent")).json()
        assert isinstance(listed["cursor"], str) and listed["cursor"].isdigit()
        rows = await query(
            database_url,
            "SELECT max(id) AS last, count(*) AS n FROM owner_events WHERE owner_id = %s",
            (owner,),
        )
        assert int(listed["cursor"]) == rows[0]["last"] == rows[0]["n"]  # gap-free from 1

        # Streaming from the snapshot's cursor gives exactly what happened after it.
        second = await create_session(http)
        after = await owner_backlog(http, listed["cursor"])
        assert [(e.event, e.id) for e in after] == [
            ("session_created", str(int(listed["cursor"]) + 1))
        ]
        assert after[0].json()["data"]["session"]["id"] == second["id"]


# --- get, rename ----------------------------------------------------------------------------


async def test_get_unknown_session_is_404(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        response = await http.get(f"/api/agent/{uuid.uuid4()}")
        assert_problem(response, 404, "SESSION_NOT_FOUND")


async def test_rename(server: ServerProcess, owner_key: tuple[str, str], database_url: str) -> None:
    owner, key = owner_key
    async with client(server.url, key) as http:
        session = await create_session(http, "original prompt")
        cursor = await cursor_of(http)
        response = await http.patch(f"/api/agent/{session['id']}", json={"title": "Renamed ✓"})
        assert response.status_code == 200
        renamed = response.json()
        assert set(renamed) == SESSION_FIELDS
        assert renamed["title"] == "Renamed ✓"
        assert renamed["prompt"] == "original prompt"
        assert renamed["updatedAt"] >= session["updatedAt"]
        assert (await http.get(f"/api/agent/{session['id']}")).json()["title"] == "Renamed ✓"

        events = await owner_backlog(http, cursor)
        assert [e.event for e in events] == ["session_title"]
        envelope = events[0].json()
        assert envelope["sessionId"] == session["id"]
        assert envelope["ownerId"] == owner
        assert envelope["data"] == {"title": "Renamed ✓"}

        # A title at the limit is fine.
        response = await http.patch(f"/api/agent/{session['id']}", json={"title": "t" * 200})
        assert response.status_code == 200
    rows = await query(
        database_url,
        "SELECT type, data FROM owner_events WHERE owner_id = %s AND type = 'session_title'"
        " ORDER BY id",
        (owner,),
    )
    assert [r["data"]["title"] for r in rows] == ["Renamed ✓", "t" * 200]


# --- delete ---------------------------------------------------------------------------------


async def test_delete(server: ServerProcess, owner_key: tuple[str, str], database_url: str) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        keep = await create_session(http, "keep")
        doomed = await create_session(http, "doomed")
        cursor = await cursor_of(http)
        response = await http.delete(f"/api/agent/{doomed['id']}")
        assert response.status_code == 204
        assert response.content == b""

        assert_problem(await http.get(f"/api/agent/{doomed['id']}"), 404, "SESSION_NOT_FOUND")
        listed = (await http.get("/api/agent")).json()["sessions"]
        assert [s["id"] for s in listed] == [keep["id"]]
        for call in (
            http.delete(f"/api/agent/{doomed['id']}"),
            http.post(f"/api/agent/{doomed['id']}/cancel"),
            http.post(f"/api/agent/{doomed['id']}/messages", json={"text": "hi"}),
            http.patch(f"/api/agent/{doomed['id']}", json={"title": "x"}),
            http.get(f"/api/agent/{doomed['id']}/transcript"),
            http.get(f"/api/agent/{doomed['id']}/events", params={"follow": "false"}),
        ):
            assert_problem(await call, 404, "SESSION_NOT_FOUND")

        # It was queued, so it was cancelled first; then deleted.
        events = await owner_backlog(http, cursor)
        assert [e.event for e in events] == ["session_status", "session_deleted"]
        assert events[0].json()["data"]["status"] == "cancelled"
        assert all(e.json()["sessionId"] == doomed["id"] for e in events)

    rows = await query(
        database_url,
        "SELECT status, deleted_at, cancel_requested_at FROM sessions WHERE id = %s",
        (doomed["id"],),
    )
    assert rows[0]["status"] == "cancelled"
    assert rows[0]["deleted_at"] is not None  # a soft delete: the row stays
    ends = await query(
        database_url,
        "SELECT data FROM session_events WHERE session_id = %s AND type = 'session_end'",
        (doomed["id"],),
    )
    assert [e["data"]["status"] for e in ends] == ["cancelled"]


async def test_delete_terminal_session_does_not_cancel_again(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        session = await create_session(http)
        await http.post(f"/api/agent/{session['id']}/cancel")
        cursor = await cursor_of(http)
        assert (await http.delete(f"/api/agent/{session['id']}")).status_code == 204
        assert [e.event for e in await owner_backlog(http, cursor)] == ["session_deleted"]


# --- cancel ---------------------------------------------------------------------------------


async def test_cancel_queued_settles_at_once(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        session = await create_session(http)
        cursor = await cursor_of(http)
        got = await cancel_accepted(http, session["id"], "cancelled")
        assert got["lastSeq"] == 2

        transcript = (await http.get(f"/api/agent/{session['id']}/transcript")).json()
        assert [e["type"] for e in transcript["events"]] == ["user_message", "session_end"]
        assert transcript["events"][-1]["data"]["status"] == "cancelled"
        assert transcript["lastSeq"] == 2

        events = await owner_backlog(http, cursor)
        assert [e.event for e in events] == ["session_status"]
        assert events[0].json()["data"]["status"] == "cancelled"

        again = await http.post(f"/api/agent/{session['id']}/cancel")
        problem = assert_problem(again, 409, "SESSION_ALREADY_TERMINAL")
        assert problem["sessionStatus"] == "cancelled"
        assert problem["title"] == "Conflict"


async def test_cancel_terminal_sessions_conflict(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        for status in ("succeeded", "failed"):
            session = await create_session(http)
            await set_status(database_url, session["id"], status)
            response = await http.post(f"/api/agent/{session['id']}/cancel")
            assert assert_problem(response, 409, "SESSION_ALREADY_TERMINAL")["sessionStatus"] == (
                status
            )
            waited = await http.post(f"/api/agent/{session['id']}/cancel", params={"wait": "true"})
            assert_problem(waited, 409, "SESSION_ALREADY_TERMINAL")


async def test_cancel_wait_on_queued_returns_the_session(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        session = await create_session(http)
        response = await http.post(f"/api/agent/{session['id']}/cancel", params={"wait": "true"})
        assert response.status_code == 200
        body = response.json()
        assert set(body) == SESSION_FIELDS
        assert body["id"] == session["id"]
        assert body["status"] == "cancelled"
        assert body["cancelRequested"] is True


async def test_cancel_waiting_settles_at_once(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        session = await create_session(http)
        await set_status(database_url, session["id"], "waiting")
        await cancel_accepted(http, session["id"], "cancelled")


async def test_cancel_running_records_the_request_once(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        session = await create_session(http)
        await make_running(database_url, session["id"])
        cursor = await cursor_of(http)

        got = await cancel_accepted(http, session["id"], "running")
        assert got["attempt"] == 1
        assert got["lease"]["workerId"] == "w-test"
        assert got["lease"]["pid"] == 4242
        assert RFC3339_UTC.match(got["lease"]["expiresAt"])
        assert got["lastSeq"] == 1  # the holder writes session_end, not the API

        events = await owner_backlog(http, cursor)
        assert [e.event for e in events] == ["session_cancel_requested"]
        assert RFC3339_UTC.match(events[0].json()["data"]["requestedAt"])

        # Idempotent: the same answer, no second event.
        again = await http.post(f"/api/agent/{session['id']}/cancel")
        assert again.status_code == 202
        assert again.json() == {"id": session["id"], "cancelRequested": True, "status": "running"}
        assert [e.event for e in await owner_backlog(http, cursor)] == ["session_cancel_requested"]


# --- messages -------------------------------------------------------------------------------


async def test_message_requeues_a_terminal_session(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        session = await create_session(http)
        await http.post(f"/api/agent/{session['id']}/cancel")
        cursor = await cursor_of(http)

        response = await http.post(f"/api/agent/{session['id']}/messages", json={"text": "go on"})
        assert response.status_code == 202
        body = response.json()
        assert body["id"] == session["id"]
        assert body["message"]["text"] == "go on"
        assert body["message"]["delivery"] == "queued"

        got = (await http.get(f"/api/agent/{session['id']}")).json()
        assert got["status"] == "queued"
        assert got["cancelRequested"] is False
        assert body["message"]["seq"] == got["lastSeq"] == 3

        events = await owner_backlog(http, cursor)
        assert [e.event for e in events] == ["session_status"]
        assert events[0].json()["data"]["status"] == "queued"

        transcript = (await http.get(f"/api/agent/{session['id']}/transcript")).json()
        last = transcript["events"][-1]
        assert last["type"] == "user_message"
        assert last["data"] == {"text": "go on", "delivery": "queued"}

        # It can be cancelled again.
        assert (await http.post(f"/api/agent/{session['id']}/cancel")).json()[
            "status"
        ] == "cancelled"


async def test_message_requeues_failed_and_waiting(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        for status in ("failed", "succeeded", "waiting"):
            session = await create_session(http)
            await set_status(database_url, session["id"], status)
            response = await http.post(
                f"/api/agent/{session['id']}/messages", json={"text": "more"}
            )
            assert response.status_code == 202
            assert response.json()["message"]["delivery"] == "queued"
            assert (await http.get(f"/api/agent/{session['id']}")).json()["status"] == "queued"


async def test_message_to_queued_and_running(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        session = await create_session(http)
        cursor = await cursor_of(http)
        queued = await http.post(f"/api/agent/{session['id']}/messages", json={"text": "also"})
        assert queued.status_code == 202
        assert queued.json()["message"] == {"seq": 2, "text": "also", "delivery": "queued"}
        assert await owner_backlog(http, cursor) == []  # no status change

        await make_running(database_url, session["id"])
        steer = await http.post(f"/api/agent/{session['id']}/messages", json={"text": "steer"})
        assert steer.status_code == 202
        assert steer.json()["message"] == {"seq": 3, "text": "steer", "delivery": "steer"}
        got = (await http.get(f"/api/agent/{session['id']}")).json()
        assert got["status"] == "running"
        assert got["lastSeq"] == 3


# --- transcript -----------------------------------------------------------------------------


async def test_transcript_paging_and_envelopes(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    owner, key = owner_key
    async with client(server.url, key) as http:
        session = await create_session(http, "m0")
        for i in range(1, 5):
            response = await http.post(
                f"/api/agent/{session['id']}/messages", json={"text": f"m{i}"}
            )
            assert response.json()["message"]["seq"] == i + 1
        path = f"/api/agent/{session['id']}/transcript"

        full = (await http.get(path)).json()
        assert set(full) == {"events", "lastSeq", "nextAfter"}
        assert full["lastSeq"] == 5 and full["nextAfter"] is None
        assert [e["seq"] for e in full["events"]] == [1, 2, 3, 4, 5]
        for event in full["events"]:
            assert set(event) == ENVELOPE_FIELDS
            assert event["id"] == str(event["seq"])
            assert event["type"] == "user_message"
            assert event["sessionId"] == session["id"]
            assert event["ownerId"] == owner
            assert event["phase"] == "backlog"
            assert event["attempt"] == 0
            assert RFC3339_UTC.match(event["ts"])
        assert [e["data"]["text"] for e in full["events"]] == ["m0", "m1", "m2", "m3", "m4"]

        page = (await http.get(path, params={"after": 2, "limit": 2})).json()
        assert [e["seq"] for e in page["events"]] == [3, 4]
        assert page["lastSeq"] == 5 and page["nextAfter"] == 4
        end = (await http.get(path, params={"after": 5})).json()
        assert end == {"events": [], "lastSeq": 5, "nextAfter": None}
        assert (await http.get(path, params={"after": 10**6})).json()["events"] == []
        assert [e["seq"] for e in (await http.get(path, params={"limit": 1})).json()["events"]] == [
            1
        ]
        big = (await http.get(path, params={"limit": 1000})).json()
        assert len(big["events"]) == 5

        # The transcript and the stream agree.
        async with sse(http, f"/api/agent/{session['id']}/events", follow="false") as events:
            # (httpx-sse repeats the last id on control frames, as EventSource does.)
            streamed = [e.json() async for e in events if e.event != "caught_up"]
        assert [{k: v for k, v in e.items() if k != "phase"} for e in streamed] == [
            {k: v for k, v in e.items() if k != "phase"} for e in full["events"]
        ]


# --- operations -----------------------------------------------------------------------------


async def test_health_ready_metrics(server: ServerProcess) -> None:
    async with client(server.url) as http:
        health = await http.get("/healthz")
        assert health.status_code == 200
        assert health.json()["status"] == "ok"

        ready = await http.get("/readyz")
        assert ready.status_code == 200
        checks = ready.json()["checks"]
        assert checks == {"database": "ok", "migrations": "ok", "listen": "ok"}

        await http.get("/api/agent")
        metrics = await http.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        assert "ferryman_http_requests_total" in metrics.text
        assert 'route="/api/agent"' in metrics.text


async def test_workbench_page(server: ServerProcess) -> None:
    async with client(server.url) as http:
        response = await http.get("/")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        assert "<html" in response.text.lower()
        # Session titles and texts are user input: the page only ever sets textContent.
        assert "innerHTML" not in response.text and "insertAdjacentHTML" not in response.text


async def test_openapi_operation_ids(server: ServerProcess) -> None:
    async with client(server.url) as http:
        spec = (await http.get("/openapi.json")).json()
    ops = {
        op["operationId"]: (method.upper(), path)
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if isinstance(op, dict) and "operationId" in op
    }
    assert ops["createSession"] == ("POST", "/api/agent")
    assert ops["listSessions"] == ("GET", "/api/agent")
    assert ops["getSession"] == ("GET", "/api/agent/{session_id}")
    assert ops["renameSession"] == ("PATCH", "/api/agent/{session_id}")
    assert ops["deleteSession"] == ("DELETE", "/api/agent/{session_id}")
    assert ops["cancelSession"] == ("POST", "/api/agent/{session_id}/cancel")
    assert ops["postMessage"] == ("POST", "/api/agent/{session_id}/messages")
    assert ops["getTranscript"] == ("GET", "/api/agent/{session_id}/transcript")
    assert ops["streamOwnerEvents"] == ("GET", "/api/agent/owner-events")
    assert ops["streamSessionEvents"] == ("GET", "/api/agent/{session_id}/events")


async def test_openapi_declares_every_error_status(server: ServerProcess) -> None:
    """Generated clients see every status an operation can answer, so they can type it: the
    problem statuses of bad input (400, 413), limits (429) and auth, beside 404/422/503."""
    async with client(server.url) as http:
        spec = (await http.get("/openapi.json")).json()
    declared = {
        op["operationId"]: set(op["responses"])
        for item in spec["paths"].values()
        for op in item.values()
        if isinstance(op, dict) and "operationId" in op
    }
    common = {"401", "403", "503"}  # a key, local mode's refusals, the database
    one = common | {"404"}  # an operation on one session
    body = {"400", "413", "415", "422"}  # MALFORMED_JSON, PAYLOAD_TOO_LARGE, a media type, fields
    assert declared["createSession"] >= common | body | {"200", "201", "409"}
    assert declared["renameSession"] >= one | body
    assert declared["postMessage"] >= one | body
    assert declared["decideToolApproval"] >= one | body | {"409"}
    assert declared["listSessions"] >= common | {"400", "422"}  # INVALID_PAGE_TOKEN, limit
    assert declared["cancelSession"] >= one | {"409"}
    assert declared["streamSessionEvents"] >= {"404"}
    for stream in ("streamOwnerEvents", "streamSessionEvents"):
        assert declared[stream] >= common | {"400", "429"}  # INVALID_CURSOR, TOO_MANY_STREAMS
