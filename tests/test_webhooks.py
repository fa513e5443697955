"""Webhooks (docs/webhooks.md) against a real receiver: an HTTP server in the test, on
127.0.0.1 (allowed by FERRYMAN_WEBHOOK_ALLOW_HOSTS), that fails, holds or goes away on cue;
every request it takes is checked with the Standard Webhooks library's own verifier."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from signal import SIGKILL
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from app.domain import WebhookEventType
from ferryman import AsyncFerryman, Ferryman
from ferryman.errors import ApiError
from tests.support import (
    ServerProcess,
    StartWorker,
    assert_problem,
    client,
    create_owner_key,
    free_port,
    new_session,
    query,
    ready,
    running,
    wait_for_status,
)

# Short retries and bounds, so a test sees several attempts in seconds.
SENDER_ENV = {
    "FERRYMAN_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
    "FERRYMAN_WEBHOOK_RETRY_INITIAL_DELAY": "0.2",
    "FERRYMAN_WEBHOOK_RETRY_MAX_DELAY": "0.5",
    "FERRYMAN_WEBHOOK_POLL_INTERVAL": "0.1",
    "FERRYMAN_WEBHOOK_CONNECT_TIMEOUT": "1",
    "FERRYMAN_WEBHOOK_READ_TIMEOUT": "2",
}


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def id(self) -> str:
        return self.headers["webhook-id"]

    def verified(self, secret: str) -> dict[str, Any]:
        payload: dict[str, Any] = Webhook(secret).verify(self.body, self.headers)
        return payload


@dataclass
class Receiver:
    """Answers 500 to the first `failures` requests, then 204; while `hold` is clear, a request
    waits for it before answering."""

    failures: int = 0
    port: int = field(default_factory=free_port)
    requests: list[Received] = field(default_factory=list)
    hold: threading.Event = field(default_factory=threading.Event)
    held: threading.Event = field(default_factory=threading.Event)
    server: ThreadingHTTPServer | None = None

    def __post_init__(self) -> None:
        self.hold.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.requests.append(
                    Received({k.lower(): v for k, v in self.headers.items()}, body)
                )
                if not receiver.hold.is_set():
                    receiver.held.set()
                    receiver.hold.wait(30)
                failing = len(receiver.requests) <= receiver.failures
                self.send_response(500 if failing else 204)
                self.send_header("content-length", "0" if not failing else "5")
                self.end_headers()
                if failing:
                    self.wfile.write(b"nope!")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def accepted(self, secret: str) -> list[dict[str, Any]]:
        """The verified payloads of the requests answered 2xx."""
        return [r.verified(secret) for r in self.requests[self.failures :]]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    yield rec
    rec.hold.set()
    rec.stop()


@pytest.fixture(scope="module")
def api(isolated_db: str) -> Iterator[ServerProcess]:
    """The API; it sends no deliveries itself, so the workers of each test do."""
    env = {**SENDER_ENV, "FERRYMAN_WEBHOOK_SEND": "false"}
    with running(ServerProcess(isolated_db, env=env)) as proc:
        yield proc


@pytest.fixture
async def http(api: ServerProcess, isolated_db: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the API as a fresh owner."""
    async with client(api.url, create_owner_key(isolated_db)[1]) as owner_client:
        yield owner_client


async def subscribe(http: Any, url: str, events: list[str]) -> dict[str, Any]:
    response = await http.post("/api/webhooks", json={"url": url, "events": events})
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


