"""Idle sessions: created without a prompt, no event and no run until the first message, which
becomes seq 1 and the prompt and queues the session for a real worker; cancel and delete."""

from __future__ import annotations

import json
import uuid

import httpx

from tests.support import (
    ServerProcess,
    WorkerProcess,
    assert_problem,
    client,
    owner_backlog,
    transcript,
    wait_for_status,
)


async def create_idle(http: httpx.AsyncClient, **body: object) -> dict[str, object]:
    response = await http.post("/api/agent", json=body)
    assert response.status_code == 201, response.text
    session: dict[str, object] = response.json()
    return session


async def test_a_session_without_a_prompt_is_idle(api: ServerProcess, key: str) -> None:
    async with client(api.url, key) as http:
        before = (await http.get("/api/agent", params={"limit": 1})).json()["cursor"]
        session = await create_idle(http, model="scripted", metadata={"thread": 1})
        assert session["status"] == "idle"
        assert session["lastSeq"] == 0 and session["attempt"] == 0
        assert session["prompt"] == "" and session["title"] == "Untitled"
        assert await transcript(http, str(session["id"])) == []
        listed = (await http.get("/api/agent", params={"status": "idle"})).json()["sessions"]
        assert [s["id"] for s in listed] == [session["id"]]
        # The owner feed announces it as it does any session.
        created = [json.loads(e.data) for e in await owner_backlog(http, before)]
        assert [(e["type"], e["data"]["session"]["status"]) for e in created] == [
            ("session_created", "idle")
        ]
        titled = await create_idle(http, title="A thread")
        assert titled["title"] == "A thread" and titled["status"] == "idle"


async def test_the_first_message_is_the_prompt_and_runs(
    api: ServerProcess, key: str, shared_worker: WorkerProcess
) -> None:
    async with client(api.url, key) as http:
        session = await create_idle(http, script=[{"text": "hello back"}])
        sid = str(session["id"])
        response = await http.post(f"/api/agent/{sid}/messages", json={"text": "hello there"})
        assert response.status_code == 202, response.text
        assert response.json()["message"] == {
            "seq": 1,
            "text": "hello there",
            "delivery": "queued",
        }
        done = await wait_for_status(http, sid, {"succeeded", "failed"}, timeout=30)
        assert done["status"] == "succeeded", done
        assert done["prompt"] == "hello there"
        events = await transcript(http, sid)
        assert events[0]["type"] == "user_message" and events[0]["seq"] == 1
        assert events[0]["data"] == {"text": "hello there", "delivery": "queued"}
        replies = [e["data"]["text"] for e in events if e["type"] == "assistant_message"]
        assert replies == ["hello back"]
        # The second message is a follow-up like any: the prompt stays the first.
        await http.post(f"/api/agent/{sid}/messages", json={"text": "again"})
        assert (await http.get(f"/api/agent/{sid}")).json()["prompt"] == "hello there"


async def test_cancel_and_delete_an_idle_session(api: ServerProcess, key: str) -> None:
    async with client(api.url, key) as http:
        sid = str((await create_idle(http))["id"])
        cancelled = await http.post(f"/api/agent/{sid}/cancel")
        assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelled"
        session = (await http.get(f"/api/agent/{sid}")).json()
        assert session["status"] == "cancelled" and session["prompt"] == ""
        assert [e["type"] for e in await transcript(http, sid)] == ["session_end"]
        assert_problem(await http.post(f"/api/agent/{sid}/cancel"), 409, "SESSION_ALREADY_TERMINAL")

        other = str((await create_idle(http))["id"])
        assert (await http.delete(f"/api/agent/{other}")).status_code == 204
        assert_problem(await http.get(f"/api/agent/{other}"), 404, "SESSION_NOT_FOUND")


async def test_an_idle_create_is_idempotent(api: ServerProcess, key: str) -> None:
    headers = {"Idempotency-Key": str(uuid.uuid4())}
    async with client(api.url, key) as http:
        first = await http.post("/api/agent", json={"title": "t"}, headers=headers)
        again = await http.post("/api/agent", json={"title": "t"}, headers=headers)
        other = await http.post("/api/agent", json={"title": "u"}, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert_problem(other, 409, "IDEMPOTENCY_KEY_REUSED")
