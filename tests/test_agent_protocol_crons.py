"""The Agent Protocol's crons through the official Python client, `langgraph-sdk`, against a
real server and a real worker: create, search, count, update and delete map onto the caller's
schedules; a cron's tick creates a thread that names its schedule; a thread's cron posts its
input to that thread; another owner's cron and thread are 404; a bad cron or zone is 422. A
cron is made due by writing its `next_run_at` in SQL, as tests/test_schedules.py does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import NotFoundError

from tests.support import (
    ServerProcess,
    StartWorker,
    assert_problem,
    client,
    create_owner_key,
    delete_schedules,
    query,
    ready,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

GRAPH = "ferryman"
FAST = {"FERRYMAN_SCHEDULE_POLL_INTERVAL": "0.2"}
CRON_FIELDS = {
    "cron_id",
    "assistant_id",
    "thread_id",
    "on_run_completed",
    "end_time",
    "schedule",
    "timezone",
    "created_at",
    "updated_at",
    "payload",
    "user_id",
    "next_run_date",
    "metadata",
    "enabled",
}


@pytest.fixture(autouse=True)
def no_cron_outlives_its_test(isolated_db: str) -> Iterator[None]:
    yield
    delete_schedules(isolated_db)


@pytest.fixture
async def worker(start_worker: StartWorker) -> None:
    """A worker that looks for due schedules five times a second."""
    await ready(start_worker(FAST))


def sdk_for(api: ServerProcess, key: str) -> LangGraphClient:
    return get_client(url=f"{api.url}/agent-protocol", api_key=key)


@pytest.fixture
async def sdk(api: ServerProcess, key: str) -> AsyncIterator[LangGraphClient]:
    lg = sdk_for(api, key)
    yield lg
    await lg.http.client.aclose()


def said(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


SCRIPTED = {"model": "scripted", "script": [{"text": "Report written."}]}


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def make_due(url: str, cron_id: str) -> None:
    at = datetime.now(UTC) - timedelta(seconds=1)
    await query(url, "UPDATE schedules SET next_run_at = %s WHERE id = %s", (at, cron_id))


async def wait_until(check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := await check()):
        assert time.monotonic() < deadline, f"not within {timeout}s"
        await asyncio.sleep(0.1)
    return found


async def test_create_search_count_update_and_delete(sdk: LangGraphClient) -> None:
    cron = await sdk.crons.create(
        GRAPH,
        schedule="30 2 * * *",
        timezone="Europe/Berlin",
        input=said("Write the nightly report."),
        context=SCRIPTED,
        metadata={"team": "night"},
    )
    assert set(cron) == CRON_FIELDS, cron
    assert cron["assistant_id"] == GRAPH and cron["thread_id"] is None
    assert cron["schedule"] == "30 2 * * *" and cron["timezone"] == "Europe/Berlin"
    assert cron["metadata"] == {"team": "night"} and cron["enabled"] is True
    assert cron["payload"]["input"] == said("Write the nightly report.")
    assert cron["on_run_completed"] == "delete"  # LangGraph's default for a cron's threads
    nxt = instant(cron["next_run_date"])
    assert nxt > datetime.now(UTC) and nxt.astimezone().minute == 30
    other = await sdk.crons.create(GRAPH, schedule="@hourly", input=said("hourly"))
    assert other["timezone"] == "UTC"

    found = await sdk.crons.search(metadata={"team": "night"})
    assert [c["cron_id"] for c in found] == [cron["cron_id"]]
    assert len(await sdk.crons.search(assistant_id=GRAPH)) == 2
    assert await sdk.crons.count() == 2
    assert await sdk.crons.count(metadata={"team": "night"}) == 1
    assert await sdk.crons.count(assistant_id="someone-else") == 0
    asc = await sdk.crons.search(sort_by="created_at", sort_order="asc")
    assert [c["cron_id"] for c in asc] == [cron["cron_id"], other["cron_id"]]
    picked = await sdk.crons.search(select=["cron_id", "schedule"], limit=1, offset=1)
    assert picked == [{"cron_id": cron["cron_id"], "schedule": "30 2 * * *"}]

    changed = await sdk.crons.update(cron["cron_id"], schedule="0 6 * * *", enabled=False)
    assert changed["schedule"] == "0 6 * * *" and changed["enabled"] is False
    assert changed["next_run_date"] is None and changed["metadata"] == {"team": "night"}
    resumed = await sdk.crons.update(cron["cron_id"], enabled=True, timezone="UTC")
    assert instant(resumed["next_run_date"]).hour == 6
    end = datetime.now(UTC) + timedelta(minutes=1)
    ending = await sdk.crons.update(cron["cron_id"], end_time=end)
    assert ending["end_time"] is not None and ending["next_run_date"] is None  # 06:00 is past it
    assert await sdk.crons.search(enabled=True, thread_id=None) != []

    await sdk.crons.delete(cron["cron_id"])
    assert [c["cron_id"] for c in await sdk.crons.search()] == [other["cron_id"]]
    with pytest.raises(NotFoundError):
        await sdk.crons.delete(cron["cron_id"])


async def test_a_bad_cron_or_zone_is_422_naming_it(api: ServerProcess, key: str) -> None:
    body = {"assistant_id": GRAPH, "input": said("x")}
    async with client(api.url, key) as http:
        for bad, code in (
            ({"schedule": "61 * * * *"}, "SCHEDULE_CRON_INVALID"),
            ({"schedule": "@daily", "timezone": "Mars/Olympus"}, "SCHEDULE_TIMEZONE_INVALID"),
        ):
            problem = assert_problem(
                await http.post("/agent-protocol/runs/crons", json={**body, **bad}), 422, code
            )
            assert problem["errors"][0]["field"] in ("cron", "timezone"), problem
        no_input = {"assistant_id": GRAPH, "schedule": "@daily"}
        assert_problem(
            await http.post("/agent-protocol/runs/crons", json=no_input), 422, "INPUT_NOT_SUPPORTED"
        )
        tid = (await http.post("/agent-protocol/threads", json={})).json()["thread_id"]
        for refused in (
            {"webhook": "https://example.com/hook"},
            {"context": {"model": "scripted"}},
            {"multitask_strategy": "interrupt"},
        ):
            path = f"/agent-protocol/threads/{tid}/runs/crons"
            thread_cron = {**body, "schedule": "@daily", **refused}
            assert_problem(await http.post(path, json=thread_cron), 501, "NOT_SERVED")
        assert (await http.post("/agent-protocol/runs/crons/search", json={})).json() == []


async def test_another_owners_cron_and_thread_are_not_found(
    api: ServerProcess, sdk: LangGraphClient, isolated_db: str
) -> None:
    _, other_key = create_owner_key(isolated_db)
    theirs = sdk_for(api, other_key)
    try:
        thread = await sdk.threads.create()
        cron = await sdk.crons.create_for_thread(
            thread["thread_id"], GRAPH, schedule="@daily", input=said("x")
        )
        with pytest.raises(NotFoundError):
            await theirs.crons.delete(cron["cron_id"])
        with pytest.raises(NotFoundError):
            await theirs.crons.update(cron["cron_id"], enabled=False)
        with pytest.raises(NotFoundError):
            await theirs.crons.create_for_thread(
                thread["thread_id"], GRAPH, schedule="@daily", input=said("x")
            )
        assert await theirs.crons.search() == [] and await theirs.crons.count() == 0
        assert (await sdk.crons.search())[0]["enabled"] is True
    finally:
        await theirs.http.client.aclose()


@pytest.mark.usefixtures("worker")
async def test_a_tick_creates_a_thread_that_names_its_schedule(
    api: ServerProcess, key: str, sdk: LangGraphClient, isolated_db: str
) -> None:
    cron = await sdk.crons.create(
        GRAPH,
        schedule="@daily",
        input=said("Write the nightly report."),
        context=SCRIPTED,
        on_run_completed="keep",
    )
    await make_due(isolated_db, cron["cron_id"])

    async def fired() -> list[dict[str, Any]]:
        return await query(
            isolated_db, "SELECT id FROM sessions WHERE schedule_id = %s", (cron["cron_id"],)
        )

    [row] = await wait_until(fired)
    thread_id = str(row["id"])
    run = (await wait_until(lambda: sdk.runs.list(thread_id)))[0]
    await sdk.runs.join(thread_id, run["run_id"])
    thread = await sdk.threads.get(thread_id)
    assert thread["metadata"]["graph_id"] == GRAPH
    assert thread["metadata"]["on_completion"] == "keep"
    assert [m["content"] for m in thread["values"]["messages"]] == [
        "Write the nightly report.",
        "Report written.",
    ]
    async with client(api.url, key) as http:
        session = (await http.get(f"/api/agent/{thread_id}")).json()
        assert session["schedule"]["id"] == cron["cron_id"]
        schedule = (await http.get(f"/api/schedules/{cron['cron_id']}")).json()
        assert schedule["lastFirings"][0]["sessionId"] == thread_id
    moved = (await sdk.crons.search())[0]["next_run_date"]
    assert instant(moved) > datetime.now(UTC)


@pytest.mark.usefixtures("worker")
async def test_a_threads_cron_posts_to_that_thread(
    api: ServerProcess, key: str, sdk: LangGraphClient, isolated_db: str
) -> None:
    thread = await sdk.threads.create()
    tid = thread["thread_id"]
    script = [{"text": "First."}, {"text": "Second."}]
    await sdk.runs.wait(
        tid, GRAPH, input=said("one"), context={"model": "scripted", "script": script}
    )
    cron = await sdk.crons.create_for_thread(
        tid, GRAPH, schedule="@daily", input=said("tick"), metadata={"from": "cron"}
    )
    assert cron["thread_id"] == tid and cron["on_run_completed"] is None
    async with client(api.url, key) as http:
        schedule = (await http.get(f"/api/schedules/{cron['cron_id']}")).json()
        assert schedule["sessionId"] == tid and schedule["overlap"] == "skip"
    await make_due(isolated_db, cron["cron_id"])

    async def two_runs() -> list[dict[str, Any]]:
        runs = await sdk.runs.list(tid)
        return runs if len(runs) == 2 and runs[0]["status"] == "success" else []

    newest = (await wait_until(two_runs))[0]
    assert newest["metadata"]["from"] == "cron"
    state = await sdk.threads.get_state(tid)
    assert [m["content"] for m in state["values"]["messages"]] == [
        "one",
        "First.",
        "tick",
        "Second.",
    ]
    rows = await query(
        isolated_db,
        "SELECT data FROM session_events WHERE session_id = %s AND type = 'user_message'"
        " ORDER BY seq DESC LIMIT 1",
        (tid,),
    )
    assert rows[0]["data"]["schedule"]["id"] == cron["cron_id"]
    # The thread's cron goes with the thread.
    await sdk.threads.delete(tid)
    assert await sdk.crons.count() == 0


async def test_a_native_schedule_bound_to_a_session(
    api: ServerProcess, key: str, isolated_db: str
) -> None:
    """`sessionId` natively: the caller's session only, and no session field beside it."""
    _, other_key = create_owner_key(isolated_db)
    async with client(api.url, key) as mine, client(api.url, other_key) as theirs:
        sid = (await mine.post("/api/agent", json={})).json()["id"]
        body = {"cron": "@daily", "prompt": "tick", "sessionId": sid}
        assert_problem(await theirs.post("/api/schedules", json=body), 404, "SESSION_NOT_FOUND")
        bad = {**body, "sessionId": "not-a-uuid"}
        assert_problem(await mine.post("/api/schedules", json=bad), 404, "SESSION_NOT_FOUND")
        with_model = {**body, "model": "scripted"}
        assert_problem(await mine.post("/api/schedules", json=with_model), 422, "VALIDATION_ERROR")
        created = await mine.post("/api/schedules", json=body)
        assert created.status_code == 201, created.text
        schedule = created.json()
        assert schedule["sessionId"] == sid and schedule["endTime"] is None
        patched = await mine.patch(f"/api/schedules/{schedule['id']}", json={"prompt": "tock"})
        assert patched.json()["sessionId"] == sid and patched.json()["prompt"] == "tock"
        assert (await mine.delete(f"/api/agent/{sid}")).status_code in (200, 204)
        gone = await mine.get(f"/api/schedules/{schedule['id']}")
        assert_problem(gone, 404, "SCHEDULE_NOT_FOUND")
