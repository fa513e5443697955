"""Schedules (SPEC section 12): CRUD over HTTP, owner isolation and validation on the module's
API server; and firings through real `ferryman worker` processes: once per tick across two
workers, overlap `skip` and `queue`, one catch-up after downtime (or none), a deleted schedule
firing no more. A schedule is made due in the past by writing its `next_run_at` in SQL, as
downtime would leave it."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from app.cron import parse
from tests.support import (
    TERMINAL,
    ServerProcess,
    StartWorker,
    assert_problem,
    client,
    create_owner_key,
    delete_schedules,
    query,
    ready,
    wait_for_status,
)

# Workers that look for due schedules five times a second.
FAST = {"FERRYMAN_SCHEDULE_POLL_INTERVAL": "0.2"}
SCHEDULE_FIELDS = {
    "id",
    "ownerId",
    "cron",
    "timezone",
    "enabled",
    "overlap",
    "title",
    "prompt",
    "model",
    "instructions",
    "modelSettings",
    "tools",
    "approvalRequired",
    "metadata",
    "assistant",
    "sessionId",
    "endTime",
    "nextRunAt",
    "pendingTick",
    "lastFirings",
    "createdAt",
    "updatedAt",
}


@pytest.fixture(autouse=True)
def no_schedule_outlives_its_test(isolated_db: str) -> Iterator[None]:
    yield
    delete_schedules(isolated_db)


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def create_schedule(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await http.post("/api/schedules", json={"prompt": "nightly report", **body})
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    assert response.headers["Location"] == f"/api/schedules/{created['id']}"
    return created


async def fired(url: str, schedule_id: str) -> list[dict[str, Any]]:
    """The sessions the schedule fired, oldest tick first."""
    return await query(
        url,
        "SELECT id, status, schedule_fired_at, created_at, updated_at FROM sessions"
        " WHERE schedule_id = %s ORDER BY schedule_fired_at",
        (schedule_id,),
    )


async def wait_fired(url: str, schedule_id: str, count: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while len(await fired(url, schedule_id)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} sessions in {timeout}s"
        await asyncio.sleep(0.1)


async def make_due(url: str, schedule_id: str, at: datetime) -> None:
    await query(url, "UPDATE schedules SET next_run_at = %s WHERE id = %s", (at, schedule_id))


async def test_create_get_list_patch_and_delete(api: ServerProcess, key: str) -> None:
    async with client(api.url, key) as http:
        before = datetime.now(UTC)
        created = await create_schedule(
            http,
            cron="30 2 * * *",
            timezone="Europe/Berlin",
            title="Report",
            instructions="Be brief.",
            tools=["get_note"],
            metadata={"team": "ops"},
        )
        assert set(created) == SCHEDULE_FIELDS
        assert created["enabled"] is True and created["overlap"] == "skip"
        assert (created["title"], created["instructions"]) == ("Report", "Be brief.")
        assert (created["tools"], created["metadata"]) == (["get_note"], {"team": "ops"})
        assert created["model"] == "scripted" and created["assistant"] is None
        assert created["lastFirings"] == [] and created["pendingTick"] is None
        expected = parse("30 2 * * *", "Europe/Berlin", before).next_after(before)
        assert instant(created["nextRunAt"]) == expected
        sid = created["id"]
        assert (await http.get(f"/api/schedules/{sid}")).json() == created

        other = await create_schedule(http, cron="@hourly")
        assert other["timezone"] == "UTC" and other["tools"] is None
        first = (await http.get("/api/schedules", params={"limit": 1})).json()
        assert [s["id"] for s in first["schedules"]] == [other["id"]]
        rest = await http.get(
            "/api/schedules", params={"limit": 1, "pageToken": first["nextPageToken"]}
        )
        assert [s["id"] for s in rest.json()["schedules"]] == [sid]
        assert rest.json()["nextPageToken"] is None

        paused = (await http.patch(f"/api/schedules/{sid}", json={"enabled": False})).json()
        assert paused["enabled"] is False and paused["nextRunAt"] is None
        assert paused["tools"] == ["get_note"]  # the definition is left alone
        resumed = (await http.patch(f"/api/schedules/{sid}", json={"enabled": True})).json()
        assert instant(resumed["nextRunAt"]) > datetime.now(UTC)
        changed = await http.patch(
            f"/api/schedules/{sid}",
            json={"cron": "0 9 * * 1-5", "timezone": "America/New_York", "tools": None},
        )
        assert changed.status_code == 200, changed.text
        body = changed.json()
        assert body["tools"] is None and body["instructions"] == "Be brief."
        local = instant(body["nextRunAt"]).astimezone(
            parse("* * * * *", "America/New_York", before).zone
        )
        assert (local.hour, local.minute) == (9, 0) and local.weekday() < 5
        untitled = (await http.patch(f"/api/schedules/{sid}", json={"title": None})).json()
        assert untitled["title"] is None and untitled["nextRunAt"] == body["nextRunAt"]

        assert (await http.delete(f"/api/schedules/{sid}")).status_code == 204
        assert_problem(await http.get(f"/api/schedules/{sid}"), 404, "SCHEDULE_NOT_FOUND")
        assert_problem(await http.delete(f"/api/schedules/{sid}"), 404, "SCHEDULE_NOT_FOUND")
        listed = (await http.get("/api/schedules")).json()["schedules"]
        assert [s["id"] for s in listed] == [other["id"]]


async def test_a_bad_cron_or_zone_is_422_naming_it(api: ServerProcess, key: str) -> None:
    async with client(api.url, key) as http:
        for cron in ("61 * * * *", "* * *", "0 0 31 2 *", "every day", ""):
            body = assert_problem(
                await http.post("/api/schedules", json={"cron": cron, "prompt": "x"}),
                422,
                "SCHEDULE_CRON_INVALID",
            )
            assert body["errors"][0]["field"] == "cron", body
        for zone in ("Mars/Olympus", "../../etc/passwd", "CEST"):
            body = assert_problem(
                await http.post(
                    "/api/schedules", json={"cron": "@daily", "timezone": zone, "prompt": "x"}
                ),
                422,
                "SCHEDULE_TIMEZONE_INVALID",
            )
            assert zone in body["detail"] and body["errors"][0]["field"] == "timezone"
        # The session fields are checked as a create checks them.
        for bad in (
            {"overlap": "sometimes"},
            {"prompt": ""},
            {"model": "gpt-4"},
            {"tools": ["no_such_tool"]},
            {"unknown": 1},
        ):
            body = {"cron": "@daily", "prompt": "x", **bad}
            assert_problem(await http.post("/api/schedules", json=body), 422, "VALIDATION_ERROR")
        no_prompt = await http.post("/api/schedules", json={"cron": "@daily"})
        assert_problem(no_prompt, 422, "VALIDATION_ERROR")
        missing = {"cron": "@daily", "prompt": "x", "assistantId": "not-an-id"}
        assert_problem(await http.post("/api/schedules", json=missing), 404, "ASSISTANT_NOT_FOUND")

        sid = (await create_schedule(http, cron="@daily"))["id"]
        for patch, code in (
            ({"cron": "61 * * * *"}, "SCHEDULE_CRON_INVALID"),
            ({"timezone": "Nowhere"}, "SCHEDULE_TIMEZONE_INVALID"),
            ({"cron": None}, "VALIDATION_ERROR"),
            ({}, "VALIDATION_ERROR"),
            ({"tools": ["no_such_tool"]}, "VALIDATION_ERROR"),
        ):
            assert_problem(await http.patch(f"/api/schedules/{sid}", json=patch), 422, code)
        assert (await http.get(f"/api/schedules/{sid}")).json()["cron"] == "@daily"


async def test_another_owners_schedule_is_not_found(
    api: ServerProcess, key: str, isolated_db: str
) -> None:
    _, other_key = create_owner_key(isolated_db)
    async with client(api.url, key) as mine, client(api.url, other_key) as theirs:
        sid = (await create_schedule(mine, cron="@daily"))["id"]
        for response in (
            await theirs.get(f"/api/schedules/{sid}"),
            await theirs.patch(f"/api/schedules/{sid}", json={"enabled": False}),
            await theirs.delete(f"/api/schedules/{sid}"),
            await theirs.get("/api/schedules/not-a-uuid"),
        ):
            assert_problem(response, 404, "SCHEDULE_NOT_FOUND")
        assert (await theirs.get("/api/schedules")).json()["schedules"] == []
        assert (await mine.get(f"/api/schedules/{sid}")).json()["enabled"] is True


async def test_each_tick_fires_once_across_two_workers(
    api: ServerProcess, key: str, isolated_db: str, start_worker: StartWorker
) -> None:
    """Every second, overlap `allow`: two workers poll five times a second each, and every
    tick has exactly one session; once deleted, the schedule fires no more."""
    workers = [start_worker(FAST), start_worker(FAST)]
    await ready(*workers)
    async with client(api.url, key) as http:
        schedule = await create_schedule(http, cron="* * * * * *", overlap="allow", title="tick")
        sid = schedule["id"]
        await wait_fired(isolated_db, sid, 6)
        assert (await http.delete(f"/api/schedules/{sid}")).status_code == 204
        sessions = await fired(isolated_db, sid)
        ticks = Counter(row["schedule_fired_at"] for row in sessions)
        assert set(ticks.values()) == {1}, ticks
        assert all(t.microsecond == 0 for t in ticks), "each is for a whole second's tick"
        first = sessions[0]
        view = await wait_for_status(http, str(first["id"]), TERMINAL)
        assert view["status"] == "succeeded", view
        assert view["schedule"]["id"] == sid
        assert instant(view["schedule"]["firedAt"]) == first["schedule_fired_at"]
        assert view["title"] == "tick" and view["prompt"] == "nightly report"
        assert (await http.get("/api/agent")).json()["sessions"][0]["schedule"]["id"] == sid
        await asyncio.sleep(1.5)
        assert len(await fired(isolated_db, sid)) == len(sessions), "fired after its delete"
    for worker in workers:
        assert "the firing failed" not in worker.logs(tail=None)


async def two_slow_firings(
    url: str, http: httpx.AsyncClient, overlap: str
) -> tuple[list[dict[str, Any]], set[str]]:
    """An every-second schedule whose sessions take 3 s, paused once it fired twice: its
    sessions and the outcomes of its firings."""
    slow = [{"text": "done", "delayMs": 3000}]
    sid = (await create_schedule(http, cron="* * * * * *", overlap=overlap, script=slow))["id"]
    await wait_fired(url, sid, 2, timeout=30)
    await http.patch(f"/api/schedules/{sid}", json={"enabled": False})
    firings = (await http.get(f"/api/schedules/{sid}")).json()["lastFirings"]
    return await fired(url, sid), {f["outcome"] for f in firings}


async def test_overlap_skip_fires_only_once_the_last_session_ended(
    api: ServerProcess, key: str, isolated_db: str, start_worker: StartWorker
) -> None:
    await ready(start_worker(FAST))
    async with client(api.url, key) as http:
        [first, second, *_], outcomes = await two_slow_firings(isolated_db, http, "skip")
    assert "skipped" in outcomes and "queued" not in outcomes, outcomes
    # The second is for a tick after the first had ended.
    assert first["status"] in TERMINAL
    assert second["schedule_fired_at"] >= first["updated_at"] - timedelta(seconds=1)
    assert second["created_at"] >= first["updated_at"]


async def test_overlap_queue_fires_a_waiting_tick_when_the_last_session_ends(
    api: ServerProcess, key: str, isolated_db: str, start_worker: StartWorker
) -> None:
    await ready(start_worker(FAST))
    async with client(api.url, key) as http:
        [first, second, *_], outcomes = await two_slow_firings(isolated_db, http, "queue")
    # The second is for a tick while the first ran, fired once the first had ended.
    assert second["schedule_fired_at"] < first["updated_at"] <= second["created_at"]
    assert second["created_at"] - first["updated_at"] < timedelta(seconds=2)
    assert "skipped" in outcomes, outcomes  # ticks while one firing already waited


async def test_downtime_leaves_one_catch_up_firing(
    api: ServerProcess, key: str, isolated_db: str, start_worker: StartWorker
) -> None:
    """No worker ran for five hourly ticks: one session stands for them, for the latest."""
    async with client(api.url, key) as http:
        sid = (await create_schedule(http, cron="0 * * * *"))["id"]
        now = datetime.now(UTC)
        latest = now.replace(minute=0, second=0, microsecond=0)
        await make_due(isolated_db, sid, latest - timedelta(hours=5))
        await ready(start_worker(FAST))
        await wait_fired(isolated_db, sid, 1)
        await asyncio.sleep(1)  # several more polls
        [session] = await fired(isolated_db, sid)
        assert session["schedule_fired_at"] == latest
        schedule = (await http.get(f"/api/schedules/{sid}")).json()
        [firing] = schedule["lastFirings"]
        assert firing["outcome"] == "fired" and firing["catchUp"] is True
        assert firing["sessionId"] == str(session["id"])
        assert instant(schedule["nextRunAt"]) == latest + timedelta(hours=1)


async def test_without_catch_up_missed_ticks_fire_nothing(
    api: ServerProcess, key: str, isolated_db: str, start_worker: StartWorker
) -> None:
    async with client(api.url, key) as http:
        sid = (await create_schedule(http, cron="0 * * * *"))["id"]
        latest = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        await make_due(isolated_db, sid, latest - timedelta(hours=5))
        await ready(start_worker({**FAST, "FERRYMAN_SCHEDULE_CATCH_UP": "false"}))
        deadline = time.monotonic() + 20
        while not (schedule := (await http.get(f"/api/schedules/{sid}")).json())["lastFirings"]:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        [firing] = schedule["lastFirings"]
        assert firing["outcome"] == "missed" and firing["sessionId"] is None
        assert instant(schedule["nextRunAt"]) == latest + timedelta(hours=1)
        assert await fired(isolated_db, sid) == []


async def test_the_sdk_and_the_cli(api: ServerProcess, key: str) -> None:
    """Ferryman and AsyncFerryman's schedule calls, and `ferryman schedules`."""
    from ferryman import AsyncFerryman, Ferryman, NotFoundError, UnprocessableEntityError

    with Ferryman(api.url, api_key=key) as sync:
        made = sync.create_schedule(
            "0 9 * * 1-5", "standup notes", timezone="Europe/Berlin", tools=["get_note"]
        )
        assert made.cron == "0 9 * * 1-5" and made.tools == ["get_note"]
        assert made.next_run_at is not None and made.overlap == "skip"
        assert sync.pause_schedule(made.id).next_run_at is None
        assert sync.resume_schedule(made.id).enabled is True
        changed = sync.update_schedule(made.id, overlap="allow", tools=None, title="Standup")
        assert (changed.overlap, changed.tools, changed.title) == ("allow", None, "Standup")
        assert [s.id for s in sync.list_schedules().schedules] == [made.id]
        with pytest.raises(UnprocessableEntityError) as refused:
            sync.create_schedule("61 * * * *", "x")
        assert refused.value.code == "SCHEDULE_CRON_INVALID"
    async with AsyncFerryman(api.url, api_key=key) as client:
        assert (await client.get_schedule(made.id)).title == "Standup"
        assert (await client.pause_schedule(made.id)).enabled is False
        await client.delete_schedule(made.id)
        with pytest.raises(NotFoundError):
            await client.get_schedule(made.id)

    from tests.test_cli_client import Ferryman as Cli

    cli = Cli(api.url, key)
    created = await cli("schedules", "create", "*/5 * * * *", "check the queue", "--tz", "UTC")
    assert created.returncode == 0, created
    sid = created.stdout.split()[0]
    listed = await cli("schedules", "list")
    assert sid in listed.stdout and "*/5 * * * *" in listed.stdout, listed
    shown = await cli("schedules", "show", sid, "--json")
    assert shown.json()["prompt"] == "check the queue"
    paused = await cli("schedules", "pause", sid)
    assert paused.returncode == 0 and "paused" in paused.stdout, paused
    resumed = await cli("schedules", "resume", sid, "--json")
    assert resumed.json()["enabled"] is True
    assert (await cli("schedules", "delete", sid)).returncode == 0
    gone = await cli("schedules", "show", sid)
    assert gone.returncode != 0 and "no such schedule" in gone.stderr, gone


async def test_a_tick_fired_already_is_not_fired_again(
    api: ServerProcess, key: str, isolated_db: str, start_worker: StartWorker
) -> None:
    """A schedule put back to a tick it fired (a clock gone back, a bug): the database refuses
    a second session for the tick, the worker logs the failure and the schedule goes on."""
    worker = start_worker(FAST)
    await ready(worker)
    async with client(api.url, key) as http:
        sid = (await create_schedule(http, cron="0 * * * *"))["id"]
        latest = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        await make_due(isolated_db, sid, latest)
        await wait_fired(isolated_db, sid, 1)
        await make_due(isolated_db, sid, latest)
        deadline = time.monotonic() + 20
        while "the firing failed" not in worker.logs(tail=None):
            assert time.monotonic() < deadline, worker.logs()
            await asyncio.sleep(0.1)
        [session] = await fired(isolated_db, sid)
        schedule = (await http.get(f"/api/schedules/{sid}")).json()
        assert instant(schedule["nextRunAt"]) == latest + timedelta(hours=1)
        [firing] = schedule["lastFirings"]
        assert firing["outcome"] == "fired" and firing["sessionId"] == str(session["id"])
    assert "sessions_schedule_tick" in worker.logs(tail=None)