async def until(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not so after {timeout}s")
        await asyncio.sleep(0.05)


async def deliveries_when(
    http: Any, webhook_id: str, ready: Callable[[list[dict[str, Any]]], bool], timeout: float = 30.0
) -> list[dict[str, Any]]:
    """The webhook's deliveries, newest first, once `ready` says so of them."""
    deadline = time.monotonic() + timeout
    while True:
        response = await http.get(f"/api/webhooks/{webhook_id}/deliveries")
        rows: list[dict[str, Any]] = response.json()["deliveries"]
        if rows and ready(rows):
            return rows
        assert time.monotonic() < deadline, rows
        await asyncio.sleep(0.1)


async def all_delivered(http: Any, webhook_id: str) -> list[dict[str, Any]]:
    return await deliveries_when(
        http, webhook_id, lambda rows: all(row["status"] == "delivered" for row in rows)
    )


async def ended_session(http: Any, start_worker: StartWorker, env: dict[str, str]) -> str:
    """A worker with `env` started, and a session it ran to its end; the session's id."""
    await ready(start_worker(env))
    session_id = await new_session(http)
    await wait_for_status(http, session_id, {"succeeded"})
    return session_id


async def test_subscriptions_are_the_owners(api: ServerProcess, isolated_db: str) -> None:
    _, key = create_owner_key(isolated_db)
    _, other = create_owner_key(isolated_db)
    async with client(api.url, key) as http, client(api.url, other) as theirs:
        created = await subscribe(http, "https://example.com/hook", ["session_end"])
        assert created["secret"].startswith("whsec_")
        Webhook(created["secret"])  # a secret the library takes
        hook = f"/api/webhooks/{created['id']}"
        shown = (await http.get(hook)).json()
        assert "secret" not in shown and shown["events"] == ["session_end"]
        listed = (await http.get("/api/webhooks")).json()["webhooks"]
        assert [w["id"] for w in listed] == [created["id"]] and "secret" not in listed[0]

        for method, path in [
            ("GET", hook),
            ("PATCH", hook),
            ("DELETE", hook),
            ("GET", f"{hook}/deliveries"),
        ]:
            body = {"events": ["session_status"]} if method == "PATCH" else None
            response = await theirs.request(method, path, json=body)
            assert_problem(response, 404, "WEBHOOK_NOT_FOUND")
        assert (await theirs.get("/api/webhooks")).json()["webhooks"] == []

        patched = await http.patch(hook, json={"events": ["session_status", "session_end"]})
        assert patched.status_code == 200, patched.text
        assert patched.json()["events"] == ["session_status", "session_end"]
        assert (await http.delete(hook)).status_code == 204
        assert_problem(await http.get(hook), 404, "WEBHOOK_NOT_FOUND")


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:9/hook",
        "http://127.0.0.2/hook",
        "http://[::1]/hook",
        "http://10.1.2.3/hook",
        "http://192.168.0.1/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::ffff:127.0.0.1]/hook",
        "http://0.0.0.0/hook",
        "ftp://example.com/hook",
        "http://user:pw@example.com/hook",
    ],
)
async def test_private_targets_are_refused(api: ServerProcess, isolated_db: str, url: str) -> None:
    _, key = create_owner_key(isolated_db)
    async with client(api.url, key) as http:
        response = await http.post("/api/webhooks", json={"url": url, "events": ["session_end"]})
        assert_problem(response, 422, "WEBHOOK_TARGET_REFUSED")
        created = await subscribe(http, "https://example.com/hook", ["session_end"])
        response = await http.patch(f"/api/webhooks/{created['id']}", json={"url": url})
        assert_problem(response, 422, "WEBHOOK_TARGET_REFUSED")


async def test_bad_bodies(api: ServerProcess, isolated_db: str) -> None:
    _, key = create_owner_key(isolated_db)
    async with client(api.url, key) as http:
        for body in [
            {"url": "https://example.com/", "events": []},
            {"url": "https://example.com/", "events": ["nope"]},
            {"url": "https://example.com/", "events": ["session_end", "session_end"]},
            {"url": "https://example.com/" + "a" * 3000, "events": ["session_end"]},
        ]:
            assert_problem(await http.post("/api/webhooks", json=body), 422, "VALIDATION_ERROR")


async def test_retried_until_accepted_and_signed(
    http: httpx.AsyncClient, start_worker: StartWorker, receiver: Receiver
) -> None:
    receiver.failures = 2
    receiver.start()
    hook = await subscribe(http, receiver.url, ["session_end", "session_status"])
    session_id = await ended_session(http, start_worker, SENDER_ENV)
    await all_delivered(http, hook["id"])
    (end,) = [p for p in receiver.accepted(hook["secret"]) if p["type"] == "session_end"]
    assert end["data"]["sessionId"] == session_id
    assert end["data"]["event"]["data"]["status"] == "succeeded"
    assert end["data"]["session"]["status"] == "succeeded"
    # The deliveries that met the two failures were sent again, under the same id.
    failed = {r.id for r in receiver.requests[: receiver.failures]}
    accepted = [r.id for r in receiver.requests[receiver.failures :]]
    assert failed <= set(accepted)
    assert len(accepted) == len(set(accepted))
    for request in receiver.requests:
        request.verified(hook["secret"])
    with pytest.raises(Exception, match="signature"):
        Webhook("whsec_" + "A" * 43).verify(receiver.requests[0].body, receiver.requests[0].headers)

    statuses = await until(
        lambda: (
            [
                p["data"]["event"]["data"]["status"]
                for p in receiver.accepted(hook["secret"])
                if p["type"] == "session_status"
            ]
            if len(receiver.requests) >= receiver.failures + 3
            else None
        )
    )
    assert set(statuses) >= {"running", "succeeded"}

    deliveries = (await http.get(f"/api/webhooks/{hook['id']}/deliveries")).json()
    rows = {d["id"]: d for d in deliveries["deliveries"]}
    accepted = [r.id for r in receiver.requests[receiver.failures :]]
    assert set(rows) == set(accepted)
    tries = {i: [r.id for r in receiver.requests].count(i) for i in rows}
    assert {i: row["attempts"] for i, row in rows.items()} == tries
    assert all(d["status"] == "delivered" for d in rows.values()), rows
    assert all(d["lastStatusCode"] == 204 and d["lastError"] is None for d in rows.values())
    page = (await http.get(f"/api/webhooks/{hook['id']}/deliveries", params={"limit": 1})).json()
    assert len(page["deliveries"]) == 1 and page["nextPageToken"]


