"""Fork and edit (SPEC section 11, docs/fork.md) through the whole runtime: a real API server,
real `ferryman worker` processes and the scripted model (which answers "You said: <the last
user message>" past its script, so an edit shows in the answer)."""

from __future__ import annotations

import json
import signal
import uuid
from typing import Any

import httpx
import pytest

import ferryman as sdk
from app.domain import MAX_FORK_EVENTS
from tests.support import (
    ServerProcess,
    StartWorker,
    assert_contiguous,
    assert_problem,
    client,
    create_owner_key,
    ids,
    new_session,
    of_type,
    query,
    ready,
    sse,
    transcript,
    wait_event,
    wait_for_status,
)
from tests.test_cli_client import Ferryman as Command

DONE = {"succeeded"}


async def fork(http: httpx.AsyncClient, sid: str, **body: Any) -> httpx.Response:
    return await http.post(f"/api/agent/{sid}/fork", json=body)


async def forked(http: httpx.AsyncClient, sid: str, **body: Any) -> dict[str, Any]:
    response = await fork(http, sid, **body)
    assert response.status_code == 201, response.text
    session: dict[str, Any] = response.json()
    assert response.headers["location"] == f"/api/agent/{session['id']}"
    return session


async def finished(http: httpx.AsyncClient, prompt: str, **body: Any) -> str:
    sid = await new_session(http, prompt, **body)
    await wait_for_status(http, sid, DONE)
    return sid


def answers(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["text"] for e in of_type(events, "assistant_message")]


def stripped(events: list[dict[str, Any]]) -> list[tuple[int, str, dict[str, Any]]]:
    """What a copied event keeps of its original: its seq, type and data."""
    return [(e["seq"], e["type"], e["data"]) for e in events]


