"""The per-owner and per-key limits of docs/tenants.md: running sessions per owner held at the
claim (race-safe across workers, and no other owner starved), queued sessions per owner and
requests a minute per key refused with 429 and `Retry-After`, priority from a key's policy."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from app.store.claims import claim
from app.store.keys import hash_key, new_key
from tests.support import (
    QUEUE,
    ServerProcess,
    WorkerProcess,
    assert_problem,
    client,
    fresh_database,
    running,
    stop_all,
)


def running_by_owner(conn: psycopg.Connection) -> dict[str, int]:
    rows = conn.execute(
        "SELECT owner_id, count(*) FROM sessions WHERE status = 'running' GROUP BY owner_id"
    ).fetchall()
    return {owner: count for owner, count in rows}


async def test_an_owner_at_its_running_limit_is_passed_over_not_the_others() -> None:
    """Owner a queues 200, b 3, with at most 2 running an owner: a batch claim takes two of
    a's and two of b's, however the keys fall; once one of a's ends, a gets one more."""
    with fresh_database("ferryman_limit_claim") as url, psycopg.connect(url, autocommit=True) as c:
        c.execute("INSERT INTO workers (id, pid, hostname) VALUES ('w:1', 1, 'test')")
        c.execute(QUEUE, {"owner": "a", "title": "a", "n": 200, "priority": 0})
        c.execute(QUEUE, {"owner": "b", "title": "b", "n": 3, "priority": 0})
        async with await psycopg.AsyncConnection.connect(
            url, autocommit=True, row_factory=dict_row
        ) as conn:
            rows = await claim(conn, "w:1", 1, 10, limit=8, max_running=2)
            assert sorted(r["title"] for r in rows) == ["a1", "a2", "b1", "b2"]
            assert await claim(conn, "w:1", 1, 10, limit=8, max_running=2) == []
            c.execute("UPDATE sessions SET status = 'succeeded' WHERE title = 'a1'")
            rows = await claim(conn, "w:1", 1, 10, limit=8, max_running=2)
            assert [r["title"] for r in rows] == ["a3"]
            # Without the limit, the claim is as before.
            rows = await claim(conn, "w:1", 1, 10, limit=2)
            assert [r["title"] for r in rows] == ["b3", "a4"]


async def test_concurrent_claimers_never_pass_an_owners_running_limit() -> None:
    """Eight claimers at once, each claiming batches again and again: no owner ever has more
    than its 3 running, and every owner gets its 3."""
    owners, limit = ["a", "b", "c", "d"], 3
    with fresh_database("ferryman_limit_race") as url, psycopg.connect(url, autocommit=True) as c:
        for n in range(8):
            c.execute("INSERT INTO workers (id, pid, hostname) VALUES (%s, 1, 'test')", (f"w:{n}",))
        for owner in owners:
            c.execute(QUEUE, {"owner": owner, "title": owner, "n": 40, "priority": 0})

        async def claimer(n: int) -> int:
            async with await psycopg.AsyncConnection.connect(
                url, autocommit=True, row_factory=dict_row
            ) as conn:
                taken = 0
                for _ in range(10):
                    taken += len(await claim(conn, f"w:{n}", 1, 60, limit=4, max_running=limit))
                    await asyncio.sleep(0)
                return taken

        taken = await asyncio.gather(*(claimer(n) for n in range(8)))
        assert sum(taken) == len(owners) * limit
        assert running_by_owner(c) == dict.fromkeys(owners, limit)


ADMIN_TOKEN = "admin-" + uuid.uuid4().hex
METRICS_TOKEN = "metrics-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def limited() -> Iterator[tuple[ServerProcess, str]]:
    """A server in keys mode with every limit set low."""
    with fresh_database("ferryman_limits_api") as url:
        env = {
            "FERRYMAN_AUTH": "keys",
            "FERRYMAN_OWNER_MAX_QUEUED": "3",
            "FERRYMAN_OWNER_MAX_RUNNING": "1",
            "FERRYMAN_KEY_CREATES_PER_MINUTE": "1000",
            "FERRYMAN_KEY_MESSAGES_PER_MINUTE": "1000",
            "FERRYMAN_ADMIN_TOKEN": ADMIN_TOKEN,
            "FERRYMAN_METRICS_TOKEN": METRICS_TOKEN,
        }
        with running(ServerProcess(url, env=env)) as server:
            yield server, url


async def scrape(server: ServerProcess) -> str:
    """/metrics with the metrics token (keys mode refuses tenants' keys there)."""
    async with client(server.url, METRICS_TOKEN) as http:
        response = await http.get("/metrics")
    assert response.status_code == 200, response.text
    return response.text


