"""The claim reads an index, not the whole table: with 200,000 finished sessions a claim poll
(every worker, every second, and at every work NOTIFY) must not scan them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from app.store.claims import CLAIM_LIMITED_SQL, CLAIM_SQL, claim_params
from app.store.notify import STREAMS_CHANNEL
from tests.support import QUEUE, fresh_database

FINISHED = 200_000
CLAIM_PARAMS = claim_params("w:1", 1, 10, [], 1)


@pytest.fixture(scope="module")
def crowded() -> Iterator[str]:
    """A database holding many finished (and some deleted) sessions and one live worker."""
    with fresh_database("ferryman_claim") as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO sessions (id, owner_id, title, status, model, prompt, deleted_at)"
            " SELECT gen_random_uuid(), 'o', 't', 'succeeded', 'scripted', 'p',"
            " CASE WHEN n %% 10 = 0 THEN clock_timestamp() END"
            " FROM generate_series(1, %s) AS n",
            (FINISHED,),
        )
        conn.execute("INSERT INTO workers (id, pid, hostname) VALUES ('w:1', 1, 'test')")
        conn.execute("ANALYZE sessions")
        yield url


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from plan_nodes(child)


@pytest.mark.parametrize("limited", [False, True], ids=["claim", "owner-limited claim"])
def test_the_claim_uses_the_claimable_index(crowded: str, limited: bool) -> None:
    query, params = (
        (CLAIM_LIMITED_SQL, {**CLAIM_PARAMS, "max_running": 2})
        if limited
        else (CLAIM_SQL, CLAIM_PARAMS)
    )
    with psycopg.connect(crowded, autocommit=True) as conn:
        (raw,) = conn.execute("EXPLAIN (FORMAT JSON) " + query, params).fetchone()  # type: ignore[misc]
    plan = (raw if isinstance(raw, list) else json.loads(raw))[0]["Plan"]
    scans = [
        (node["Node Type"], node.get("Index Name"))
        for node in plan_nodes(plan)
        if node.get("Relation Name") == "sessions"
    ]
    assert ("Seq Scan", None) not in scans, scans
    assert any(index == "sessions_claimable" for _, index in scans), scans
    # the candidates come in the index's order, (priority DESC, claim_key), not sorted
    (candidates,) = [node for node in plan_nodes(plan) if node["Node Type"] == "LockRows"]
    sorts = [node for node in plan_nodes(candidates) if node["Node Type"] == "Sort"]
    assert not sorts, sorts


def test_a_deleted_session_still_running_is_claimed(crowded: str) -> None:
    """Deleted while its holder was frozen: it must still be claimable, to be settled."""
    with psycopg.connect(crowded, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO sessions (id, owner_id, title, status, model, prompt, attempt,"
            " lease_worker_id, lease_expires_at, cancel_requested_at, deleted_at)"
            " VALUES (gen_random_uuid(), 'o', 'stuck', 'running', 'scripted', 'p', 1,"
            " 'gone:2', clock_timestamp() - interval '1 minute', clock_timestamp(),"
            " clock_timestamp())"
        )
        row = conn.execute(CLAIM_SQL, CLAIM_PARAMS).fetchone()
    assert row is not None and row[2] == "stuck"  # id, owner_id, title, ...


def test_a_batch_claim_announces_each_session_in_order_without_gaps() -> None:
    """One statement claims several sessions of several owners, taking turns between owners:
    each owner's feed gets one `session_status running` per session, numbered on from its
    cursor with no gap, in the order the sessions were created, and its stream is notified."""
    with (
        fresh_database("ferryman_claim_batch") as url,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        conn.execute("INSERT INTO workers (id, pid, hostname) VALUES ('w:1', 1, 'test')")
        conn.execute("INSERT INTO owner_cursors (owner_id, last_id) VALUES ('a', 7)")
        for n, owner in enumerate(["a", "b", "a", "a", "b"]):
            conn.execute(
                "INSERT INTO sessions (id, owner_id, title, status, model, prompt, created_at)"
                " VALUES (gen_random_uuid(), %s, %s, 'queued', 'scripted', 'p',"
                " clock_timestamp() + make_interval(secs => %s))",
                (owner, f"s{n}", n),
            )
        conn.execute(f"LISTEN {STREAMS_CHANNEL}")
        rows = conn.execute(CLAIM_SQL, {**CLAIM_PARAMS, "limit": 4}).fetchall()
        # Titles: each owner's oldest first, the owners in turn (a's third waits for b's second).
        assert [row[2] for row in rows] == ["s0", "s1", "s2", "s4"]
        events = conn.execute(
            "SELECT e.owner_id, e.id, s.title, e.type, e.data FROM owner_events e"
            " JOIN sessions s ON s.id = e.session_id ORDER BY e.owner_id, e.id"
        ).fetchall()
        assert [(owner, event_id, title) for owner, event_id, title, _, _ in events] == [
            ("a", 8, "s0"),
            ("a", 9, "s2"),
            ("b", 1, "s1"),
            ("b", 2, "s4"),
        ]
        assert all(
            kind == "session_status" and data == {"status": "running", "attempt": 1, "resumes": 0}
            for _, _, _, kind, data in events
        )
        cursors = dict(conn.execute("SELECT owner_id, last_id FROM owner_cursors").fetchall())
        assert cursors == {"a": 9, "b": 2}
        keys = {note.payload for note in conn.notifies(timeout=1, stop_after=6)}
        claimed = {f"s:{row[0]}" for row in rows}  # and each one's `session_start`
        assert keys == {"o:a", "o:b"} | claimed
        # The rest, and then nothing.
        assert [row[2] for row in conn.execute(CLAIM_SQL, {**CLAIM_PARAMS, "limit": 4})] == ["s3"]
        assert conn.execute(CLAIM_SQL, {**CLAIM_PARAMS, "limit": 4}).fetchall() == []


def test_a_first_claim_logs_session_start_and_brings_it_in_the_head() -> None:
    """A session's first claim logs its `session_start` after the events it has and brings it
    in the head, so the run writes nothing before the model is first asked; a later claim (a
    resume) logs nothing: its run writes `session_resumed`. A head that stops short of the log
    leaves the event out, and the run reads the log."""
    with (
        fresh_database("ferryman_claim_start") as url,
        psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn,
    ):
        conn.execute("INSERT INTO workers (id, pid, hostname) VALUES ('w:1', 1, 'test')")
        session_id = conn.execute(
            "INSERT INTO sessions (id, owner_id, title, status, model, prompt, last_seq)"
            " VALUES (gen_random_uuid(), 'o', 't', 'queued', 'scripted', 'p', 1) RETURNING id"
        ).fetchone()["id"]
        conn.execute(
            "INSERT INTO session_events (session_id, seq, attempt, type, data)"
            " VALUES (%s, 1, 0, 'user_message', '{\"text\": \"hi\"}')",
            (session_id,),
        )
        params = {**CLAIM_PARAMS, "worker": "w:1", "pid": 42}
        row = conn.execute(CLAIM_SQL, params).fetchone()
        assert row is not None and row["attempt"] == 1 and row["last_seq"] == 2
        start = {"workerId": "w:1", "pid": 42, "attempt": 1}
        assert row["head"] == [
            {"seq": 1, "type": "user_message", "data": {"text": "hi"}},
            {"seq": 2, "type": "session_start", "data": start},
        ]
        logged = conn.execute(
            "SELECT seq, attempt, type, data FROM session_events WHERE session_id = %s"
            " ORDER BY seq",
            (session_id,),
        ).fetchall()
        assert logged[-1] == {"seq": 2, "attempt": 1, "type": "session_start", "data": start}

        conn.execute("UPDATE sessions SET lease_expires_at = clock_timestamp() - interval '1s'")
        again = conn.execute(CLAIM_SQL, params).fetchone()
        assert again is not None and again["attempt"] == 2 and again["last_seq"] == 2
        assert [event["seq"] for event in again["head"]] == [1, 2]

        # A head cut short by its byte bound does not get the event: the run reads its log.
        other = conn.execute(
            "INSERT INTO sessions (id, owner_id, title, status, model, prompt, last_seq)"
            " VALUES (gen_random_uuid(), 'o', 'big', 'queued', 'scripted', 'p', 1) RETURNING id"
        ).fetchone()["id"]
        conn.execute(
            "INSERT INTO session_events (session_id, seq, attempt, type, data)"
            " VALUES (%s, 1, 0, 'user_message', jsonb_build_object('text', repeat('x', 100)))",
            (other,),
        )
        cut = conn.execute(CLAIM_SQL, {**params, "head_bytes": 10}).fetchone()
        assert cut is not None and cut["id"] == other and cut["last_seq"] == 2
        assert cut["head"] is None


def test_one_owners_backlog_does_not_hold_back_another_owners_sessions() -> None:
    """Owner a queues 500 sessions, then owner b queues 3: claims take the two owners in turn,
    so b's three are among the first six claimed, and each owner's go first queued, first
    claimed. A session queued again (a follow-up) takes a new turn on its owner's clock."""
    with (
        fresh_database("ferryman_claim_fair") as url,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        conn.execute("INSERT INTO workers (id, pid, hostname) VALUES ('w:1', 1, 'test')")
        conn.execute(QUEUE, {"owner": "a", "title": "a", "n": 500, "priority": 0})
        conn.execute(QUEUE, {"owner": "b", "title": "b", "n": 3, "priority": 0})
        claimed = [row[2] for row in conn.execute(CLAIM_SQL, {**CLAIM_PARAMS, "limit": 4})]
        claimed += [row[2] for row in conn.execute(CLAIM_SQL, {**CLAIM_PARAMS, "limit": 2})]
        assert claimed == ["a1", "b1", "a2", "b2", "a3", "b3"]
        before, requeued = conn.execute(
            "WITH old AS (SELECT claim_key FROM sessions WHERE title = 'b1'),"
            " done AS (UPDATE sessions SET status = 'succeeded' WHERE title = 'b1')"
            " SELECT (SELECT claim_key FROM old), clock_timestamp()"
        ).fetchone()  # type: ignore[misc]
        (after,) = conn.execute(
            "UPDATE sessions SET status = 'queued' WHERE title = 'b1' RETURNING claim_key"
        ).fetchone()  # type: ignore[misc]
        assert after > before and after >= requeued
        # It comes after b's own queue (its clock moved on by b3), before a's backlog's rest.
        assert [row[2] for row in conn.execute(CLAIM_SQL, {**CLAIM_PARAMS, "limit": 2})] == [
            "a4",
            "b1",
        ]


def test_a_higher_priority_is_claimed_before_a_backlog_and_stays_fair_within_its_priority() -> None:
    """Owners a and b each queue a backlog at priority 0; then c queues one session at 10 and a
    two at 5: c's goes first, then a's two (a's backlog at 0 does not push them back: each
    priority has its own queue clock), then the backlogs in turns, as before."""
    with (
        fresh_database("ferryman_claim_priority") as url,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        conn.execute("INSERT INTO workers (id, pid, hostname) VALUES ('w:1', 1, 'test')")
        conn.execute(QUEUE, {"owner": "a", "title": "a", "n": 300, "priority": 0})
        conn.execute(QUEUE, {"owner": "b", "title": "b", "n": 300, "priority": 0})
        conn.execute(QUEUE, {"owner": "c", "title": "c", "n": 1, "priority": 10})
        conn.execute(QUEUE, {"owner": "a", "title": "high-a", "n": 2, "priority": 5})
        claimed = [row[2] for row in conn.execute(CLAIM_SQL, {**CLAIM_PARAMS, "limit": 5})]
        assert claimed == ["c1", "high-a1", "high-a2", "a1", "b1"]
