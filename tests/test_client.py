"""The SDK (ferryman, clients/python) against real servers: `Ferryman` and `AsyncFerryman`
round trips with typed results and typed errors, streams that survive restarts and full stream
slots, and a session folded from its live stream by a real worker's run."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import httpx
import pytest

from ferryman import (
    ApiError,
    Assistant,
    AssistantPage,
    AssistantRef,
    AssistantVersions,
    AsyncFerryman,
    AuthenticationError,
    CancelAccepted,
    ConflictError,
    Event,
    Ferryman,
    FerrymanConnectionError,
    FieldError,
    InternalServerError,
    NotFoundError,
    RateLimitError,
    ServiceUnavailableError,
    Session,
    SessionFold,
    SessionPage,
    StreamEvent,
    ToolInfo,
    UnprocessableEntityError,
)
from ferryman.errors import api_error
from tests.support import (
    REPO,
    ServerProcess,
    StartWorker,
    client,
    create_owner_key,
    free_port,
    ready,
    running,
    sse,
)

NOTE_CALL = {"name": "put_note", "arguments": {"key": "k", "text": "v"}}


# --- round trips ------------------------------------------------------------------------------


async def test_async_round_trip(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    owner, key = owner_key
    async with AsyncFerryman(server.url, api_key=key) as ferryman:
        created = await ferryman.create_session(
            "hello", title="first", metadata={"team": "a"}, idempotency_key="k1"
        )
        assert isinstance(created, Session)
        assert (created.owner_id, created.title, created.status) == (owner, "first", "queued")
        assert created.metadata == {"team": "a"} and created.last_seq == 1
        assert created.created_at.tzinfo is not None
        assert (created.attempt, created.resumes) == (0, 0)  # no run, no takeover yet
        again = await ferryman.create_session(
            "hello", title="first", metadata={"team": "a"}, idempotency_key="k1"
        )
        assert again.id == created.id
        renamed = await ferryman.rename_session(created.id, "renamed")
        assert renamed.title == "renamed" and renamed.updated_at >= created.updated_at
        page = await ferryman.list_sessions(status="queued")
        assert isinstance(page, SessionPage) and int(page.cursor) > 0
        assert [s.id for s in page.sessions] == [created.id] and page.next_page_token is None
        assert (await ferryman.list_sessions(status=["succeeded", "failed"])).sessions == []
        cancelled = await ferryman.cancel_session(created.id)
        assert isinstance(cancelled, CancelAccepted)
        assert (cancelled.id, cancelled.cancel_requested, cancelled.status) == (
            created.id,
            True,
            "cancelled",
        )
        with pytest.raises(ConflictError) as conflict:
            await ferryman.cancel_session(created.id)
        assert conflict.value.status == 409 and conflict.value.code == "SESSION_ALREADY_TERMINAL"
        assert conflict.value.problem["sessionStatus"] == "cancelled"
        assert str(conflict.value) == "409 SESSION_ALREADY_TERMINAL: session is already cancelled"
        transcript = await ferryman.transcript(created.id)
        assert [e.type for e in transcript.events] == ["user_message", "session_end"]
        assert all(isinstance(e, Event) for e in transcript.events)
        assert (transcript.last_seq, transcript.next_after) == (2, None)
        assert transcript.events[0].data == {"text": "hello", "delivery": "queued"}
        await ferryman.delete_session(created.id)
        with pytest.raises(NotFoundError) as missing:
            await ferryman.get_session(created.id)
        assert missing.value.status == 404 and missing.value.code == "SESSION_NOT_FOUND"


def test_sync_round_trip(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    _, key = owner_key
    with Ferryman(server.url, api_key=key) as ferryman:
        created = ferryman.create_session("hello sync", title="sync")
        assert ferryman.get_session(created.id) == created
        accepted = ferryman.send_message(created.id, "more")
        assert (accepted.id, accepted.message.seq, accepted.message.delivery) == (
            created.id,
            2,
            "queued",
        )
        # wait=true on a queued session: it settles at once, and the answer is the Session.
        done = ferryman.cancel_session(created.id, wait=True)
        assert isinstance(done, Session) and done.status == "cancelled" and done.terminal
        assert done.cancel_requested
        with pytest.raises(ConflictError) as conflict:
            ferryman.cancel_session(created.id)
        assert conflict.value.code == "SESSION_ALREADY_TERMINAL"
        events = list(ferryman.iter_transcript(created.id))
        assert [e.seq for e in events] == [1, 2, 3]
        assert [e.type for e in ferryman.iter_transcript(created.id, after=2)] == ["session_end"]
        ferryman.delete_session(created.id)
        with pytest.raises(NotFoundError):
            ferryman.rename_session(created.id, "gone")


async def test_iterators_follow_every_page(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    async with AsyncFerryman(server.url, api_key=key) as ferryman:
        made = [(await ferryman.create_session(f"s{i}")).id for i in range(5)]
        page = await ferryman.list_sessions(limit=2)
        assert len(page.sessions) == 2 and page.next_page_token is not None
        listed = [s.id async for s in ferryman.iter_sessions()]
        assert listed == made[::-1]  # newest first
        assert [s.id async for s in ferryman.iter_sessions(status="succeeded")] == []
    with Ferryman(server.url, api_key=key) as sync:
        assert [s.id for s in sync.iter_sessions(status=["queued"])] == made[::-1]


async def test_definition(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    _, key = owner_key
    async with AsyncFerryman(server.url, api_key=key) as ferryman:
        created = await ferryman.create_session(
            "hi",
            instructions="Be brief.",
            model_settings={"temperature": 0.5, "maxTokens": 100},
            tools=["put_note", "get_note"],
            approval_required=["put_note"],
        )
        assert created.instructions == "Be brief."
        assert created.model_settings == {"temperature": 0.5, "maxTokens": 100}
        assert created.approval_required == ["put_note"]
        assert (created.usage.input_tokens, created.usage.output_tokens) == (0, 0)
        with pytest.raises(ConflictError) as error:
            await ferryman.decide_tool_call(created.id, "call_x", True, reason="fine")
        assert error.value.code == "APPROVAL_NOT_PENDING"
        await ferryman.cancel_session(created.id)


async def test_assistants_async(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    _, key = owner_key
    async with AsyncFerryman(server.url, api_key=key) as ferryman:
        made = await ferryman.create_assistant(
            "Helper",
            model="scripted",
            instructions="Be brief.",
            model_settings={"temperature": 0.2},
            tools=["get_note"],
            metadata={"team": "a"},
        )
        assert isinstance(made, Assistant) and made.version == 1 and made.tools == ["get_note"]
        assert await ferryman.get_assistant(made.id) == made
        edited = await ferryman.update_assistant(made.id, instructions="Be kind.", tools=None)
        assert (edited.version, edited.instructions, edited.tools) == (2, "Be kind.", None)
        assert edited.model_settings == {"temperature": 0.2}  # left as it was (UNSET)
        page = await ferryman.list_assistants(name="help", metadata={"team": "a"})
        assert isinstance(page, AssistantPage) and [a.id for a in page.assistants] == [made.id]
        versions = await ferryman.assistant_versions(made.id, limit=1)
        assert isinstance(versions, AssistantVersions)
        assert [v.version for v in versions.versions] == [2] and versions.next_page_token
        pinned = await ferryman.create_session("hi", assistant_id=made.id, assistant_version=1)
        assert pinned.assistant is not None and pinned.assistant.version == 1
        assert pinned.instructions == "Be brief."
        idle = await ferryman.create_session(assistant_id=made.id)
        assert idle.status == "idle" and idle.assistant == AssistantRef(id=made.id, version=2)
        await ferryman.delete_assistant(made.id)
        with pytest.raises(NotFoundError) as gone:
            await ferryman.get_assistant(made.id)
        assert gone.value.code == "ASSISTANT_NOT_FOUND"
        for session in (pinned, idle):
            await ferryman.cancel_session(session.id)


def test_assistants_sync(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    _, key = owner_key
    with Ferryman(server.url, api_key=key) as ferryman:
        made = ferryman.create_assistant("Sync", model="scripted", description="d")
        assert ferryman.update_assistant(made.id, name="Renamed").name == "Renamed"
        assert [a.name for a in ferryman.list_assistants().assistants] == ["Renamed"]
        assert [v.name for v in ferryman.assistant_versions(made.id).versions] == [
            "Renamed",
            "Sync",
        ]
        raw = ferryman.raw.get_assistant(made.id)
        assert raw["version"] == 2 and raw["description"] == "d"
        with pytest.raises(UnprocessableEntityError):
            ferryman.create_assistant("Bad", model="gpt-4")
        ferryman.raw.delete_assistant(made.id)
        assert ferryman.list_assistants().assistants == []


async def test_the_tool_catalog(api: ServerProcess, key: str, start_worker: StartWorker) -> None:
    await ready(start_worker())
    async with AsyncFerryman(api.url, api_key=key) as ferryman:
        catalog = await ferryman.list_tools()
    assert all(isinstance(t, ToolInfo) for t in catalog.tools)
    tools = {t.name: t for t in catalog.tools}
    assert tools["get_note"].source == "builtin" and tools["get_note"].idempotent
    assert tools["put_note"].parameters["type"] == "object"
    # A server that counts live workers says how many there are and how many offer each tool
    # (this test's worker at least; one another test killed may not have expired yet).
    if catalog.workers is not None:
        assert catalog.workers >= 1
        assert all(1 <= (t.workers or 0) <= catalog.workers for t in catalog.tools)
    with Ferryman(api.url, api_key=key) as sync:
        raw = sync.raw.list_tools()
    assert [t["name"] for t in raw["tools"]] == [t.name for t in catalog.tools]


# --- errors -----------------------------------------------------------------------------------


async def test_validation_error_names_the_fields(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    async with AsyncFerryman(server.url, api_key=key) as ferryman:
        with pytest.raises(UnprocessableEntityError) as error:
            await ferryman.create_session("hi", title="", model_settings={"temperature": 9})
    problem = error.value
    assert (problem.status, problem.code) == (422, "VALIDATION_ERROR")
    assert {e.field for e in problem.errors} == {"title", "modelSettings.temperature"}
    assert all(isinstance(e, FieldError) and e.message and e.type for e in problem.errors)
    message = str(problem)
    assert message.startswith("422 VALIDATION_ERROR: "), message
    for error in problem.errors:  # each named once, whether by the detail or after it
        assert message.count(str(error)) == 1, message


async def test_a_bad_key_is_an_authentication_error(server: ServerProcess) -> None:
    async with AsyncFerryman(server.url, api_key="fm_not_a_key") as ferryman:
        with pytest.raises(AuthenticationError) as error:
            await ferryman.list_sessions()
    assert error.value.status == 401 and error.value.code == "INVALID_API_KEY"


def test_errors_by_status() -> None:
    """The class follows the status; a body that is not problem+json (a proxy's page) still
    makes an ApiError, its text the detail."""
    gateway = api_error(httpx.Response(502, text="<html>Bad Gateway</html>\n"))
    assert isinstance(gateway, InternalServerError)
    assert (gateway.status, gateway.code, gateway.title) == (502, "HTTP_502", "Bad Gateway")
    assert gateway.detail == "<html>Bad Gateway</html>" and gateway.problem == {
        "detail": "<html>Bad Gateway</html>"
    }
    assert str(gateway) == "502 HTTP_502: <html>Bad Gateway</html>" and gateway.retryable
    unavailable = api_error(httpx.Response(503, json={"code": "DATABASE_UNAVAILABLE"}))
    assert isinstance(unavailable, ServiceUnavailableError) and unavailable.retryable
    assert isinstance(api_error(httpx.Response(429, json={})), RateLimitError)
    field = {"field": "title", "message": "must have at least 1 character", "type": "too_short"}
    generic = {"code": "VALIDATION_ERROR", "detail": "the request is not valid", "errors": [field]}
    assert str(api_error(httpx.Response(422, json=generic))) == (
        "422 VALIDATION_ERROR: the request is not valid; title: must have at least 1 character"
    )
    naming = {**generic, "detail": "title: must have at least 1 character"}
    assert str(api_error(httpx.Response(422, json=naming))) == (
        "422 VALIDATION_ERROR: title: must have at least 1 character"
    )
    teapot = api_error(httpx.Response(418, json=["not", "a", "problem"]))
    assert type(teapot) is ApiError and not teapot.retryable
    assert teapot.detail == '["not","a","problem"]'


def test_a_dead_port_is_a_connection_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with Ferryman(url) as ferryman, pytest.raises(FerrymanConnectionError) as error:
        ferryman.get_session("x")
    assert not isinstance(error.value, ApiError)
    assert str(error.value) == (
        f"cannot reach Ferryman at {url}: connection refused;"
        " is `ferryman serve` running? (FERRYMAN_URL)"
    )


async def test_a_dead_port_is_a_connection_error_async() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with AsyncFerryman(url) as ferryman:
        with pytest.raises(FerrymanConnectionError, match="connection refused"):
            await ferryman.list_tools()


def test_url_and_key_from_the_environment(
    server: ServerProcess, owner_key: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, key = owner_key
    monkeypatch.setenv("FERRYMAN_URL", server.url + "/")
    monkeypatch.setenv("FERRYMAN_API_KEY", key)
    with Ferryman() as ferryman:
        assert ferryman.base_url == server.url
        assert ferryman.create_session("from env").owner_id == owner
    # An empty key sends no Authorization header: local mode's owner.
    with Ferryman(api_key="") as local:
        assert local.create_session("local").owner_id == "local"
    monkeypatch.delenv("FERRYMAN_URL")
    assert Ferryman().base_url == "http://127.0.0.1:8000"


def test_the_sdk_imports_nothing_else_of_the_app() -> None:
    """The SDK (clients/python) stands alone (httpx, httpx-sse, pydantic): every name it
    exports loads, from the checkout where `app` could be imported, and no `app` module comes."""
    code = (
        "import sys, ferryman; "
        "[getattr(ferryman, name) for name in ferryman.__all__]; "
        "print(sorted(m for m in sys.modules if m == 'app' or m.startswith('app.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# --- streams ----------------------------------------------------------------------------------


async def test_owner_stream_survives_server_restart(database_url: str) -> None:
    _, key = create_owner_key(database_url)
    api = ServerProcess(database_url).start()
    seen: list[StreamEvent] = []
    try:
        async with AsyncFerryman(api.url, api_key=key, reconnect_delay=0.1) as ferryman:
            cursor = (await ferryman.list_sessions()).cursor

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
            async with AsyncFerryman(api.url, api_key=key) as writer:
                await writer.create_session("three")
                await writer.create_session("four")
            await asyncio.wait_for(watcher, 20)
    finally:
        api.stop()
    assert [int(e.id or 0) for e in seen] == list(range(int(cursor) + 1, int(cursor) + 5))
    assert [e.type for e in seen] == ["session_created"] * 4
    assert [e.data["session"]["prompt"] for e in seen] == ["one", "two", "three", "four"]


async def test_owner_stream_goes_on_after_resync(database_url: str) -> None:
    """A cursor further behind than the replay limit: the stream yields `resync_required`,
    then goes on live from a fresh snapshot's cursor."""
    _, key = create_owner_key(database_url)
    with running(ServerProcess(database_url, env={"FERRYMAN_REPLAY_LIMIT": "2"})) as api:
        async with AsyncFerryman(api.url, api_key=key, reconnect_delay=0.1) as ferryman:
            cursor = (await ferryman.list_sessions()).cursor
            for i in range(3):
                await ferryman.create_session(f"old {i}")
            events = ferryman.owner_events(cursor=cursor)
            first = await anext(events)
            assert (first.type, first.id) == ("resync_required", None)
            assert first.data["reason"] == "too_far_behind"
            assert (await anext(events)).type == "caught_up"
            new = await ferryman.create_session("new")
            created = await asyncio.wait_for(anext(events), 10)
            assert (created.type, created.session_id) == ("session_created", new.id)
            assert int(created.id or 0) == int(cursor) + 4


async def test_control_frames_carry_no_id(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    """`caught_up` after a backlog must not look durable (httpx-sse repeats the last id)."""
    _, key = owner_key
    async with AsyncFerryman(server.url, api_key=key) as ferryman:
        created = await ferryman.create_session("hello")
        frames: list[StreamEvent] = []
        async for event in ferryman.session_events(created.id):
            frames.append(event)
            if event.type == "caught_up":
                break
    assert [(e.type, e.id, e.seq) for e in frames] == [
        ("user_message", "1", 1),
        ("caught_up", None, None),
    ]
    assert frames[1].data == {"replayed": 1, "fromEventId": "0", "cursor": "1"}


def test_session_stream_ends(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    """`follow=False` ends after `caught_up`; a followed stream ends when the session is
    deleted; a session that does not exist is a NotFoundError."""
    _, key = owner_key
    with Ferryman(server.url, api_key=key, reconnect_delay=0.05) as ferryman:
        created = ferryman.create_session("to delete")
        ferryman.cancel_session(created.id)
        frames = list(ferryman.session_events(created.id, follow=False))
        assert [(e.type, e.id) for e in frames] == [
            ("user_message", "1"),
            ("session_end", "2"),
            ("caught_up", None),
        ]
        after = list(ferryman.session_events(created.id, after=1, follow=False))
        assert [e.type for e in after] == ["session_end", "caught_up"]
        other = Ferryman(server.url, api_key=key)
        timer = threading.Timer(0.5, other.delete_session, [created.id])
        timer.start()
        followed = [e.type for e in ferryman.session_events(created.id, after=2)]
        timer.join()
        other.close()
        assert followed == ["caught_up"]
        with pytest.raises(NotFoundError):
            next(ferryman.session_events(created.id))


async def test_stream_waits_for_a_free_slot(database_url: str) -> None:
    """A 429 TOO_MANY_STREAMS is temporary: the SDK's stream backs off and opens once a slot
    is free, instead of raising."""
    _, key = create_owner_key(database_url)
    env = {"FERRYMAN_MAX_STREAMS_PER_OWNER": "1"}
    with running(ServerProcess(database_url, env=env)) as api:
        async with (
            AsyncFerryman(api.url, api_key=key, reconnect_delay=0.1) as ferryman,
            client(api.url, key) as http,
        ):
            session = await ferryman.create_session("slots")

            async def first_event() -> StreamEvent:
                async for event in ferryman.session_events(session.id):
                    return event
                raise AssertionError("the stream ended")

            async with sse(http, "/api/agent/owner-events") as holder:
                waiting = asyncio.create_task(first_event())
                await anext(holder)  # caught_up: the one slot is taken
                await asyncio.sleep(0.5)
                assert not waiting.done(), "the SDK gave up on a 429"
            event = await asyncio.wait_for(waiting, 10)
            assert event.type == "user_message"


# --- with a worker ----------------------------------------------------------------------------


async def test_a_run_folded_from_its_stream(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    """A scripted run with a tool call that waits for approval, followed live: the fold of
    the stream (deltas included) ends as the fold of the transcript, and as the server says."""
    await ready(start_worker())
    script = [
        {"text": "Saving.", "toolCalls": [NOTE_CALL], "chunks": 3, "delayMs": 150},
        {"text": "Saved it.", "chunks": 3, "delayMs": 150},
    ]
    live = SessionFold()
    async with AsyncFerryman(api.url, api_key=key) as ferryman:
        created = await ferryman.create_session(
            "save a note", script=script, approval_required=["put_note"]
        )
        events = ferryman.session_events(created.id)
        async for event in events:
            live.apply(event)
            if live.status == "waiting":
                break
        (call,) = live.tool_calls.values()
        assert (call.name, call.status, call.arguments) == (
            "put_note",
            "awaiting_approval",
            NOTE_CALL["arguments"],
        )
        decided = await ferryman.decide_tool_call(created.id, call.id, True)
        assert (decided.tool_call_id, decided.approved, decided.status) == (call.id, True, "queued")
        async for event in events:
            live.apply(event)
            if live.status in ("succeeded", "failed", "cancelled"):
                break
        await events.aclose()
        final = await ferryman.get_session(created.id)
        replayed = SessionFold()
        replayed.apply_all(list(await _all_events(ferryman, created.id)))
    assert live.snapshot() == replayed.snapshot()
    assert (live.status, final.status, live.last_seq) == ("succeeded", "succeeded", final.last_seq)
    assert [(m.role, m.text) for m in live.messages] == [
        ("user", "save a note"),
        ("assistant", "Saving."),
        ("assistant", "Saved it."),
    ]
    assert live.tool_calls[call.id].status == "succeeded"
    assert live.tool_calls[call.id].result == "saved note 'k'"


async def _all_events(ferryman: AsyncFerryman, session_id: str) -> list[Event]:
    return [event async for event in ferryman.iter_transcript(session_id)]