async def test_approvals_and_questions_are_delivered(
    http: httpx.AsyncClient, start_worker: StartWorker, receiver: Receiver
) -> None:
    receiver.start()
    hook = await subscribe(http, receiver.url, ["tool_approval_requested", "user_question"])
    await ready(start_worker(SENDER_ENV))
    note = [{"toolCalls": [{"name": "put_note", "arguments": {"key": "k", "text": "v"}}]}]
    ask = [{"toolCalls": [{"name": "ask_user", "arguments": {"question": "Which one?"}}]}]
    noting = await new_session(http, "note it", script=note, approvalRequired=["put_note"])
    asking = await new_session(http, "ask", script=ask)
    await wait_for_status(http, noting, {"waiting"})
    await wait_for_status(http, asking, {"waiting"})
    payloads = await until(
        lambda: len(receiver.requests) >= 2 and receiver.accepted(hook["secret"])
    )
    by_type = {p["type"]: p["data"] for p in payloads}
    assert by_type["tool_approval_requested"]["sessionId"] == noting
    assert by_type["tool_approval_requested"]["event"]["data"]["name"] == "put_note"
    assert by_type["user_question"]["sessionId"] == asking
    assert by_type["user_question"]["event"]["data"]["question"] == "Which one?"
    assert {d["session"]["status"] for d in by_type.values()} == {"waiting"}


async def test_sender_killed_mid_delivery(
    http: httpx.AsyncClient, start_worker: StartWorker, receiver: Receiver
) -> None:
    receiver.hold.clear()
    receiver.start()
    hook = await subscribe(http, receiver.url, ["session_end"])
    first = start_worker(SENDER_ENV)
    await ready(first)
    session_id = await new_session(http)
    await wait_for_status(http, session_id, {"succeeded"})
    await asyncio.to_thread(receiver.held.wait, 30)
    first.signal(SIGKILL)
    first.proc.wait()  # type: ignore[union-attr]
    receiver.hold.set()
    await ready(start_worker(SENDER_ENV))
    await until(lambda: len(receiver.requests) >= 2)
    assert receiver.requests[0].id == receiver.requests[1].id
    assert receiver.requests[1].verified(hook["secret"])["type"] == "session_end"

    rows = await all_delivered(http, hook["id"])
    assert rows[0]["attempts"] == 2 and rows[0]["id"] == receiver.requests[0].id


async def test_receiver_down_then_back(
    http: httpx.AsyncClient, start_worker: StartWorker, receiver: Receiver
) -> None:
    hook = await subscribe(http, receiver.url, ["session_end"])
    session_id = await ended_session(http, start_worker, SENDER_ENV)
    (row,) = await deliveries_when(http, hook["id"], lambda rows: rows[0]["attempts"] >= 2)
    assert row["status"] == "pending" and row["lastStatusCode"] is None
    assert "Connect" in row["lastError"], row

    receiver.start()
    (payload,) = await until(lambda: receiver.accepted(hook["secret"]))
    assert payload["data"]["sessionId"] == session_id
    assert json.loads(receiver.requests[0].body)["type"] == "session_end"


async def test_given_up_after_max_age(
    http: httpx.AsyncClient, start_worker: StartWorker, receiver: Receiver
) -> None:
    hook = await subscribe(http, receiver.url, ["session_end"])
    await ended_session(http, start_worker, {**SENDER_ENV, "FERRYMAN_WEBHOOK_MAX_AGE": "1"})
    rows = await deliveries_when(http, hook["id"], lambda rows: rows[0]["status"] == "abandoned")
    assert rows[0]["nextAttemptAt"] is None and rows[0]["attempts"] >= 1


async def test_the_sdks_calls(api: ServerProcess, isolated_db: str) -> None:
    _, key = create_owner_key(isolated_db)
    with Ferryman(api.url, api_key=key) as ferryman:
        created = ferryman.create_webhook("https://example.com/hook", ["session_end"])
        assert created.secret and created.secret.startswith("whsec_")
        assert ferryman.get_webhook(created.id).secret is None
        assert [w.id for w in ferryman.list_webhooks().webhooks] == [created.id]
        updated = ferryman.update_webhook(created.id, events=["user_question"])
        assert updated.events == ["user_question"]
        assert ferryman.webhook_deliveries(created.id).deliveries == []
        with pytest.raises(ApiError) as refused:
            ferryman.create_webhook("http://127.0.0.5/", ["session_end"])
        assert refused.value.code == "WEBHOOK_TARGET_REFUSED"
    async with AsyncFerryman(api.url, api_key=key) as aferryman:
        page = await aferryman.webhook_deliveries(created.id, limit=1)
        assert page.next_page_token is None
        await aferryman.delete_webhook(created.id)
        assert (await aferryman.list_webhooks()).webhooks == []


async def test_the_triggers_fire_for_exactly_the_nameable_events(isolated_db: str) -> None:
    """Migration 0019's WHEN clauses list the same types as WebhookEventType: a name added to
    one but not the other would be accepted and never delivered, or written for nobody."""
    rows = await query(
        isolated_db,
        "SELECT pg_get_triggerdef(oid) AS def FROM pg_trigger"
        " WHERE tgname IN ('session_events_webhooks', 'owner_events_webhooks')",
    )
    assert len(rows) == 2
    named = set(re.findall(r"'([a-z_]+)'::text", " ".join(row["def"] for row in rows)))
    assert named == {str(event) for event in WebhookEventType}
