"""Cancellation against real worker processes (SPEC section 3, Cancel): mid-tool, mid-stream,
before any claim, racing completion, and while the lease holder is frozen."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from typing import Any

import httpx

from tests.support import (
    TERMINAL,
    ServerProcess,
    StartWorker,
    assert_contiguous,
    assert_problem,
    client,
    first_delta,
    new_session,
    of_type,
    query,
    ready,
    transcript,
    wait_event,
    wait_for_status,
    wait_logged,
)

SLEEP_30 = [{"text": "napping", "toolCalls": [{"name": "sleep", "arguments": {"seconds": 30}}]}]


async def cancel(http: httpx.AsyncClient, session_id: str, **params: Any) -> httpx.Response:
    return await http.post(f"/api/agent/{session_id}/cancel", params=params)


async def test_cancel_mid_tool_aborts_the_sleep(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    async with client(api.url, key) as http:
        first = await new_session(http, script=SLEEP_30)
        second = await new_session(http, script=SLEEP_30)
        for sid in (first, second):
            await wait_event(http, sid, lambda e: e["type"] == "tool_call_start")

        started = time.monotonic()
        accepted = await cancel(http, first)
        assert accepted.status_code == 202, accepted.text
        assert accepted.json() == {"id": first, "cancelRequested": True, "status": "running"}
        done = await wait_for_status(http, first, TERMINAL, timeout=10)
        assert done["status"] == "cancelled"
        assert time.monotonic() - started < 2.0
        assert done["cancelRequested"] is True
        assert done["lease"] is None

        # ?wait=true holds the answer until the session is terminal, then gives the Session.
        started = time.monotonic()
        waited = await cancel(http, second, wait="true")
        assert time.monotonic() - started < 2.0
        assert waited.status_code == 200, waited.text
        body = waited.json()
        assert body["id"] == second and body["status"] == "cancelled"
        assert body["cancelRequested"] is True and body["lease"] is None

        # Cancelling again: the session is terminal.
        again = await cancel(http, first)
        problem = assert_problem(again, 409, "SESSION_ALREADY_TERMINAL")
        assert problem["sessionStatus"] == "cancelled"

        for sid in (first, second):
            events = await transcript(http, sid)
            assert_contiguous(events)
            result = of_type(events, "tool_result")
            assert len(result) == 1
            assert result[0]["data"]["interrupted"] is True
            assert result[0]["data"]["isError"] is True
            ends = of_type(events, "session_end")
            assert [e["data"]["status"] for e in ends] == ["cancelled"]
            assert events[-1]["type"] == "session_end"
            assert {e["attempt"] for e in events[1:]} == {1}

    owner_events = await query(
        isolated_db,
        "SELECT type, data FROM owner_events WHERE session_id = %s ORDER BY id",
        (first,),
    )
    types = [e["type"] for e in owner_events]
    assert types.count("session_cancel_requested") == 1
    statuses = [e["data"]["status"] for e in owner_events if e["type"] == "session_status"]
    assert statuses == ["running", "cancelled"]


async def test_delete_cancels_a_running_session_first(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    """SPEC: DELETE "cancels it first if not terminal". The 204 comes once the run has
    settled, so nothing follows `session_deleted` on the owner feed, and the session's log
    ends in `session_end {cancelled}`."""
    worker = start_worker()
    await ready(worker)
    async with client(api.url, key) as http:
        sid = await new_session(http, script=SLEEP_30)
        await wait_event(http, sid, lambda e: e["type"] == "tool_call_start")
        started = time.monotonic()
        assert (await http.delete(f"/api/agent/{sid}")).status_code == 204
        assert time.monotonic() - started < 2.0
        assert_problem(await http.get(f"/api/agent/{sid}"), 404, "SESSION_NOT_FOUND")
    # The 204 waits for the run to settle: by then the holder has said its last word.
    await wait_logged(worker, "run ended", session=sid)
    owner_events = await query(
        isolated_db,
        "SELECT type, data FROM owner_events WHERE session_id = %s ORDER BY id",
        (sid,),
    )
    assert [(e["type"], e["data"].get("status")) for e in owner_events][-3:] == [
        ("session_cancel_requested", None),
        ("session_status", "cancelled"),
        ("session_deleted", None),
    ]
    events = await query(
        isolated_db,
        "SELECT type, data FROM session_events WHERE session_id = %s ORDER BY seq",
        (sid,),
    )
    assert events[-1]["type"] == "session_end"
    assert events[-1]["data"]["status"] == "cancelled"


async def test_cancel_mid_stream_keeps_the_partial_answer_as_aborted(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    text = "abcdefghij" * 5
    await ready(start_worker())
    async with client(api.url, key) as http:
        sid = await new_session(http, script=[{"text": text, "chunks": 50, "delayMs": 10000}])
        await first_delta(http, sid)  # the answer has begun to stream
        started = time.monotonic()
        assert (await cancel(http, sid)).status_code == 202
        done = await wait_for_status(http, sid, TERMINAL, timeout=10)
        assert done["status"] == "cancelled"
        assert time.monotonic() - started < 2.0
        events = await transcript(http, sid)
    answers = of_type(events, "assistant_message")
    assert len(answers) == 1
    partial = answers[0]["data"]
    assert partial["stopReason"] == "aborted"
    assert partial["toolCalls"] == []
    # What had streamed when the cancel came: some of the text, not all of it.
    assert 0 < len(partial["text"]) < len(text)
    assert text.startswith(partial["text"])
    assert [e["type"] for e in events][-2:] == ["assistant_message", "session_end"]
    assert events[-1]["data"]["status"] == "cancelled"


async def test_cancel_before_any_claim_wins(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    async with client(api.url, key) as http:
        # No worker is running: these stay queued until cancelled.
        plain = await new_session(http, "cancel me")
        waited = await new_session(http, "cancel me and wait")
        accepted = await cancel(http, plain)
        assert accepted.status_code == 202
        assert accepted.json() == {"id": plain, "cancelRequested": True, "status": "cancelled"}
        held = await cancel(http, waited, wait="true")
        assert held.status_code == 200
        assert held.json()["status"] == "cancelled"
        assert held.json()["attempt"] == 0

        await ready(start_worker())
        # The worker is claiming: an ordinary session runs to the end ...
        control = await new_session(http, "control")
        assert (await wait_for_status(http, control, TERMINAL))["status"] == "succeeded"
        # ... but the cancelled ones were never run: claims go in creation order, so had
        # they been claimable, they would have run before `control`.
        for sid in (plain, waited):
            session = (await http.get(f"/api/agent/{sid}")).json()
            assert session["status"] == "cancelled"
            assert session["attempt"] == 0
            assert session["cancelRequested"] is True
            events = await transcript(http, sid)
            assert [e["type"] for e in events] == ["user_message", "session_end"]
            assert events[1]["data"]["status"] == "cancelled"

        # A waiting session is settled by the API too, without its worker.
        asking = await new_session(
            http,
            script=[{"toolCalls": [{"name": "ask_user", "arguments": {"question": "?"}}]}],
        )
        assert (await wait_for_status(http, asking, {"waiting", *TERMINAL}))["status"] == "waiting"
        settled = await cancel(http, asking)
        assert settled.status_code == 202
        assert settled.json()["status"] == "cancelled"
        events = await transcript(http, asking)
        assert of_type(events, "session_end")[-1]["data"]["status"] == "cancelled"
        claims = await query(
            isolated_db,
            "SELECT count(*) AS n FROM owner_events WHERE session_id = ANY(%s)"
            " AND type = 'session_status' AND data->>'status' = 'running'",
            ([plain, waited],),
        )
        assert claims[0]["n"] == 0


async def test_cancel_racing_completion_never_both(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    """A cancel either finds the session terminal (409, succeeded) or the session ends
    cancelled (202): never 202 and succeeded."""
    rng = random.Random(20261129)
    workers = [start_worker(concurrency=10) for _ in range(2)]
    await ready(*workers)
    count = 48
    async with client(api.url, key) as http:

        async def race(index: int) -> tuple[str, httpx.Response]:
            delay_ms = rng.randint(50, 150)
            sid = await new_session(
                http, f"race {index}", script=[{"text": "ok", "delayMs": delay_ms}]
            )
            # A third right after creation (mostly before any claim), a third somewhere in the
            # run, a third around its very end (the final answer is logged, the run not closed).
            if index % 3 == 1:
                await wait_event(http, sid, lambda e: e["type"] == "session_start")
                await asyncio.sleep(rng.uniform(0, 0.15))
            elif index % 3 == 2:
                await wait_event(http, sid, lambda e: e["type"] == "assistant_message")
                await asyncio.sleep(rng.uniform(0, 0.02))
            return sid, await cancel(http, sid)

        outcomes = await asyncio.gather(*(race(i) for i in range(count)))
        tally: dict[tuple[int, str], int] = {}
        for sid, response in outcomes:
            session = await wait_for_status(http, sid, TERMINAL)
            events = await transcript(http, sid)
            ends = [e["data"]["status"] for e in of_type(events, "session_end")]
            if response.status_code == 202:
                assert session["status"] == "cancelled", (sid, events)
                assert ends == ["cancelled"], (sid, ends)
            else:
                problem = assert_problem(response, 409, "SESSION_ALREADY_TERMINAL")
                assert problem["sessionStatus"] == "succeeded"
                assert session["status"] == "succeeded"
                assert ends == ["succeeded"]
            outcome = (response.status_code, session["status"])
            tally[outcome] = tally.get(outcome, 0) + 1
    # Both sides of the race were exercised.
    assert set(tally) == {(202, "cancelled"), (409, "succeeded")}, tally


async def test_cancel_while_the_holder_is_frozen(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    """The lease holder cannot act on the cancel; whoever claims next settles it cancelled
    without calling the model, and the old holder, thawed, writes nothing."""
    short = {"FERRYMAN_LEASE_TTL": "2", "FERRYMAN_HEARTBEAT_INTERVAL": "0.5"}
    frozen = start_worker(short)
    await ready(frozen)
    async with client(api.url, key) as http:
        sid = await new_session(http, script=SLEEP_30)
        await wait_event(http, sid, lambda e: e["type"] == "tool_call_start")
        frozen.signal(signal.SIGSTOP)
        try:
            accepted = await cancel(http, sid)
            assert accepted.status_code == 202
            assert accepted.json()["status"] == "running"
            start_worker(short)
            done = await wait_for_status(http, sid, TERMINAL, timeout=20)
        finally:
            frozen.signal(signal.SIGCONT)
        assert done["status"] == "cancelled"
        assert done["attempt"] == 2
        # The thawed holder tried to go on and was fenced out: only then is "nothing late" shown.
        await wait_logged(frozen, "lease lost; run stops writing", session=sid)
        events = await transcript(http, sid)
    assert_contiguous(events)
    second = [e for e in events if e["attempt"] == 2]
    assert [e["type"] for e in second] == ["session_end"]
    assert second[0]["data"]["status"] == "cancelled"
    assert events[-1] == second[0]
    assert len(of_type(events, "assistant_message")) == 1
    rows = await query(
        isolated_db, "SELECT max(seq) AS m FROM session_events WHERE session_id = %s", (sid,)
    )
    assert rows[0]["m"] == events[-1]["seq"]
    assert frozen.proc is not None and frozen.proc.poll() is None, frozen.logs()
