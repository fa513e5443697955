"""Approver keys and separate approval (docs/approvals.md), on a real server in keys mode with a
worker: a key whose policy names an owner in `approverFor` lists and decides that owner's
pending approvals and reads nothing else of it; with FERRYMAN_APPROVAL_SEPARATE the key that
created a session may not decide its calls, another key of the owner may; and a delegated child,
made under its parent's key."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.store.keys import hash_key
from tests.support import (
    TERMINAL,
    ServerProcess,
    WorkerProcess,
    assert_problem,
    client,
    create_owner_key,
    new_session,
    of_type,
    query,
    running,
    transcript,
    wait_for_status,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

NOTE_CALL = {"name": "put_note", "arguments": {"key": "k", "text": "v"}}
SCRIPT = [{"toolCalls": [NOTE_CALL]}, {"text": "done"}]


@pytest.fixture(scope="module")
def separate(isolated_db: str, shared_worker: WorkerProcess) -> Iterator[ServerProcess]:
    env = {"FERRYMAN_AUTH": "keys", "FERRYMAN_APPROVAL_SEPARATE": "true"}
    with running(ServerProcess(isolated_db, env=env)) as proc:
        yield proc


async def waiting_call(http: httpx.AsyncClient) -> tuple[str, str]:
    """A new session of `http`'s key waiting for approval of a put_note call: (its id, the
    call's id)."""
    sid = await new_session(http, script=SCRIPT, tools=["put_note"], approvalRequired=["put_note"])
    await wait_for_status(http, sid, {"waiting"})
    pending = (await http.get("/api/approvals")).json()["approvals"]
    mine = [p for p in pending if p["sessionId"] == sid]
    assert len(mine) == 1, pending
    return sid, mine[0]["toolCallId"]


def decide(http: httpx.AsyncClient, sid: str, call_id: str, approved: bool) -> Any:
    path = f"/api/agent/{sid}/tool-calls/{call_id}/approval"
    return http.post(path, json={"approved": approved})


async def test_an_approver_decides_for_the_owners_it_names_and_reads_nothing_else(
    separate: ServerProcess, isolated_db: str
) -> None:
    owner, key = create_owner_key(isolated_db)
    _, approver_key = create_owner_key(isolated_db, policy={"approverFor": [owner]})
    stranger, _ = create_owner_key(isolated_db)
    async with client(separate.url, key) as http, client(separate.url, approver_key) as approver:
        sid, call_id = await waiting_call(http)
        listed = await approver.get("/api/approvals", params={"owner": owner})
        assert listed.status_code == 200, listed.text
        [pending] = listed.json()["approvals"]
        assert pending["sessionId"] == sid and pending["ownerId"] == owner
        assert pending["name"] == "put_note" and pending["arguments"] == NOTE_CALL["arguments"]
        # Its own (none), and no other owner's: 404 as for an owner that does not exist.
        assert (await approver.get("/api/approvals")).json()["approvals"] == []
        other = await approver.get("/api/approvals", params={"owner": stranger})
        assert_problem(other, 404, "NOT_FOUND")
        # Nothing else of the owner.
        for path in (f"/api/agent/{sid}", f"/api/agent/{sid}/transcript"):
            assert_problem(await approver.get(path), 404, "SESSION_NOT_FOUND")
        assert (await approver.get("/api/agent")).json()["sessions"] == []
        # The decision.
        decided = await decide(approver, sid, call_id, True)
        assert decided.status_code == 202, decided.text
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
        assert (await approver.get("/api/approvals", params={"owner": owner})).json() == {
            "approvals": []
        }


async def test_a_key_that_is_no_approver_cannot_decide_another_owners_calls(
    separate: ServerProcess, isolated_db: str
) -> None:
    owner, key = create_owner_key(isolated_db)
    _, stranger_key = create_owner_key(isolated_db)
    _, other_key = create_owner_key(isolated_db, owner)
    async with client(separate.url, key) as http, client(separate.url, stranger_key) as stranger:
        sid, call_id = await waiting_call(http)
        assert_problem(await decide(stranger, sid, call_id, True), 404, "SESSION_NOT_FOUND")
        assert (await http.get(f"/api/agent/{sid}")).json()["status"] == "waiting"
        async with client(separate.url, other_key) as other:
            assert (await decide(other, sid, call_id, False)).status_code == 202
        await wait_for_status(http, sid, TERMINAL)


async def test_the_key_that_made_a_session_may_not_decide_its_calls(
    separate: ServerProcess, isolated_db: str
) -> None:
    owner, key = create_owner_key(isolated_db)
    _, second = create_owner_key(isolated_db, owner)
    async with client(separate.url, key) as http, client(separate.url, second) as other:
        sid, call_id = await waiting_call(http)
        refused = await decide(http, sid, call_id, True)
        assert_problem(refused, 403, "APPROVAL_SEPARATE")
        # The Agent Protocol's resume is a decision too.
        resume = {"assistant_id": "ferryman", "command": {"resume": {"approved": True}}}
        by_protocol = await http.post(f"/agent-protocol/threads/{sid}/runs", json=resume)
        assert_problem(by_protocol, 403, "APPROVAL_SEPARATE")
        assert (await http.get(f"/api/agent/{sid}")).json()["status"] == "waiting"
        # Another key of the owner decides.
        decided = await decide(other, sid, call_id, True)
        assert decided.status_code == 202, decided.text
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"


async def test_a_delegated_child_is_made_under_its_parents_key(
    separate: ServerProcess, isolated_db: str
) -> None:
    """A delegate whose tools the parent's key may not use is answered as a failed call, and no
    child is made; the delegate the key may use runs."""
    owner, wide_key = create_owner_key(isolated_db)
    _, limited_key = create_owner_key(isolated_db, owner, {"tools": ["put_note"]})
    async with client(separate.url, wide_key) as wide, client(separate.url, limited_key) as http:
        made = await wide.post(
            "/api/assistants",
            json={"name": "Sleeper", "model": "scripted", "tools": ["sleep"], "script": []},
        )
        assert made.status_code == 201, made.text
        noter = await http.post(
            "/api/assistants",
            json={
                "name": "Noter",
                "model": "scripted",
                "tools": ["put_note"],
                "script": [{"text": "noted"}],
            },
        )
        assert noter.status_code == 201, noter.text
        calls = [
            {"name": "agent__sleeper", "arguments": {"task": "nap"}},
            {"name": "agent__noter", "arguments": {"task": "note"}},
        ]
        sid = await new_session(
            http,
            tools=["put_note"],
            delegates=[made.json()["id"], noter.json()["id"]],
            script=[{"toolCalls": calls}, {"text": "after"}],
        )
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
        results = {
            e["data"]["name"]: e["data"]
            for e in of_type(await transcript(http, sid), "tool_result")
        }
        assert results["agent__sleeper"]["isError"] is True
        assert "may not delegate" in results["agent__sleeper"]["content"]
        assert "sleep" in results["agent__sleeper"]["content"]
        assert results["agent__noter"]["isError"] is False
        kids = await query(
            isolated_db,
            "SELECT created_by_key_id FROM sessions WHERE parent_session_id = %s",
            (uuid.UUID(sid),),
        )
        key_ids = await query(
            isolated_db, "SELECT id FROM api_keys WHERE key_hash = %s", (hash_key(limited_key),)
        )
        assert [k["created_by_key_id"] for k in kids] == [key_ids[0]["id"]]
