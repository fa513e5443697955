"""Tool approval through the whole runtime (SPEC section 6.2): real `ferryman worker` processes,
the scripted model, and POST /api/agent/{id}/tool-calls/{callId}/approval. Durable: decisions
wait in the log for a worker, and a worker killed mid-way leaves nothing to run twice."""

from __future__ import annotations

import signal
import uuid
from typing import Any

import httpx

from tests.support import (
    TERMINAL,
    ServerProcess,
    StartWorker,
    assert_problem,
    client,
    create_owner_key,
    new_session,
    of_type,
    query,
    ready,
    transcript,
    wait_event,
    wait_for_status,
)

NOTE_CALL = {"name": "put_note", "arguments": {"key": "k", "text": "v"}}


async def approval_request(http: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    """The session's newest pending request, once it is waiting for it."""
    await wait_for_status(http, sid, {"waiting"})
    requests = of_type(await transcript(http, sid), "tool_approval_requested")
    assert requests, "waiting without an approval request"
    return requests[-1]["data"]


async def decide(
    http: httpx.AsyncClient, sid: str, call_id: str, approved: bool, reason: str | None = None
) -> httpx.Response:
    body: dict[str, Any] = {"approved": approved}
    if reason is not None:
        body["reason"] = reason
    return await http.post(f"/api/agent/{sid}/tool-calls/{call_id}/approval", json=body)


async def test_an_approved_call_runs(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    script = [{"text": "Saving.", "toolCalls": [NOTE_CALL]}, {"text": "Saved."}]
    async with client(api.url, key) as http:
        sid = await new_session(http, script=script, approvalRequired=["put_note"])
        request = await approval_request(http, sid)
        assert request["name"] == "put_note" and request["arguments"] == NOTE_CALL["arguments"]
        events = await transcript(http, sid)
        assert [e["type"] for e in events][-2:] == ["tool_approval_requested", "session_end"]
        assert events[-1]["data"]["status"] == "waiting"
        assert of_type(events, "tool_call_start") == []  # nothing ran yet
        answer = await decide(http, sid, request["toolCallId"], True)
        assert answer.status_code == 202, answer.text
        assert answer.json() == {
            "id": sid,
            "toolCallId": request["toolCallId"],
            "approved": True,
            "seq": events[-1]["seq"] + 1,
            "status": "queued",
        }
        done = await wait_for_status(http, sid, TERMINAL)
        events = await transcript(http, sid)
    assert done["status"] == "succeeded"
    decided = of_type(events, "tool_approval_decided")
    assert [d["data"] for d in decided] == [{"toolCallId": request["toolCallId"], "approved": True}]
    (result,) = of_type(events, "tool_result")
    assert result["data"]["isError"] is False and result["data"]["content"] == "saved note 'k'"
    assert of_type(events, "assistant_message")[-1]["data"]["text"] == "Saved."
    notes = await query(
        isolated_db, "SELECT text FROM notes WHERE session_id = %s", (uuid.UUID(sid),)
    )
    assert notes == [{"text": "v"}]
    resumed = of_type(events, "session_resumed")
    assert resumed and resumed[-1]["data"]["reason"] == "follow_up"


async def test_a_denied_call_is_answered_with_the_reason(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    script = [{"toolCalls": [NOTE_CALL]}, {"text": "Understood, I will not."}]
    async with client(api.url, key) as http:
        sid = await new_session(http, script=script, approvalRequired=["put_note"])
        request = await approval_request(http, sid)
        denied = await decide(http, sid, request["toolCallId"], False, "not that key")
        assert denied.status_code == 202 and denied.json()["approved"] is False
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
        events = await transcript(http, sid)
    (result,) = of_type(events, "tool_result")
    assert result["data"] == {
        "toolCallId": request["toolCallId"],
        "name": "put_note",
        "isError": True,
        "content": "denied: not that key",
        "denied": True,
    }
    assert of_type(events, "tool_call_start") == []
    assert of_type(events, "tool_approval_decided")[0]["data"]["reason"] == "not that key"
    assert (
        await query(isolated_db, "SELECT 1 FROM notes WHERE session_id = %s", (uuid.UUID(sid),))
        == []
    )


async def test_decisions_that_do_not_fit_are_conflicts(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    async with client(api.url, key) as http:
        sid = await new_session(
            http, script=[{"toolCalls": [NOTE_CALL]}], approvalRequired=["put_note"]
        )
        request = await approval_request(http, sid)
        call_id = request["toolCallId"]
        unknown = assert_problem(
            await decide(http, sid, "call_nope", True), 409, "APPROVAL_NOT_PENDING"
        )
        assert "no tool call" in unknown["detail"]
        assert (await decide(http, sid, call_id, False)).status_code == 202
        twice = await decide(http, sid, call_id, True)
        assert_problem(twice, 409, "APPROVAL_NOT_PENDING")
        await wait_for_status(http, sid, TERMINAL)
        assert_problem(await decide(http, sid, call_id, True), 409, "APPROVAL_NOT_PENDING")
        # Another owner, or no such session: 404 as everywhere.
        _, other_key = create_owner_key(api.database_url)
        async with client(api.url, other_key) as other:
            assert_problem(await decide(other, sid, call_id, True), 404, "SESSION_NOT_FOUND")
        assert_problem(
            await decide(http, str(uuid.uuid4()), call_id, True), 404, "SESSION_NOT_FOUND"
        )
        bad = await http.post(
            f"/api/agent/{sid}/tool-calls/{call_id}/approval", json={"approve": True}
        )
        assert_problem(bad, 422, "VALIDATION_ERROR")


async def test_a_message_instead_of_a_decision_denies_the_call(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    async with client(api.url, key) as http:
        sid = await new_session(
            http, script=[{"toolCalls": [NOTE_CALL]}], approvalRequired=["put_note"]
        )
        request = await approval_request(http, sid)
        sent = await http.post(f"/api/agent/{sid}/messages", json={"text": "forget the note"})
        assert sent.json()["message"]["delivery"] == "queued"
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
        events = await transcript(http, sid)
        result = of_type(events, "tool_result")[0]["data"]
        assert result["denied"] is True
        assert result["content"] == "denied: the user sent a message instead of deciding"
        assert (
            of_type(events, "assistant_message")[-1]["data"]["text"] == "You said: forget the note"
        )
        assert_problem(
            await decide(http, sid, request["toolCallId"], True), 409, "APPROVAL_NOT_PENDING"
        )


async def test_calls_without_approval_run_at_once_and_decisions_come_one_by_one(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    calls = [
        {"name": "put_note", "arguments": {"key": "a", "text": "1"}},
        {"name": "get_note", "arguments": {"key": "a"}},
        {"name": "put_note", "arguments": {"key": "b", "text": "2"}},
    ]
    async with client(api.url, key) as http:
        sid = await new_session(
            http,
            script=[{"toolCalls": calls}, {"text": "All done."}],
            approvalRequired=["put_note"],
        )
        await wait_for_status(http, sid, {"waiting"})
        events = await transcript(http, sid)
        # get_note needs no approval: it ran before the session stopped to wait.
        assert [r["data"]["name"] for r in of_type(events, "tool_result")] == ["get_note"]
        first, second = [
            e["data"]["toolCallId"] for e in of_type(events, "tool_approval_requested")
        ]
        assert (await decide(http, sid, first, True)).status_code == 202
        # The run takes the first decision and waits again for the second.
        await wait_event(
            http,
            sid,
            lambda e: (
                e["type"] == "session_end"
                and e["data"]["status"] == "waiting"
                and e["seq"] > events[-1]["seq"]
            ),
        )
        assert (await decide(http, sid, second, True)).status_code == 202
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
        events = await transcript(http, sid)
    # Asked once each, never again; results in the log in the order they came.
    assert len(of_type(events, "tool_approval_requested")) == 2
    assert [r["data"]["name"] for r in of_type(events, "tool_result")] == [
        "get_note",
        "put_note",
        "put_note",
    ]
    assert of_type(events, "assistant_message")[-1]["data"]["text"] == "All done."


async def test_a_decision_waits_in_the_log_for_a_worker(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    """Decided while no worker runs: the next worker to start acts on it."""
    first = start_worker()
    await ready(first)
    async with client(api.url, key) as http:
        sid = await new_session(
            http, script=[{"toolCalls": [NOTE_CALL]}, {"text": "ok"}], approvalRequired=["put_note"]
        )
        request = await approval_request(http, sid)
        first.signal(signal.SIGTERM)
        first.stop()
        assert (await decide(http, sid, request["toolCallId"], True)).status_code == 202
        assert (await http.get(f"/api/agent/{sid}")).json()["status"] == "queued"
        await ready(start_worker())
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"


async def test_an_approved_call_killed_mid_run_is_not_run_again_unasked(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    """SIGKILL while the approved tool runs: the call is repaired as interrupted, and the
    model's replay of it asks for approval again rather than running it behind the user's
    back."""
    victim = start_worker()
    await ready(victim)
    sleep = {"name": "sleep", "arguments": {"seconds": 30}}
    async with client(api.url, key) as http:
        sid = await new_session(
            http, script=[{"toolCalls": [sleep]}, {"text": "woke"}], approvalRequired=["sleep"]
        )
        request = await approval_request(http, sid)
        await decide(http, sid, request["toolCallId"], True)
        await wait_event(http, sid, lambda e: e["type"] == "tool_call_start")
        victim.signal(signal.SIGKILL)
        await ready(start_worker())
        await wait_event(
            http, sid, lambda e: e["type"] == "session_resumed" and e["data"]["reason"] == "crash"
        )
        again = await approval_request(http, sid)
        events = await transcript(http, sid)
    assert again["toolCallId"] != request["toolCallId"]
    resumed = of_type(events, "session_resumed")[-1]["data"]
    assert resumed["repairedToolCalls"] == [request["toolCallId"]]
    interrupted = [r["data"] for r in of_type(events, "tool_result")]
    assert interrupted == [
        {
            "toolCallId": request["toolCallId"],
            "name": "sleep",
            "isError": True,
            "content": "worker interrupted",
            "interrupted": True,
        }
    ]
