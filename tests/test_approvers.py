"""Approver keys and separate approval (docs/approvals.md), on a real server in keys mode with a
worker: a key whose policy names an owner in `approverFor` lists and decides that owner's
pending approvals and reads nothing else of it; with FERRYMAN_APPROVAL_SEPARATE the key that
created a session may not decide its calls, another key of the owner may."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import (
    TERMINAL,
    ServerProcess,
    WorkerProcess,
    assert_problem,
    client,
    create_owner_key,
    new_session,
    running,
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
