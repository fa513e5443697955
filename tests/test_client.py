"""The SDK against a real server: CRUD, errors, and a stream that survives a server restart."""

from __future__ import annotations

import asyncio

import pytest

from app.client import ApiError, FerrymanClient, StreamEvent
from tests.support import ServerProcess, create_owner_key, running, sse


async def test_sdk_round_trip(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    _, key = owner_key
    async with FerrymanClient(server.url, api_key=key) as ferryman:
        created = await ferryman.create_session("hello", title="first", idempotency_key="k1")
        again = await ferryman.create_session("hello", title="first", idempotency_key="k1")
        assert again["id"] == created["id"]
        assert (await ferryman.rename_session(created["id"], "renamed"))["title"] == "renamed"
        page = await ferryman.list_sessions()
        assert [s["id"] for s in page["sessions"]] == [created["id"]]
        cancelled = await ferryman.cancel_session(created["id"])
        assert cancelled["status"] == "cancelled"
        with pytest.raises(ApiError) as error:
            await ferryman.cancel_session(created["id"])
        assert error.value.code == "SESSION_ALREADY_TERMINAL"
        transcript = await ferryman.transcript(created["id"])
        assert [e["type"] for e in transcript["events"]] == ["user_message", "session_end"]
        await ferryman.delete_session(created["id"])
        with pytest.raises(ApiError) as error:
            await ferryman.get_session(created["id"])
        assert error.value.status == 404


async def test_sdk_tools_and_approvals(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    _, key = owner_key
    async with FerrymanClient(server.url, api_key=key) as ferryman:
        tools = {t["name"]: t for t in await ferryman.list_tools()}
        assert tools["get_note"]["source"] == "builtin"
        created = await ferryman.create_session(
            "hi", instructions="Be brief.", approvalRequired=["put_note"]
        )
        assert created["instructions"] == "Be brief."
        with pytest.raises(ApiError) as error:
            await ferryman.decide_tool_call(created["id"], "call_x", True, reason="fine")
        assert error.value.code == "APPROVAL_NOT_PENDING"
        await ferryman.cancel_session(created["id"])


async def test_owner_stream_survives_server_restart(database_url: str) -> None:
    _, key = create_owner_key(database_url)
    api = ServerProcess(database_url).start()
    seen: list[StreamEvent] = []
    try:
        async with FerrymanClient(api.url, api_key=key, reconnect_delay=0.1) as ferryman:
            cursor = (await ferryman.list_sessions())["cursor"]

            async def watch() -> None:
                async for event in ferryman.owner_events(cursor=cursor):
                    if event.id is not None:
                        seen.append(event)
                    if len(seen) == 4:
                        return

            watcher = asyncio.create_task(watch())
            await ferryman.create_session("one")
            await ferryman.create_session("two")
            api.stop()
            # The client keeps its base URL: a new server comes up on the same port.
            api = ServerProcess(database_url, port=api.port).start()
            async with FerrymanClient(api.url, api_key=key) as writer:
                await writer.create_session("three")
                await writer.create_session("four")
            await asyncio.wait_for(watcher, 20)
    finally:
        api.stop()
    assert [int(e.id or 0) for e in seen] == list(range(int(cursor) + 1, int(cursor) + 5))
    assert [e.type for e in seen] == ["session_created"] * 4


async def test_control_frames_carry_no_id(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    """`caught_up` after a backlog must not look durable (httpx-sse repeats the last id)."""
    _, key = owner_key
    async with FerrymanClient(server.url, api_key=key) as ferryman:
        created = await ferryman.create_session("hello")
        frames: list[StreamEvent] = []
        async for event in ferryman.session_events(created["id"]):
            frames.append(event)
            if event.type == "caught_up":
                break
    assert [(e.type, e.id) for e in frames] == [("user_message", "1"), ("caught_up", None)]


async def test_stream_waits_for_a_free_slot(database_url: str) -> None:
    """A 429 TOO_MANY_STREAMS is temporary: the SDK's stream backs off and opens once a slot
    is free, instead of raising."""
    _, key = create_owner_key(database_url)
    env = {"FERRYMAN_MAX_STREAMS_PER_OWNER": "1"}
    with running(ServerProcess(database_url, env=env)) as api:
        async with FerrymanClient(api.url, api_key=key, reconnect_delay=0.1) as ferryman:
            session = await ferryman.create_session("slots")

            async def first_event() -> StreamEvent:
                async for event in ferryman.session_events(session["id"]):
                    return event
                raise AssertionError("the stream ended")

            async with sse(ferryman._http, "/api/agent/owner-events") as holder:
                waiting = asyncio.create_task(first_event())
                await anext(holder)  # caught_up: the one slot is taken
                await asyncio.sleep(0.5)
                assert not waiting.done(), "the SDK gave up on a 429"
            event = await asyncio.wait_for(waiting, 10)
            assert event.type == "user_message"