def make_key(url: str, policy: dict[str, object] | None = None) -> tuple[str, str]:
    owner, key = f"owner-{uuid.uuid4().hex[:12]}", new_key()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO api_keys (id, owner_id, name, prefix, key_hash, policy)"
            " VALUES (%s, %s, 'test', %s, %s, %s)",
            (uuid.uuid4(), owner, key[:10], hash_key(key), Jsonb(policy or {})),
        )
    return owner, key


async def test_an_owners_queue_is_full_at_create_and_at_a_message_that_would_queue(
    limited: tuple[ServerProcess, str],
) -> None:
    server, url = limited
    _, key = make_key(url)
    _, other = make_key(url)
    async with client(server.url, key) as http, client(server.url, other) as them:
        idle = (await http.post("/api/agent", json={})).json()
        for n in range(3):
            assert (await http.post("/api/agent", json={"prompt": f"p{n}"})).status_code == 201
        refused = await http.post("/api/agent", json={"prompt": "one more"})
        body = assert_problem(refused, 429, "OWNER_QUEUE_FULL")
        assert body["limit"] == 3 and int(refused.headers["Retry-After"]) >= 1
        # An idle session is not queued: creating one is fine; its first message would queue.
        assert (await http.post("/api/agent", json={})).status_code == 201
        message = await http.post(f"/api/agent/{idle['id']}/messages", json={"text": "go"})
        assert_problem(message, 429, "OWNER_QUEUE_FULL")
        # The Agent Protocol's runs queue too.
        run = await http.post(
            "/agent-protocol/runs", json={"assistant_id": "agent", "input": {"messages": []}}
        )
        assert_problem(run, 429, "OWNER_QUEUE_FULL")
        # Another owner's queue is its own.
        assert (await them.post("/api/agent", json={"prompt": "mine"})).status_code == 201
        metrics = await scrape(server)
        assert 'ferryman_limit_refusals_total{code="OWNER_QUEUE_FULL"}' in metrics


async def test_a_keys_creates_and_messages_a_minute_with_its_policys_override(
    limited: tuple[ServerProcess, str],
) -> None:
    server, url = limited
    _, key = make_key(url, {"createsPerMinute": 2, "messagesPerMinute": 1, "priority": 7})
    await minute_with_time_left()
    async with client(server.url, key) as http:
        first = (await http.post("/api/agent", json={})).json()
        assert first["priority"] == 7  # the key's policy's priority
        second = await http.post("/api/agent", json={"priority": -3})
        assert second.json()["priority"] == -3
        refused = await http.post("/api/agent", json={})
        body = assert_problem(refused, 429, "RATE_LIMITED")
        assert body["limit"] == 2 and 1 <= int(refused.headers["Retry-After"]) <= 60
        # An Agent Protocol thread is a create too; a message has its own count.
        assert_problem(await http.post("/agent-protocol/threads", json={}), 429, "RATE_LIMITED")
        sid = first["id"]
        assert (
            await http.post(f"/api/agent/{sid}/messages", json={"text": "a"})
        ).status_code == 202
        again = await http.post(f"/api/agent/{sid}/messages", json={"text": "b"})
        assert_problem(again, 429, "RATE_LIMITED")
    with psycopg.connect(url) as conn:
        (count,) = conn.execute("SELECT count(*) FROM rate_windows").fetchone()  # type: ignore[misc]
    assert count >= 2


async def test_priority_is_bounded_and_shown_only_when_set(
    limited: tuple[ServerProcess, str],
) -> None:
    server, url = limited
    _, key = make_key(url)
    async with client(server.url, key) as http:
        assert_problem(
            await http.post("/api/agent", json={"priority": 101}), 422, "VALIDATION_ERROR"
        )
        assert "priority" not in (await http.post("/api/agent", json={})).json()


async def minute_with_time_left() -> None:
    """Until the database clock's minute has 15 s left: a test's requests then fall in one
    rate window."""
    while True:
        await asyncio.sleep(0.2)
        if time.time() % 60 < 45:
            return


