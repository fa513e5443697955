"""The API's creates, group-committed (app/creates.py): creates asked for at once commit
together, one statement each, with gap-free owner ids whose `session_created` views are what a
GET answers; an Idempotency-Key used twice in one transaction is the same session (or 409); a
create that fails is sent again alone, and the others commit."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
import psycopg

from app.creates import SessionCreates
from app.db.pool import Database, SessionLimits
from app.store import sessions as session_store
from app.store.sessions import NewSession
from tests.support import (
    ServerProcess,
    assert_problem,
    client,
    create_owner_key,
    owner_backlog,
    query,
    transcript,
)


def new(prompt: str | None = "hi", title: str = "t") -> NewSession:
    return NewSession(prompt, title, "scripted", [{"text": "Done."}], None, {})


async def test_creates_at_once_share_a_transaction(db: Database) -> None:
    owner = f"o-{uuid.uuid4()}"
    creates = SessionCreates(db)
    rows = await asyncio.gather(
        *(creates.create(owner, new(title=f"s{i}"), f"k{i}") for i in range(20)),
        creates.create(owner, new(None, "idle"), None),
    )
    assert all(row is not None for row in rows)
    txs = await query(
        db.url,
        "SELECT count(DISTINCT xmin::text) AS n FROM sessions WHERE owner_id = %s",
        (owner,),
    )
    assert txs[0]["n"] < 21  # at most two transactions in flight: the rest waited together
    events = await query(
        db.url,
        "SELECT id, session_id, data FROM owner_events WHERE owner_id = %s ORDER BY id",
        (owner,),
    )
    assert [e["id"] for e in events] == list(range(1, 22))
    assert {e["session_id"] for e in events} == {row["id"] for row in rows if row}
    opening = await query(
        db.url,
        "SELECT s.status, s.last_seq, e.seq, e.data FROM sessions s"
        " LEFT JOIN session_events e ON e.session_id = s.id WHERE s.owner_id = %s",
        (owner,),
    )
    queued = [r for r in opening if r["status"] == "queued"]
    assert len(queued) == 20
    assert all(r["seq"] == r["last_seq"] == 1 for r in queued)
    assert all(r["data"] == {"text": "hi", "delivery": "queued"} for r in queued)
    idle = [r for r in opening if r["status"] == "idle"]
    assert len(idle) == 1 and idle[0]["seq"] is None and idle[0]["last_seq"] == 0


async def test_a_key_taken_in_the_same_transaction_is_a_replay(db: Database) -> None:
    owner = f"o-{uuid.uuid4()}"
    creates = SessionCreates(db)
    rows = await asyncio.gather(*(creates.create(owner, new(), "same") for _ in range(8)))
    made = [row for row in rows if row is not None]
    assert len(made) == 1
    async with db.connection() as conn:
        replayed = await session_store.replay_idempotent(conn, owner, "same", new().fingerprint())
    assert replayed is not None and replayed["id"] == made[0]["id"]
    count = await query(db.url, "SELECT count(*) AS n FROM sessions WHERE owner_id = %s", (owner,))
    assert count[0]["n"] == 1


async def test_a_failing_create_fails_alone(db: Database) -> None:
    owner = f"o-{uuid.uuid4()}"
    creates = SessionCreates(db)
    results = await asyncio.gather(
        *(creates.create(owner, new(title=f"s{i}"), None) for i in range(6)),
        creates.create(owner, new(title="nul\x00"), None),  # text PostgreSQL cannot hold
        return_exceptions=True,
    )
    assert isinstance(results[-1], psycopg.DataError)
    assert all(isinstance(r, dict) for r in results[:-1])
    events = await query(
        db.url, "SELECT id FROM owner_events WHERE owner_id = %s ORDER BY id", (owner,)
    )
    assert [e["id"] for e in events] == list(range(1, 7))


async def test_concurrent_requests_keep_every_guarantee(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    shared = f"shared-{uuid.uuid4()}"
    body = {"prompt": "race", "title": "raced"}

    async def post(http: httpx.AsyncClient, body: dict[str, Any], idem: str) -> httpx.Response:
        return await http.post("/api/agent", json=body, headers={"Idempotency-Key": idem})

    async with client(server.url, key) as http:
        responses = await asyncio.gather(
            *(post(http, {"prompt": f"p{i}"}, f"k-{uuid.uuid4()}") for i in range(40)),
            *(post(http, body, shared) for _ in range(6)),
        )
        other = await post(http, {"prompt": "another body"}, shared)
        assert_problem(other, 409, "IDEMPOTENCY_KEY_REUSED")
        distinct, raced = responses[:40], responses[40:]
        assert all(r.status_code == 201 for r in distinct), [r.text for r in distinct]
        assert sorted(r.status_code for r in raced) == [200] * 5 + [201]
        assert len({r.json()["id"] for r in raced}) == 1
        assert all(r.headers["location"] == f"/api/agent/{r.json()['id']}" for r in responses)
        created = [e for e in await owner_backlog(http, "0") if e.event == "session_created"]
        assert len(created) == 41
        sessions = [json.loads(e.data)["data"]["session"] for e in created]
        views = {view["id"]: view for view in sessions}
        answered = {r.json()["id"]: r.json() for r in responses if r.status_code == 201}
        # The view on the owner feed is the one the create answered (the worker may have run
        # the session since, so not a GET's).
        assert views == answered
        ids = [int(e.id) for e in created]
        assert ids == sorted(ids) and len(set(ids)) == 41
        sample = distinct[0].json()
        assert sample["lastSeq"] == 1 and sample["status"] == "queued"
        events = await transcript(http, sample["id"])
        assert events[0]["seq"] == 1 and events[0]["type"] == "user_message"


async def test_another_owner_never_sees_them(
    server: ServerProcess, owner_key: tuple[str, str], database_url: str
) -> None:
    _, key_a = owner_key
    _, key_b = create_owner_key(database_url)
    async with client(server.url, key_a) as a, client(server.url, key_b) as b:
        made = await asyncio.gather(
            *(a.post("/api/agent", json={"prompt": "mine"}) for _ in range(10)),
            *(b.post("/api/agent", json={"prompt": "theirs"}) for _ in range(10)),
        )
        assert all(r.status_code == 201 for r in made)
        for response in made[:10]:
            assert (await b.get(f"/api/agent/{response.json()['id']}")).status_code == 404
        b_created = [e for e in await owner_backlog(b, "0") if e.event == "session_created"]
        assert len(b_created) == 10


async def test_the_databases_trouble_fails_a_batch_at_once(db: Database) -> None:
    """A lock timeout is every create's: the batch's creates fail together, after one wait,
    not one each (a held lock would otherwise hold the last request for a timeout per create)."""
    owner = f"o-{uuid.uuid4()}"
    limited = Database(db.url, min_size=1, max_size=2, limits=SessionLimits(lock_timeout=0.5))
    await limited.pool.open(wait=True)
    try:
        async with db.connection() as holder:
            await holder.execute("BEGIN")
            await holder.execute("LOCK TABLE sessions IN EXCLUSIVE MODE")
            try:
                creates = SessionCreates(limited, concurrency=1)
                # The first create goes alone; the five asked meanwhile go together after it.
                clock = asyncio.get_running_loop().time
                started = clock()
                results = await asyncio.gather(
                    *(creates.create(owner, new(title=f"s{i}"), None) for i in range(6)),
                    return_exceptions=True,
                )
                took = clock() - started
            finally:
                await holder.execute("ROLLBACK")
    finally:
        await limited.close()
    assert all(isinstance(r, psycopg.errors.LockNotAvailable) for r in results), results
    assert took < 5 * 0.5, took  # two waits (the first alone, then the rest), not six
