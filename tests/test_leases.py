"""Leases, fencing and hand-over between real worker processes (SPEC section 5).

Workers are paused (SIGSTOP), stopped (SIGTERM) and killed (SIGKILL) mid-run; whatever happens,
only the current lease holder's writes land, and sessions move on.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

from tests.support import (
    TERMINAL,
    ServerProcess,
    StartWorker,
    assert_contiguous,
    client,
    new_session,
    of_type,
    query,
    ready,
    transcript,
    wait_event,
    wait_for_status,
    wait_logged,
)

SLEEP_THEN_NOTE = [
    {"text": "sleeping", "toolCalls": [{"name": "sleep", "arguments": {"seconds": 3}}]},
    {"text": "noting", "toolCalls": [{"name": "put_note", "arguments": {"key": "k", "text": "v"}}]},
    {"text": "done"},
]


async def wait_lease_expired(url: str, session_id: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        rows = await query(
            url,
            "SELECT lease_expires_at < clock_timestamp() AS expired FROM sessions WHERE id = %s",
            (session_id,),
        )
        if rows[0]["expired"]:
            return
        assert time.monotonic() < deadline, "the lease never expired"
        await asyncio.sleep(0.1)


def attempt_of(event: dict[str, Any]) -> int:
    return int(event["attempt"])


async def test_lease_stolen_from_a_paused_worker_fences_it_out(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    short = {"FERRYMAN_LEASE_TTL": "2", "FERRYMAN_HEARTBEAT_INTERVAL": "0.5"}
    worker_a = start_worker(short)
    await ready(worker_a)
    async with client(api.url, key) as http:
        sid = await new_session(http, script=SLEEP_THEN_NOTE)
        first_call = await wait_event(http, sid, lambda e: e["type"] == "tool_call_start")
        assert attempt_of(first_call) == 1
        worker_a.signal(signal.SIGSTOP)
        try:
            # A is alive (its liveness lock holds) but silent: only the TTL frees the session.
            await wait_lease_expired(isolated_db, sid)
            worker_b = start_worker(short)
            resumed = await wait_event(http, sid, lambda e: e["type"] == "session_resumed")
        finally:
            worker_a.signal(signal.SIGCONT)
        # A wakes up long past its sleep: it tries to write the tool result, heartbeat, go on.
        done = await wait_for_status(http, sid, TERMINAL, timeout=30)
        assert done["status"] == "succeeded", done
        assert done["attempt"] == 2
        assert done["resumes"] == 1  # the lease expired: a takeover
        # A thawed, tried to go on and was fenced out: only then is "nothing late" shown.
        await wait_logged(worker_a, "lease lost; run stops writing", session=sid)
        events = await transcript(http, sid)

    assert_contiguous(events)
    assert attempt_of(resumed) == 2
    assert resumed["data"]["reason"] == "crash"
    run_a = of_type(events, "session_start")[0]
    assert run_a["data"]["pid"] == worker_a.pid
    assert resumed["data"]["workerId"] != run_a["data"]["workerId"]
    assert resumed["data"]["pid"] == worker_b.pid
    call_id = first_call["data"]["toolCallId"]
    assert resumed["data"]["repairedToolCalls"] == [call_id]
    # Before the steal: only A's run. After it: only B's run, nothing from A.
    # B's first write (the repair of A's call, then session_resumed) marks the steal.
    steal = min(e["seq"] for e in events if attempt_of(e) == 2)
    assert steal < resumed["seq"]
    before = [e for e in events if e["seq"] < steal]
    after = [e for e in events if e["seq"] >= steal]
    assert {attempt_of(e) for e in before if e["type"] != "user_message"} == {1}
    assert {attempt_of(e) for e in after} == {2}, [(e["type"], e["attempt"]) for e in after]
    # A's call got exactly one result: the repair, written by B.
    answers = [e for e in of_type(events, "tool_result") if e["data"]["toolCallId"] == call_id]
    assert len(answers) == 1
    assert answers[0]["data"]["interrupted"] is True and attempt_of(answers[0]) == 2
    # The interrupted (idempotent) sleep was re-issued by B; then the note and the answer.
    assert [a["data"]["text"] for a in of_type(after, "assistant_message")] == [
        "sleeping",
        "noting",
        "done",
    ]
    assert len(of_type(events, "session_end")) == 1
    notes = await query(isolated_db, "SELECT key, attempt FROM notes WHERE session_id = %s", (sid,))
    assert [(n["key"], n["attempt"]) for n in notes] == [("k", 2)]

    # A survived losing its lease and still works: with B gone, it runs the next session.
    worker_b.stop()
    assert worker_a.proc is not None and worker_a.proc.poll() is None, worker_a.logs()
    async with client(api.url, key) as http:
        other = await new_session(http, "after the steal")
        assert (await wait_for_status(http, other, TERMINAL))["status"] == "succeeded"
        started = of_type(await transcript(http, other), "session_start")[0]
        assert started["data"]["pid"] == worker_a.pid


async def test_sigterm_hands_the_session_over_at_once(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    # A long TTL: without the hand-over, the other worker would wait 30 s.
    long = {"FERRYMAN_LEASE_TTL": "30"}
    worker_a = start_worker(long)
    await ready(worker_a)
    async with client(api.url, key) as http:
        sid = await new_session(
            http,
            script=[
                {"toolCalls": [{"name": "sleep", "arguments": {"seconds": 30}}]},
                {"text": "done"},
            ],
        )
        call = await wait_event(http, sid, lambda e: e["type"] == "tool_call_start")
        session = (await http.get(f"/api/agent/{sid}")).json()
        assert session["lease"]["pid"] == worker_a.pid
        worker_b = start_worker(long)
        await ready(worker_b)

        stopped_at = time.monotonic()
        worker_a.signal(signal.SIGTERM)
        resumed = await wait_event(http, sid, lambda e: e["type"] == "session_resumed", 10)
        handover = time.monotonic() - stopped_at
        assert handover < 3.0, handover
        assert worker_a.proc is not None
        assert worker_a.proc.wait(10) == 0, worker_a.logs()

        events = await transcript(http, sid)
        interrupted = of_type(events, "session_interrupted")
        assert [e["data"] for e in interrupted] == [{"reason": "shutdown"}]
        assert attempt_of(interrupted[0]) == 1
        assert interrupted[0]["seq"] < resumed["seq"]
        assert resumed["data"]["pid"] == worker_b.pid
        assert attempt_of(resumed) == 2
        assert resumed["data"]["repairedToolCalls"] == [call["data"]["toolCallId"]]
        assert resumed["data"]["reason"] == "shutdown"  # a deploy, not a crash
        session = (await http.get(f"/api/agent/{sid}")).json()
        assert session["status"] == "running"
        assert session["lease"]["pid"] == worker_b.pid
        assert (session["attempt"], session["resumes"]) == (2, 1)  # a hand-over is a takeover
        stopped = await query(
            isolated_db,
            "SELECT stopped_at IS NOT NULL AS stopped FROM workers WHERE pid = %s",
            (worker_a.pid,),
        )
        assert [r["stopped"] for r in stopped] == [True]

        # B re-issued the sleep and honours a cancel of it.
        await wait_event(http, sid, lambda e: e["type"] == "tool_call_start" and e["attempt"] == 2)
        cancelled = await http.post(f"/api/agent/{sid}/cancel", params={"wait": "true"})
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"


async def test_crash_loop_fails_after_max_attempts_without_calling_the_model(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    env = {"FERRYMAN_MAX_ATTEMPTS": "2", "FERRYMAN_LEASE_TTL": "30"}
    async with client(api.url, key) as http:
        sid = await new_session(
            http,
            script=[
                {"toolCalls": [{"name": "sleep", "arguments": {"seconds": 30}}]},
                {"text": "never"},
            ],
        )
        for attempt in (1, 2):
            worker = start_worker(env)
            await ready(worker)
            await wait_event(
                http,
                sid,
                lambda e, n=attempt: e["type"] == "tool_call_start" and e["attempt"] == n,
            )
            # The SIGKILLed worker's session, taken over by the next one.
            assert (await http.get(f"/api/agent/{sid}")).json()["resumes"] == attempt - 1
            # The process dies with its liveness lock: no waiting for the 30 s lease.
            worker.signal(signal.SIGKILL)
            assert worker.proc is not None
            worker.proc.wait(10)
        await ready(start_worker(env))
        failed = await wait_for_status(http, sid, TERMINAL)
        assert failed["status"] == "failed"
        assert failed["attempt"] == 3
        assert failed["resumes"] == 2  # two SIGKILLed workers' runs taken over
        assert failed["error"]["code"] == "MAX_ATTEMPTS_EXCEEDED"
        assert failed["lease"] is None
        events = await transcript(http, sid)

    assert_contiguous(events)
    third = [e for e in events if attempt_of(e) == 3]
    assert [e["type"] for e in third] == ["session_end"], third
    assert third[0]["data"]["status"] == "failed"
    assert third[0]["data"]["error"]["code"] == "MAX_ATTEMPTS_EXCEEDED"
    # The model was called once per real attempt, never for the one over the cap.
    assert [attempt_of(e) for e in of_type(events, "assistant_message")] == [1, 2]
    assert [attempt_of(e) for e in of_type(events, "session_resumed")] == [2]
    owner_statuses = await query(
        isolated_db,
        "SELECT data FROM owner_events WHERE session_id = %s AND type = 'session_status'"
        " ORDER BY id",
        (sid,),
    )
    last = owner_statuses[-1]["data"]
    assert last["status"] == "failed" and last["error"]["code"] == "MAX_ATTEMPTS_EXCEEDED"


async def test_claim_over_the_cap_settles_failed(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    async with client(api.url, key) as http:
        sid = await new_session(http, "never answered")
        # As if two claims had come and gone without finishing.
        await query(isolated_db, "UPDATE sessions SET attempt = 2 WHERE id = %s", (sid,))
        start_worker({"FERRYMAN_MAX_ATTEMPTS": "2"})
        failed = await wait_for_status(http, sid, TERMINAL)
        assert failed["status"] == "failed"
        assert failed["error"]["code"] == "MAX_ATTEMPTS_EXCEEDED"
        events = await transcript(http, sid)
    assert [e["type"] for e in events] == ["user_message", "session_end"]


async def test_follow_ups_do_not_count_against_max_attempts(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    """`maxAttempts` bounds claims *without finishing*: a conversation that waits for the user
    and is answered more often than that is not a crash loop."""
    start_worker({"FERRYMAN_MAX_ATTEMPTS": "2"})
    rounds = 4
    script: list[dict[str, Any]] = [
        {"toolCalls": [{"name": "ask_user", "arguments": {"question": f"q{i}"}}]}
        for i in range(rounds)
    ]
    async with client(api.url, key) as http:
        sid = await new_session(http, script=[*script, {"text": "all answered"}])
        for i in range(rounds):
            waiting = await wait_for_status(http, sid, {"waiting", *TERMINAL})
            assert waiting["status"] == "waiting", waiting
            reply = await http.post(f"/api/agent/{sid}/messages", json={"text": f"a{i}"})
            assert reply.status_code == 202
        done = await wait_for_status(http, sid, TERMINAL)
        assert done["status"] == "succeeded", done
        assert done["attempt"] == rounds + 1
        assert done["resumes"] == 0  # follow-ups are runs, not takeovers
        events = await transcript(http, sid)
    assert [e["data"]["question"] for e in of_type(events, "user_question")] == [
        f"q{i}" for i in range(rounds)
    ]


async def test_a_holder_frozen_past_its_ttl_writes_nothing_even_unclaimed(
    api: ServerProcess, isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    """No one claims the session while its holder is frozen, so the holder's worker id and
    attempt still match: only the lease's expiry refuses its late writes."""
    short = {"FERRYMAN_LEASE_TTL": "2", "FERRYMAN_HEARTBEAT_INTERVAL": "0.5"}
    frozen = start_worker(short)
    await ready(frozen)
    async with client(api.url, key) as http:
        sid = await new_session(http, script=SLEEP_THEN_NOTE)
        call = await wait_event(http, sid, lambda e: e["type"] == "tool_call_start")
        frozen.signal(signal.SIGSTOP)
        try:
            await wait_lease_expired(isolated_db, sid)
        finally:
            frozen.signal(signal.SIGCONT)
        # Thawed: its sleep is long over and it goes on, but every write is refused.
        await wait_logged(frozen, "lease lost; run stops writing", session=sid)
        # The session is claimable again (by this very worker, as it happens): a new attempt
        # finishes it, and nothing of the frozen attempt came after the freeze.
        done = await wait_for_status(http, sid, TERMINAL, timeout=30)
        events = await transcript(http, sid)
    assert done["status"] == "succeeded" and done["attempt"] == 2
    late = [e for e in events if e["seq"] > call["seq"] and attempt_of(e) == 1]
    assert late == [], late
    (repair,) = [
        e
        for e in of_type(events, "tool_result")
        if e["data"]["toolCallId"] == call["data"]["toolCallId"]
    ]
    assert repair["data"]["interrupted"] is True and attempt_of(repair) == 2