async def test_the_keys_api_creates_lists_updates_and_revokes_keys_with_their_policy(
    limited: tuple[ServerProcess, str],
) -> None:
    server, url = limited
    owner = f"api-{uuid.uuid4().hex[:8]}"
    async with client(server.url, ADMIN_TOKEN) as admin:
        created = await admin.post(
            "/api/keys",
            json={"owner": owner, "name": "ci", "policy": {"priority": 9, "createsPerMinute": 50}},
        )
        assert created.status_code == 201, created.text
        made = created.json()
        key, key_id = made["key"], made["id"]
        assert made["policy"] == {"priority": 9, "createsPerMinute": 50}
        assert made["ownerId"] == owner and made["revokedAt"] is None
        with psycopg.connect(url) as conn:
            (stored,) = conn.execute(
                "SELECT key_hash FROM api_keys WHERE id = %s", (key_id,)
            ).fetchone()  # type: ignore[misc]
        assert stored == hash_key(key)  # only its digest is kept
        listed = (await admin.get("/api/keys", params={"owner": owner})).json()["keys"]
        assert [k["id"] for k in listed] == [key_id] and "key" not in listed[0]

        async with client(server.url, key) as http:
            assert (await http.post("/api/agent", json={})).json()["priority"] == 9
            # A key is no admin token, and the admin token is no key.
            assert_problem(await http.get("/api/keys"), 401, "INVALID_API_KEY")
        assert_problem(await admin.get("/api/agent"), 401, "INVALID_API_KEY")

        patched = await admin.patch(
            f"/api/keys/{key_id}", json={"name": "ci2", "policy": {"priority": None}}
        )
        assert patched.status_code == 200, patched.text
        assert patched.json()["policy"] == {"createsPerMinute": 50}
        assert patched.json()["name"] == "ci2"
        async with client(server.url, key) as http:
            assert "priority" not in (await http.post("/api/agent", json={})).json()

        bad = await admin.post("/api/keys", json={"owner": owner, "policy": {"priority": 500}})
        assert_problem(bad, 422, "VALIDATION_ERROR")
        unknown = await admin.post("/api/keys", json={"owner": owner, "policy": {"what": 1}})
        assert_problem(unknown, 422, "VALIDATION_ERROR")

        assert (await admin.delete(f"/api/keys/{key_id}")).status_code == 204
        assert_problem(await admin.delete(f"/api/keys/{key_id}"), 404, "KEY_NOT_FOUND")
        assert_problem(await admin.patch(f"/api/keys/{key_id}", json={}), 404, "KEY_NOT_FOUND")
        assert_problem(await admin.delete("/api/keys/nope"), 404, "KEY_NOT_FOUND")
        async with client(server.url, key) as http:
            assert_problem(await http.get("/api/agent"), 401, "INVALID_API_KEY")
    async with client(server.url) as anonymous:
        assert_problem(await anonymous.get("/api/keys"), 401, "AUTH_REQUIRED")


async def test_without_an_admin_token_the_keys_api_is_not_there() -> None:
    with fresh_database("ferryman_keys_off") as url:
        _, key = make_key(url)
        with running(ServerProcess(url, env={"FERRYMAN_AUTH": "keys"})) as server:
            async with client(server.url, key) as http:
                assert_problem(await http.get("/api/keys"), 404, "NOT_FOUND")
                made = await http.post("/api/keys", json={"owner": "someone"})
                assert_problem(made, 404, "NOT_FOUND")


async def test_a_queued_session_says_it_waits_on_its_owners_running_limit(
    limited: tuple[ServerProcess, str],
) -> None:
    """No worker runs here: a session set running by hand stands for one a worker holds. The
    owner's queued sessions then say why they wait, in a GET and in the list; /metrics, the
    operator's alone (its token), counts the queues by owner."""
    server, url = limited
    owner, key = make_key(url)
    async with client(server.url, key) as http:
        first = (await http.post("/api/agent", json={"prompt": "one"})).json()
        second = (await http.post("/api/agent", json={"prompt": "two"})).json()
        assert "waitingFor" not in (await http.get(f"/api/agent/{second['id']}")).json()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE sessions SET status = 'running' WHERE id = %s", (first["id"],))
        got = (await http.get(f"/api/agent/{second['id']}")).json()
        assert got["waitingFor"] == {"reason": "ownerRunningLimit", "running": 1, "limit": 1}
        listed = {s["id"]: s for s in (await http.get("/api/agent")).json()["sessions"]}
        assert listed[second["id"]]["waitingFor"]["reason"] == "ownerRunningLimit"
        assert "waitingFor" not in listed[first["id"]]
    metrics = await scrape(server)
    assert f'ferryman_owner_queued_sessions{{owner="{owner}"}}' in metrics


async def test_metrics_name_the_owners_with_queues_in_local_mode(server: ServerProcess) -> None:
    async with client(server.url) as http:
        await http.post("/api/agent", json={"prompt": "waits: no worker here"})
        metrics = (await http.get("/metrics")).text
    depth = next(
        line
        for line in metrics.splitlines()
        if line.startswith('ferryman_owner_queued_sessions{owner="local"}')
    )
    assert float(depth.split()[-1]) >= 1
    assert 'ferryman_owner_queued_oldest_seconds{owner="local"}' in metrics


