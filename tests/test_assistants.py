"""Assistants (SPEC section 8): CRUD and versions over HTTP, owner isolation, validation, and a
session created from one pinning its version, through real workers, an edit, a delete and a
SIGKILL of the worker mid-turn.

The API tests run on the module's own database (`api`, `key`); the pinning test starts its
workers against the fake provider, so the definition each turn was asked with is seen."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.fake_provider import FakeProvider, text_reply
from tests.support import (
    TERMINAL,
    ServerProcess,
    StartWorker,
    assert_problem,
    client,
    create_owner_key,
    of_type,
    query,
    ready,
    transcript,
    wait_for_status,
)

ASSISTANT_FIELDS = {
    "id",
    "name",
    "description",
    "model",
    "instructions",
    "modelSettings",
    "compaction",
    "tools",
    "approvalRequired",
    "metadata",
    "version",
    "createdAt",
    "updatedAt",
}
DEFINITION = {
    "name": "Support bot",
    "description": "Answers tickets",
    "model": "openai:fake-model",
    "instructions": "Be brief.",
    "modelSettings": {"temperature": 0.3, "maxTokens": 50},
    "tools": ["get_note", "put_note"],
    "approvalRequired": ["put_note"],
    "metadata": {"team": "support", "tier": 1},
}


async def create_assistant(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await http.post("/api/assistants", json={**DEFINITION, **body})
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


async def test_create_get_list_and_delete(api: ServerProcess, key: str) -> None:
    async with client(api.url, key) as http:
        created = await create_assistant(http)
        assert set(created) == ASSISTANT_FIELDS
        assert {k: created[k] for k in DEFINITION} == DEFINITION
        assert created["version"] == 1
        aid = created["id"]
        assert (await http.get(f"/api/assistants/{aid}")).json() == created
        other = await create_assistant(http, name="Sales bot", metadata={"team": "sales"})
        minimal = await create_assistant(
            http,
            name="Plain",
            description=None,
            instructions=None,
            modelSettings=None,
            tools=None,
            approvalRequired=None,
            metadata=None,
        )
        assert minimal["tools"] is None and minimal["approvalRequired"] == []
        assert minimal["modelSettings"] == {} and minimal["metadata"] == {}

        async def names(**params: Any) -> list[str]:
            response = await http.get("/api/assistants", params=params)
            assert response.status_code == 200, response.text
            return [a["name"] for a in response.json()["assistants"]]

        assert await names() == ["Plain", "Sales bot", "Support bot"]  # newest first
        assert await names(name="BOT") == ["Sales bot", "Support bot"]  # substring, any case
        assert await names(name="%") == []  # taken literally
        assert await names(metadata=json.dumps({"team": "support"})) == ["Support bot"]
        assert await names(metadata=json.dumps({"team": "support", "tier": 2})) == []
        first = (await http.get("/api/assistants", params={"limit": 2})).json()
        assert [a["name"] for a in first["assistants"]] == ["Plain", "Sales bot"]
        rest = await names(limit=2, pageToken=first["nextPageToken"])
        assert rest == ["Support bot"]

        assert (await http.delete(f"/api/assistants/{other['id']}")).status_code == 204
        assert_problem(await http.get(f"/api/assistants/{other['id']}"), 404, "ASSISTANT_NOT_FOUND")
        assert_problem(
            await http.delete(f"/api/assistants/{other['id']}"), 404, "ASSISTANT_NOT_FOUND"
        )
        assert await names() == ["Plain", "Support bot"]


async def test_each_edit_is_a_new_version(api: ServerProcess, key: str) -> None:
    async with client(api.url, key) as http:
        aid = (await create_assistant(http))["id"]
        edited = await http.patch(f"/api/assistants/{aid}", json={"instructions": "Be kind."})
        assert edited.status_code == 200, edited.text
        assert edited.json()["version"] == 2 and edited.json()["instructions"] == "Be kind."
        assert edited.json()["name"] == "Support bot"  # the rest is kept
        cleared = await http.patch(f"/api/assistants/{aid}", json={"tools": None, "name": "B"})
        assert cleared.json()["version"] == 3
        assert cleared.json()["tools"] is None and cleared.json()["name"] == "B"
        assert (await http.get(f"/api/assistants/{aid}")).json() == cleared.json()

        page = (await http.get(f"/api/assistants/{aid}/versions", params={"limit": 2})).json()
        assert [v["version"] for v in page["versions"]] == [3, 2]
        assert page["versions"][0] == cleared.json()
        older = await http.get(
            f"/api/assistants/{aid}/versions", params={"pageToken": page["nextPageToken"]}
        )
        assert [v["version"] for v in older.json()["versions"]] == [1]
        assert older.json()["versions"][0]["instructions"] == "Be brief."
        assert older.json()["nextPageToken"] is None
        assert_problem(
            await http.get(f"/api/assistants/{aid}/versions", params={"pageToken": "x"}),
            400,
            "INVALID_PAGE_TOKEN",
        )


async def test_another_owners_assistant_is_not_found(
    api: ServerProcess, key: str, isolated_db: str
) -> None:
    other_key = create_owner_key(isolated_db)[1]
    async with client(api.url, key) as mine, client(api.url, other_key) as theirs:
        aid = (await create_assistant(mine))["id"]
        for response in (
            await theirs.get(f"/api/assistants/{aid}"),
            await theirs.patch(f"/api/assistants/{aid}", json={"name": "x"}),
            await theirs.get(f"/api/assistants/{aid}/versions"),
            await theirs.delete(f"/api/assistants/{aid}"),
            await theirs.post("/api/agent", json={"prompt": "hi", "assistantId": aid}),
            await theirs.get("/api/assistants/not-a-uuid"),
            await mine.post("/api/agent", json={"prompt": "hi", "assistantId": "nope"}),
            await mine.post(
                "/api/agent", json={"prompt": "hi", "assistantId": aid, "assistantVersion": 2}
            ),
        ):
            assert_problem(response, 404, "ASSISTANT_NOT_FOUND")
        assert (await theirs.get("/api/assistants")).json()["assistants"] == []
        assert (await mine.get(f"/api/assistants/{aid}")).json()["version"] == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "n" * 201}, "name"),
        ({"description": "d" * 2001}, "description"),
        ({"model": "gpt-4"}, "model"),
        ({"model": None}, "model"),
        ({"tools": ["no_such_tool"]}, "tools"),
        ({"approvalRequired": ["get_nte"]}, "approvalRequired"),
        ({"modelSettings": {"temperature": 5}}, "modelSettings.temperature"),
        ({"metadata": {"blob": "x" * 16_400}}, "metadata"),
        ({"colour": "red"}, "colour"),
    ],
)
async def test_bad_assistants_are_refused(
    api: ServerProcess, key: str, body: dict[str, Any], field: str
) -> None:
    async with client(api.url, key) as http:
        problem = assert_problem(
            await http.post("/api/assistants", json={**DEFINITION, **body}), 422, "VALIDATION_ERROR"
        )
        assert field in [e["field"] for e in problem["errors"]], problem
        aid = (await create_assistant(http))["id"]
        patched = await http.patch(f"/api/assistants/{aid}", json=body)
        problem = assert_problem(patched, 422, "VALIDATION_ERROR")
        assert field in [e["field"] for e in problem["errors"]], problem


async def test_unknown_names_are_named(api: ServerProcess, key: str) -> None:
    async with client(api.url, key) as http:
        body = {**DEFINITION, "tools": ["get_nte"], "approvalRequired": ["get_nte"]}
        problem = assert_problem(
            await http.post("/api/assistants", json=body), 422, "VALIDATION_ERROR"
        )
        assert "'get_nte' (closest: get_note" in problem["detail"]
        aid = (await create_assistant(http, modelSettings={"toolChoice": "get_note"}))["id"]
        # An edit is checked as the version it makes: the tool choice must stay offered.
        problem = assert_problem(
            await http.patch(f"/api/assistants/{aid}", json={"tools": ["put_note"]}),
            422,
            "VALIDATION_ERROR",
        )
        assert [e["field"] for e in problem["errors"]] == ["modelSettings.toolChoice"]
        assert_problem(await http.patch(f"/api/assistants/{aid}", json={}), 422, "VALIDATION_ERROR")
        assert_problem(
            await http.post("/api/agent", json={"prompt": "x", "assistantVersion": 1}),
            422,
            "VALIDATION_ERROR",
        )
        # A session's own tools are checked against the assistant's tool choice too.
        problem = assert_problem(
            await http.post(
                "/api/agent", json={"prompt": "x", "assistantId": aid, "tools": ["put_note"]}
            ),
            422,
            "VALIDATION_ERROR",
        )
        assert [e["field"] for e in problem["errors"]] == ["modelSettings.toolChoice"]


async def test_a_session_takes_the_assistants_definition(api: ServerProcess, key: str) -> None:
    async with client(api.url, key) as http:
        aid = (await create_assistant(http))["id"]
        await http.patch(f"/api/assistants/{aid}", json={"instructions": "Version two."})
        latest = (await http.post("/api/agent", json={"prompt": "hi", "assistantId": aid})).json()
        assert latest["assistant"] == {"id": aid, "version": 2}
        assert latest["instructions"] == "Version two."
        assert latest["model"] == "openai:fake-model"
        assert latest["modelSettings"] == {"temperature": 0.3, "maxTokens": 50}
        assert latest["approvalRequired"] == ["put_note"]
        assert latest["metadata"] == {}  # the assistant's metadata is its own

        pinned = await http.post(
            "/api/agent",
            json={
                "prompt": "hi",
                "assistantId": aid,
                "assistantVersion": 1,
                "model": "scripted",
                "modelSettings": {"temperature": 0.9},
                "approvalRequired": [],
                "metadata": {"ticket": 7},
            },
        )
        assert pinned.status_code == 201, pinned.text
        session = pinned.json()
        assert session["assistant"] == {"id": aid, "version": 1}
        assert session["instructions"] == "Be brief."  # version 1's
        assert session["model"] == "scripted"  # the session's own fields win
        assert session["modelSettings"] == {"temperature": 0.9, "maxTokens": 50}  # key by key
        assert session["approvalRequired"] == []
        assert session["metadata"] == {"ticket": 7}
        plain = (await http.post("/api/agent", json={"prompt": "hi"})).json()
        assert plain["assistant"] is None


async def test_idempotent_create_from_an_assistant(api: ServerProcess, key: str) -> None:
    """The same key and body give the same session even after the assistant was edited or
    deleted; another body under the key is refused."""
    headers = {"Idempotency-Key": str(uuid.uuid4())}
    async with client(api.url, key) as http:
        aid = (await create_assistant(http))["id"]
        body = {"prompt": "hi", "assistantId": aid}
        first = await http.post("/api/agent", json=body, headers=headers)
        assert first.status_code == 201, first.text
        await http.patch(f"/api/assistants/{aid}", json={"instructions": "Changed."})
        again = await http.post("/api/agent", json=body, headers=headers)
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
        await http.delete(f"/api/assistants/{aid}")
        gone = await http.post("/api/agent", json=body, headers=headers)
        assert gone.status_code == 200 and gone.json()["id"] == first.json()["id"]
        other = await http.post("/api/agent", json={**body, "title": "t"}, headers=headers)
        assert_problem(other, 409, "IDEMPOTENCY_KEY_REUSED")
        assert_problem(await http.post("/api/agent", json=body), 404, "ASSISTANT_NOT_FOUND")


# --- pinning, through real workers ----------------------------------------------------------


def worker_env(fake: FakeProvider, **more: str) -> dict[str, str]:
    return {
        "FERRYMAN_OPENAI_BASE_URL": fake.openai_url,
        "FERRYMAN_MODEL_IDLE_TIMEOUT": "30",
        **more,
    }


async def close_leftovers(url: str) -> None:
    """Cancel the sessions the API tests above left queued, so no worker here runs them."""
    await query(
        url,
        "UPDATE sessions SET status = 'cancelled' WHERE status NOT IN"
        " ('succeeded', 'failed', 'cancelled')",
    )


async def requests_seen(fake: FakeProvider, count: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while len(fake.requests) < count:
        assert time.monotonic() < deadline, f"the model was called {len(fake.requests)} times"
        await asyncio.sleep(0.05)


async def test_a_session_keeps_its_version_through_edits_a_crash_and_a_delete(
    api: ServerProcess,
    key: str,
    isolated_db: str,
    start_worker: StartWorker,
    fake: FakeProvider,
) -> None:
    """Edited while its first turn streams, the session's resumed turn (after the worker is
    SIGKILLed) and its next turn still ask with version 1; so does a turn after the assistant
    is deleted. A session created after the edit asks with version 2."""
    await close_leftovers(isolated_db)
    victim = start_worker(worker_env(fake))
    await ready(victim)
    stalled = text_reply("Thinking", " more")
    stalled.stall_after, stalled.stall = 2, 60.0
    fake.answer(stalled, text_reply("Answered."), text_reply("Again."), text_reply("Still."))
    async with client(api.url, key) as http:
        aid = (await create_assistant(http, tools=None, approvalRequired=None))["id"]
        sid = (await http.post("/api/agent", json={"prompt": "one", "assistantId": aid})).json()[
            "id"
        ]
        await requests_seen(fake, 1)
        edited = await http.patch(
            f"/api/assistants/{aid}",
            json={"instructions": "Version two.", "modelSettings": {"temperature": 1.5}},
        )
        assert edited.json()["version"] == 2
        victim.signal(signal.SIGKILL)
        await ready(start_worker(worker_env(fake)))
        done = await wait_for_status(http, sid, TERMINAL, timeout=30)
        assert done["status"] == "succeeded", done
        assert of_type(await transcript(http, sid), "session_resumed")[0]["data"]["reason"] == (
            "crash"
        )
        await http.post(f"/api/agent/{sid}/messages", json={"text": "two"})
        await requests_seen(fake, 3)
        assert (await wait_for_status(http, sid, TERMINAL, timeout=30))["status"] == "succeeded"
        assert (await http.delete(f"/api/assistants/{aid}")).status_code == 204
        await http.post(f"/api/agent/{sid}/messages", json={"text": "three"})
        await requests_seen(fake, 4)
        final = await wait_for_status(http, sid, TERMINAL, timeout=30)
        assert final["status"] == "succeeded" and final["assistant"] == {"id": aid, "version": 1}
    assert len(fake.requests) == 4
    for seen in fake.requests:
        assert seen.body["messages"][0] == {"role": "system", "content": "Be brief."}
        assert seen.body["temperature"] == 0.3 and seen.body["max_tokens"] == 50


async def test_a_new_session_takes_the_latest_version(
    api: ServerProcess,
    key: str,
    isolated_db: str,
    start_worker: StartWorker,
    fake: FakeProvider,
) -> None:
    await close_leftovers(isolated_db)
    await ready(start_worker(worker_env(fake)))
    fake.answer(text_reply("Hello."))
    async with client(api.url, key) as http:
        aid = (await create_assistant(http, tools=None, approvalRequired=None))["id"]
        await http.patch(f"/api/assistants/{aid}", json={"instructions": "Version two."})
        created = await http.post("/api/agent", json={"prompt": "hi", "assistantId": aid})
        session = await wait_for_status(http, created.json()["id"], TERMINAL, timeout=30)
    assert session["status"] == "succeeded" and session["assistant"]["version"] == 2
    assert fake.requests[0].body["messages"][0] == {"role": "system", "content": "Version two."}


async def test_limits_are_enforced(api: ServerProcess, isolated_db: str) -> None:
    owner, key = create_owner_key(isolated_db)
    async with client(api.url, key) as http:
        aid = (await create_assistant(http))["id"]
        # Version MAX_ASSISTANT_VERSIONS (1000) is the last an assistant may have.
        await query(
            isolated_db,
            "INSERT INTO assistant_versions (assistant_id, version, name, model)"
            " VALUES (%s, 1000, 'last', 'scripted')",
            (aid,),
        )
        await query(isolated_db, "UPDATE assistants SET version = 1000 WHERE id = %s", (aid,))
        assert (await http.get(f"/api/assistants/{aid}")).json()["name"] == "last"
        problem = assert_problem(
            await http.patch(f"/api/assistants/{aid}", json={"name": "more"}),
            409,
            "ASSISTANT_LIMIT_REACHED",
        )
        assert "MAX_ASSISTANT_VERSIONS" in problem["detail"]
        # MAX_ASSISTANTS_PER_OWNER (1000) live ones; a deleted one leaves room.
        await query(
            isolated_db,
            "INSERT INTO assistants (id, owner_id, version)"
            " SELECT gen_random_uuid(), %s, 1 FROM generate_series(1, 999)",
            (owner,),
        )
        problem = assert_problem(
            await http.post("/api/assistants", json=DEFINITION), 409, "ASSISTANT_LIMIT_REACHED"
        )
        assert "MAX_ASSISTANTS_PER_OWNER" in problem["detail"]
        assert (await http.delete(f"/api/assistants/{aid}")).status_code == 204
        assert (await http.post("/api/assistants", json=DEFINITION)).status_code == 201


@pytest.mark.parametrize(
    "params",
    [
        {"metadata": "[1]"},
        {"metadata": "{"},
        {"metadata": '{"a": "\\u0000"}'},
        {"name": ""},
        {"limit": 0},
        {"limit": 201},
    ],
)
async def test_bad_list_filters_are_refused(
    api: ServerProcess, key: str, params: dict[str, Any]
) -> None:
    async with client(api.url, key) as http:
        assert_problem(await http.get("/api/assistants", params=params), 422, "VALIDATION_ERROR")
        assert_problem(
            await http.get("/api/assistants", params={"pageToken": "nonsense"}),
            400,
            "INVALID_PAGE_TOKEN",
        )