async def test_an_edit_regenerates_the_answer_and_leaves_the_parent(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    async with client(api.url, key) as http:
        parent = await finished(http, "first")
        posted = await http.post(f"/api/agent/{parent}/messages", json={"text": "second"})
        assert posted.status_code == 202
        at = posted.json()["message"]["seq"]
        await wait_event(http, parent, lambda e: e["seq"] > at and e["type"] == "session_end")
        before = await transcript(http, parent)
        parent_row = (await http.get(f"/api/agent/{parent}")).json()

        child = await forked(http, parent, atSeq=at, message="edited", title="Branch")
        assert child["status"] == "queued" and child["title"] == "Branch"
        assert child["forkedFrom"] == {"sessionId": parent, "seq": at}
        assert child["prompt"] == "first" and child["lastSeq"] == at and child["attempt"] == 0
        await wait_for_status(http, child["id"], DONE)
        events = await transcript(http, child["id"])
        assert_contiguous(events)
        assert answers(events) == ["You said: first", "You said: edited"]
        assert answers(before) == ["You said: first", "You said: second"]
        # The history before the edit is the parent's, event for event.
        assert stripped(events[: at - 1]) == stripped(before[: at - 1])
        assert events[at - 1]["type"] == "user_message"
        assert events[at - 1]["data"]["text"] == "edited"
        assert {e["attempt"] for e in events[: at - 1]} == {0}  # from before any run of its own
        # The parent is untouched.
        assert await transcript(http, parent) == before
        again = (await http.get(f"/api/agent/{parent}")).json()
        assert again == parent_row

        shown = (await http.get(f"/api/agent/{child['id']}")).json()
        assert shown["forkedFrom"] == child["forkedFrom"] and shown["title"] == "Branch"
        listed = {s["id"]: s for s in (await http.get("/api/agent")).json()["sessions"]}
        assert listed[child["id"]]["forkedFrom"] == child["forkedFrom"]
        assert "forkedFrom" not in listed[parent]
    created = await query(
        isolated_db,
        "SELECT data FROM owner_events WHERE session_id = %s AND type = 'session_created'",
        (child["id"],),
    )
    assert created[0]["data"]["session"]["forkedFrom"] == child["forkedFrom"]


async def test_an_edit_of_the_first_message_is_the_prompt(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    async with client(api.url, key) as http:
        parent = await finished(http, "hello")
        child = await forked(http, parent, atSeq=1, message="bonjour")
        assert child["prompt"] == "bonjour" and child["title"] == "hello"
        await wait_for_status(http, child["id"], DONE)
        assert answers(await transcript(http, child["id"])) == ["You said: bonjour"]


async def test_a_fork_keeps_the_definition(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    """The fork runs as its parent would: the same instructions, settings, compaction and
    priority."""
    await ready(start_worker())
    compaction = {"triggerTokens": 5000, "keepRecentTurns": 3}
    async with client(api.url, key) as http:
        parent = await finished(
            http,
            "hello",
            instructions="Be brief.",
            compaction=compaction,
            metadata={"a": 1},
            priority=4,
        )
        child = await forked(http, parent, atSeq=1)
        shown = (await http.get(f"/api/agent/{parent}")).json()
        same = ("instructions", "modelSettings", "model", "metadata", "approvalRequired")
        assert child["priority"] == shown["priority"] == 4
        assert {k: child[k] for k in same} == {k: shown[k] for k in same}
        assert child["compaction"] == shown["compaction"]
        assert shown["compaction"]["triggerTokens"] == 5000


async def test_a_fork_without_an_edit_answers_only_what_is_left(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    async with client(api.url, key) as http:
        parent = await finished(http, "hello")
        log = await transcript(http, parent)
        answer = of_type(log, "assistant_message")[0]["seq"]
        # At the final answer (or the run's end) nothing is left: idle until a message.
        for at in (answer, log[-1]["seq"]):
            child = await forked(http, parent, atSeq=at)
            assert child["status"] == "idle", at
            assert stripped(await transcript(http, child["id"])) == stripped(log[:at])
        posted = await http.post(f"/api/agent/{child['id']}/messages", json={"text": "more"})
        assert posted.status_code == 202
        await wait_for_status(http, child["id"], DONE)
        assert answers(await transcript(http, child["id"])) == ["You said: hello", "You said: more"]
        # At the user message: the answer is left to give again (retry from here).
        retry = await forked(http, parent, atSeq=1)
        assert retry["status"] == "queued"
        await wait_for_status(http, retry["id"], DONE)
        assert answers(await transcript(http, retry["id"])) == ["You said: hello"]


def put_note(text: str) -> dict[str, Any]:
    return {"toolCalls": [{"name": "put_note", "arguments": {"key": "k", "text": text}}]}


async def test_a_fork_has_the_notes_of_its_point(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    script = [put_note("one"), {"text": "Saved one."}, put_note("two"), {"text": "Saved two."}]
    async with client(api.url, key) as http:
        parent = await finished(http, "save", script=script)
        posted = await http.post(f"/api/agent/{parent}/messages", json={"text": "again"})
        at = posted.json()["message"]["seq"]
        await wait_event(http, parent, lambda e: e["seq"] > at and e["type"] == "session_end")
        first = of_type(await transcript(http, parent), "assistant_message")[1]
        assert first["data"]["text"] == "Saved one."
        early = await forked(http, parent, atSeq=first["seq"])
        late = await forked(http, parent, atSeq=(await transcript(http, parent))[-1]["seq"])
        edited = await forked(http, parent, atSeq=1, message="save nothing")

    async def notes(sid: str) -> list[tuple[str, str]]:
        rows = await query(isolated_db, "SELECT key, text FROM notes WHERE session_id = %s", (sid,))
        return [(r["key"], r["text"]) for r in rows]

    assert await notes(parent) == [("k", "two")]
    assert await notes(early["id"]) == [("k", "one")]
    assert await notes(late["id"]) == [("k", "two")]
    assert await notes(edited["id"]) in ([], [("k", "one")])  # its own run may have saved


async def test_a_fork_at_a_pending_approval_waits_for_its_own_decision(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    script = [put_note("kept"), {"text": "Saved."}]
    async with client(api.url, key) as http:
        parent = await new_session(http, "save", script=script, approvalRequired=["put_note"])
        await wait_for_status(http, parent, {"waiting"})
        request = of_type(await transcript(http, parent), "tool_approval_requested")[0]
        child = await forked(http, parent, atSeq=request["seq"])
        assert child["status"] == "queued"
        await wait_for_status(http, child["id"], {"waiting"})
        call_id = request["data"]["toolCallId"]
        decided = await http.post(
            f"/api/agent/{child['id']}/tool-calls/{call_id}/approval", json={"approved": True}
        )
        assert decided.status_code == 202, decided.text
        await wait_for_status(http, child["id"], DONE)
        assert answers(await transcript(http, child["id"]))[-1] == "Saved."
        assert (await http.get(f"/api/agent/{parent}")).json()["status"] == "waiting"


async def test_a_running_session_forks_as_far_as_it_has_written(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    """Cut in the middle of a tool call: the fork's first run answers the dangling call as
    interrupted (the resume repair) and goes on; the parent goes on undisturbed."""
    await ready(start_worker())
    script = [
        {"text": "Napping.", "toolCalls": [{"name": "sleep", "arguments": {"seconds": 2}}]},
        {"text": "Rested."},
    ]
    async with client(api.url, key) as http:
        parent = await new_session(http, "nap", script=script)
        call = await wait_event(http, parent, lambda e: e["type"] == "tool_call_start")
        row = (await http.get(f"/api/agent/{parent}")).json()
        assert row["status"] == "running"
        too_far = await fork(http, parent, atSeq=row["lastSeq"] + 1)
        problem = assert_problem(too_far, 422, "FORK_SEQ_OUT_OF_RANGE")
        assert problem["lastSeq"] >= row["lastSeq"]

        child = await forked(http, parent, atSeq=call["seq"])
        assert child["status"] == "queued"
        await wait_for_status(http, child["id"], DONE)
        await wait_for_status(http, parent, DONE)
        events = await transcript(http, child["id"])
        assert_contiguous(events)
        call_id = call["data"]["toolCallId"]
        results = [r["data"] for r in of_type(events, "tool_result")]
        assert results[0]["toolCallId"] == call_id and results[0]["interrupted"] is True
        assert answers(events) == ["Napping.", "Napping.", "Rested."]  # the turn replayed
        parent_events = await transcript(http, parent)
        assert answers(parent_events) == ["Napping.", "Rested."]
        assert not any(r["data"].get("interrupted") for r in of_type(parent_events, "tool_result"))


async def test_a_forked_run_survives_its_worker_being_killed(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    script = [
        {"text": "Napping.", "toolCalls": [{"name": "sleep", "arguments": {"seconds": 60}}]},
        {"text": "Rested."},
    ]
    async with client(api.url, key) as http:
        parent = await new_session(http, "nap", script=script)  # no worker yet: it waits
        child = (await forked(http, parent, atSeq=1))["id"]
        assert (await http.post(f"/api/agent/{parent}/cancel")).status_code == 202
        first = start_worker()
        call = await wait_event(http, child, lambda e: e["type"] == "tool_call_start")
        first.signal(signal.SIGKILL)
        await ready(start_worker())
        resumed = await wait_event(http, child, lambda e: e["type"] == "session_resumed")
        assert resumed["data"]["reason"] == "crash"
        assert resumed["data"]["repairedToolCalls"] == [call["data"]["toolCallId"]]
        await wait_event(
            http, child, lambda e: e["type"] == "tool_call_start" and e["seq"] > resumed["seq"]
        )
        await http.post(f"/api/agent/{child}/cancel")
        await wait_for_status(http, child, {"cancelled"}, timeout=30)
        events = await transcript(http, child)
        assert_contiguous(events)
        assert events[0]["data"]["text"] == "nap"
        parent_events = await transcript(http, parent)
        assert [e["type"] for e in parent_events] == ["user_message", "session_end"]


async def test_bad_forks_are_refused(api: ServerProcess, isolated_db: str, key: str) -> None:
    async with client(api.url, key) as http:
        parent = await new_session(http, "hello")  # no worker: stays queued, one event
        assert_problem(await fork(http, parent, atSeq=2), 422, "FORK_SEQ_OUT_OF_RANGE")
        too_long = await fork(http, parent, atSeq=MAX_FORK_EVENTS + 1)
        assert assert_problem(too_long, 422, "FORK_TOO_LONG")["limit"] == MAX_FORK_EVENTS
        for body in (
            {},
            {"atSeq": 0},
            {"atSeq": "one"},
            {"atSeq": 1, "message": ""},
            {"atSeq": 1, "title": ""},
            {"atSeq": 1, "other": True},
            {"atSeq": 1, "message": "x" * 100_001},
        ):
            assert_problem(await fork(http, parent, **body), 422, "VALIDATION_ERROR")
        assert_problem(await fork(http, str(uuid.uuid4()), atSeq=1), 404, "SESSION_NOT_FOUND")
        assert_problem(await fork(http, "not-a-uuid", atSeq=1), 404, "SESSION_NOT_FOUND")
        cancelled = await http.post(f"/api/agent/{parent}/cancel")
        assert cancelled.status_code == 202
        end = (await transcript(http, parent))[-1]
        problem = assert_problem(
            await fork(http, parent, atSeq=end["seq"], message="edit"), 422, "FORK_NOT_USER_MESSAGE"
        )
        assert problem["eventType"] == "session_end"
        assert (await http.delete(f"/api/agent/{parent}")).status_code == 204
        assert_problem(await fork(http, parent, atSeq=1), 404, "SESSION_NOT_FOUND")
    other = await new_session_of_other_owner(api, isolated_db)
    async with client(api.url, key) as http:
        assert_problem(await fork(http, other, atSeq=1), 404, "SESSION_NOT_FOUND")


async def new_session_of_other_owner(api: ServerProcess, isolated_db: str) -> str:
    _, other_key = create_owner_key(isolated_db)
    async with client(api.url, other_key) as http:
        return await new_session(http, "mine")


async def test_the_sdks_and_the_command_fork(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    async with client(api.url, key) as http:
        parent = await finished(http, "hello")
    with sdk.Ferryman(api.url, api_key=key) as sync:
        edited = sync.fork_session(parent, 1, message="sync edit", title="Sync")
        assert edited.forked_from == sdk.ForkedFrom(session_id=parent, seq=1)
        assert (edited.status, edited.title) == ("queued", "Sync")
        with pytest.raises(sdk.UnprocessableEntityError) as refused:
            sync.fork_session(parent, 99)
        assert refused.value.code == "FORK_SEQ_OUT_OF_RANGE"
        assert sync.raw.fork_session(parent, 3)["status"] == "idle"
    async with sdk.AsyncFerryman(api.url, api_key=key) as async_client:
        retried = await async_client.fork_session(parent, 1)
        assert retried.forked_from is not None and retried.forked_from.seq == 1
    cli = Command(api.url, key)
    forked = await cli("sessions", "fork", parent, "--at-seq", "1", "--message", "cli edit")
    assert forked.returncode == 0, forked
    fork_id = forked.stdout.split()[0]
    assert f"forked from {parent} at event 1 (queued)" in forked.stdout
    async with client(api.url, key) as http:
        for sid in (edited.id, retried.id, fork_id):
            await wait_for_status(http, sid, DONE)
        assert answers(await transcript(http, edited.id)) == ["You said: sync edit"]
        assert answers(await transcript(http, retried.id)) == ["You said: hello"]
        assert answers(await transcript(http, fork_id)) == ["You said: cli edit"]
    shown = await cli("sessions", "show", fork_id)
    assert f"from {parent} at event 1" in shown.stdout, shown


async def test_a_fork_of_a_stateless_thread_is_kept(api: ServerProcess, key: str) -> None:
    """The marks that have a stateless Agent Protocol thread deleted once its run ends are
    not copied: a fork is a session of its own."""
    metadata = {"stateless": True, "on_completion": "delete", "team": "blue"}
    async with client(api.url, key) as http:
        parent = await new_session(http, "hello", metadata=metadata)
        child = await forked(http, parent, atSeq=1)
    assert child["metadata"] == {"team": "blue"}


async def test_the_openapi_document_declares_the_fork(api: ServerProcess) -> None:
    async with client(api.url) as http:
        spec = (await http.get("/openapi.json")).json()
    operation = spec["paths"]["/api/agent/{session_id}/fork"]["post"]
    assert operation["operationId"] == "forkSession"
    assert set(operation["responses"]) >= {"201", "400", "401", "403", "404", "413", "422", "503"}
    session = spec["components"]["schemas"]["Session"]["properties"]
    assert "forkedFrom" in session
    codes = spec["components"]["schemas"]["ProblemCode"]["enum"]
    assert {"FORK_SEQ_OUT_OF_RANGE", "FORK_NOT_USER_MESSAGE", "FORK_TOO_LONG"} <= set(codes)


async def test_a_fork_at_a_question_waits_for_an_answer(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    script = [
        {"toolCalls": [{"name": "ask_user", "arguments": {"question": "Which colour?"}}]},
        {"text": "Blue it is."},
    ]
    async with client(api.url, key) as http:
        parent = await new_session(http, "paint", script=script)
        await wait_for_status(http, parent, {"waiting"})
        asked = await wait_event(http, parent, lambda e: e["type"] == "user_question")
        child = (await forked(http, parent, atSeq=asked["seq"]))["id"]
        await wait_for_status(http, child, {"waiting"})
        events = await transcript(http, child)
        assert not of_type(events[asked["seq"] :], "assistant_message")  # no model call
        assert (await http.post(f"/api/agent/{child}/messages", json={"text": "blue"})).is_success
        await wait_for_status(http, child, DONE)
        assert answers(await transcript(http, child))[-1] == "Blue it is."


async def test_the_streams_show_the_fork(api: ServerProcess, key: str) -> None:
    """The owner stream announces the fork with `forkedFrom`; its session stream replays its
    whole log, the copied events first, with seqs as ids."""
    async with client(api.url, key) as http:
        parent = await new_session(http, "hello")
        cursor = (await http.get("/api/agent", params={"limit": 1})).json()["cursor"]
        child = await forked(http, parent, atSeq=1, message="hi")
        async with sse(http, "/api/agent/owner-events", last_event_id=cursor) as events:
            async for event in events:
                if event.event == "session_created":
                    created = json.loads(event.data)["data"]["session"]
                    break
        assert created["id"] == child["id"]
        assert created["forkedFrom"] == {"sessionId": parent, "seq": 1}
        async with sse(http, f"/api/agent/{child['id']}/events", follow="false") as events:
            frames = [event async for event in events]
        assert ids(frames) == [1]
        assert json.loads(frames[0].data)["data"]["text"] == "hi"