def test_workers_hold_each_owner_to_its_running_limit() -> None:
    """Two worker processes of 4 slots, FERRYMAN_OWNER_MAX_RUNNING=2: owner a queues 6 slow
    sessions, then b queues 2. From the runs' own start and end events, a never has more than
    2 running at once, and b's start before a's backlog is through, though slots were free."""
    script = Jsonb([{"text": "done", "delayMs": 600}])
    queue = (
        "WITH s AS (INSERT INTO sessions (id, owner_id, title, status, model, prompt, script,"
        " last_seq) SELECT gen_random_uuid(), %s, %s || n, 'queued', 'scripted', 'go', %s, 1"
        " FROM generate_series(1, %s) AS n RETURNING id)"
        " INSERT INTO session_events (session_id, seq, attempt, type, data)"
        ' SELECT id, 1, 0, \'user_message\', \'{"text": "go", "delivery": "queued"}\' FROM s'
    )
    with (
        fresh_database("ferryman_limit_workers") as url,
        psycopg.connect(url, autocommit=True) as c,
    ):
        c.execute(queue, ("a", "a", script, 6))
        c.execute(queue, ("b", "b", script, 2))
        env = {"FERRYMAN_OWNER_MAX_RUNNING": "2", "FERRYMAN_LOG_LEVEL": "warning"}
        workers = [WorkerProcess(url, env=env, concurrency=4).start() for _ in range(2)]
        deadline = time.monotonic() + 90
        left = "SELECT count(*) FROM sessions WHERE status <> 'succeeded'"
        try:
            while c.execute(left).fetchone() != (0,):
                assert time.monotonic() < deadline, c.execute(left).fetchone()
                time.sleep(0.1)
        finally:
            stop_all(workers)
        spans = c.execute(
            "SELECT s.owner_id, min(e.created_at) FILTER (WHERE e.type = 'session_start'),"
            " max(e.created_at) FILTER (WHERE e.type = 'session_end')"
            " FROM sessions s JOIN session_events e ON e.session_id = s.id GROUP BY s.id"
        ).fetchall()
    for owner in ("a", "b"):
        edges = sorted(
            [(start, 1) for o, start, _ in spans if o == owner]
            + [(end, -1) for o, _, end in spans if o == owner]
        )
        at_once = most = 0
        for _, step in edges:
            at_once += step
            most = max(most, at_once)
        assert most <= 2, (owner, most)
    last_a_start = max(start for o, start, _ in spans if o == "a")
    assert all(start < last_a_start for o, start, _ in spans if o == "b")


async def test_protocol_threads_take_their_keys_priority(
    limited: tuple[ServerProcess, str],
) -> None:
    server, url = limited
    _, key = make_key(url, {"priority": 6})
    async with client(server.url, key) as http:
        thread = (await http.post("/agent-protocol/threads", json={})).json()
        session = (await http.get(f"/api/agent/{thread['thread_id']}")).json()
        assert session["priority"] == 6


async def test_the_keys_api_takes_the_scopes_of_a_policy(
    limited: tuple[ServerProcess, str],
) -> None:
    """A key made over the keys API with `tools` and `models` is held to them (docs/tenants.md
    "What a key may use"); a bad scope entry is 422 and makes no key."""
    server, _ = limited
    owner = f"scoped-{uuid.uuid4().hex[:8]}"
    policy = {"tools": ["put_note"], "models": ["scripted"], "priority": 2}
    async with client(server.url, ADMIN_TOKEN) as admin:
        created = await admin.post("/api/keys", json={"owner": owner, "policy": policy})
        assert created.status_code == 201, created.text
        assert created.json()["policy"] == policy
        bad = await admin.post("/api/keys", json={"owner": owner, "policy": {"tools": ["a b"]}})
        assert_problem(bad, 422, "VALIDATION_ERROR")
        listed = (await admin.get("/api/keys", params={"owner": owner})).json()["keys"]
        assert len(listed) == 1
    async with client(server.url, created.json()["key"]) as http:
        ok = await http.post("/api/agent", json={"prompt": "hi", "tools": ["put_note"]})
        assert ok.status_code == 201, ok.text
        assert ok.json()["priority"] == 2
        wider = await http.post("/api/agent", json={"prompt": "hi", "tools": ["sleep"]})
        assert assert_problem(wider, 403, "TOOL_NOT_ALLOWED")["tools"] == ["sleep"]
