"""A run create's `webhook` through the official Python client, `langgraph-sdk`, against a
real server, a real worker and a real receiver (tests/test_webhooks.py's, on 127.0.0.1, which
FERRYMAN_WEBHOOK_ALLOW_HOSTS allows): one delivery when the run ends, signed with the owner's
run secret and checked with the Standard Webhooks library's own verifier, and none for the
thread's later runs; a URL the guard refuses is 422 with nothing written."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from uuid import UUID

import psycopg
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from psycopg.rows import dict_row

from app.api.webhooks import new_secret
from app.store import webhooks as webhook_store
from ferryman import AsyncFerryman
from tests.support import (
    ServerProcess,
    StartWorker,
    assert_problem,
    client,
    create_owner_key,
    query,
    ready,
    running,
)
from tests.test_webhooks import SENDER_ENV, Receiver, until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

GRAPH = "ferryman"
SCRIPTED = {"model": "scripted", "script": [{"text": "Report written."}, {"text": "Again."}]}


def said(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


@pytest.fixture(scope="module")
def api(isolated_db: str) -> Iterator[ServerProcess]:
    """The API sends the deliveries (every process does), with short retries."""
    with running(ServerProcess(isolated_db, env=SENDER_ENV)) as proc:
        yield proc


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver().start()
    yield rec
    rec.stop()


@pytest.fixture
def owner_key(isolated_db: str) -> str:
    return create_owner_key(isolated_db)[1]


@pytest.fixture
async def sdk(api: ServerProcess, owner_key: str) -> AsyncIterator[LangGraphClient]:
    lg = get_client(url=f"{api.url}/agent-protocol", api_key=owner_key)
    yield lg
    await lg.http.client.aclose()


async def one_off_deliveries(url: str, thread_id: str) -> list[dict[str, Any]]:
    return await query(
        url,
        "SELECT d.id, d.delivered_at FROM webhook_deliveries d"
        " JOIN webhooks w ON w.id = d.webhook_id WHERE w.session_id = %s",
        (thread_id,),
    )


async def test_a_runs_webhook_is_delivered_once_signed_when_it_ends(
    api: ServerProcess,
    owner_key: str,
    sdk: LangGraphClient,
    receiver: Receiver,
    isolated_db: str,
    start_worker: StartWorker,
) -> None:
    async with client(api.url, owner_key) as http:
        rotated = await http.post("/api/webhooks/run-secret")
        assert rotated.status_code == 201, rotated.text
        # A one-off subscription is not one of the owner's listed subscriptions.
        listed_before = (await http.get("/api/webhooks")).json()["webhooks"]
    async with AsyncFerryman(api.url, api_key=owner_key) as ferryman:
        again = await ferryman.rotate_run_webhook_secret()  # the SDK's call; a new secret
    secret = again.secret
    assert secret.startswith("whsec_") and secret != rotated.json()["secret"]
    await ready(start_worker())
    tid = (await sdk.threads.create())["thread_id"]
    run = await sdk.runs.create(
        tid, GRAPH, input=said("Write it."), context=SCRIPTED, webhook=receiver.url
    )
    await sdk.runs.join(tid, run["run_id"])
    [request] = await until(lambda: receiver.requests)
    body = request.verified(secret)  # raises unless signed with the owner's run secret
    assert body["run_id"] == run["run_id"] and body["thread_id"] == tid
    assert body["status"] == "success" and body["assistant_id"] == GRAPH
    assert [m["content"] for m in body["values"]["messages"]] == ["Write it.", "Report written."]
    for key in ("run_started_at", "run_ended_at", "webhook_sent_at", "created_at"):
        assert body[key], key
    assert "error" not in body
    assert request.headers["webhook-id"]

    # A later run of the thread, without a webhook, delivers nothing more.
    await sdk.runs.wait(tid, GRAPH, input=said("Once more."))
    # (The trigger writes a delivery in the transaction of the run's end: there is none.)
    [delivery] = await one_off_deliveries(isolated_db, tid)
    assert str(delivery["id"]) == request.headers["webhook-id"]
    deadline = time.monotonic() + 30
    while (await one_off_deliveries(isolated_db, tid))[0]["delivered_at"] is None:
        assert time.monotonic() < deadline, "the 204 was not recorded"
        await asyncio.sleep(0.05)
    assert len(receiver.requests) == 1
    async with client(api.url, owner_key) as http:
        assert (await http.get("/api/webhooks")).json()["webhooks"] == listed_before


async def test_a_stateless_runs_webhook(
    sdk: LangGraphClient, receiver: Receiver, isolated_db: str, start_worker: StartWorker
) -> None:
    """Signed with the owner's run secret, made at the first run webhook when the owner had
    none (a rotation makes a new one)."""
    await ready(start_worker())
    values = await sdk.runs.wait(
        None,
        GRAPH,
        input=said("Write it."),
        context=SCRIPTED,
        webhook=receiver.url,
        on_completion="keep",
    )
    assert values["messages"][-1]["content"] == "Report written."
    [request] = await until(lambda: receiver.requests)
    secret = (
        await query(
            isolated_db,
            "SELECT secret FROM webhook_run_secrets WHERE owner_id ="
            " (SELECT owner_id FROM webhooks WHERE url = %s LIMIT 1)",
            (receiver.url,),
        )
    )[0]["secret"]
    body = request.verified(secret)
    assert body["status"] == "success"
    thread = await sdk.threads.get(body["thread_id"])
    assert thread["metadata"]["stateless"] is True


async def test_a_refused_webhook_url_is_422_and_writes_nothing(
    api: ServerProcess, owner_key: str, sdk: LangGraphClient
) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    async with client(api.url, owner_key) as http:
        for url in ("http://10.0.0.7/hook", "http://localhost:9/hook", "ftp://example.com/x"):
            body = {"assistant_id": GRAPH, "input": said("x"), "webhook": url}
            for path in (f"/agent-protocol/threads/{tid}/runs", "/agent-protocol/runs/wait"):
                assert_problem(await http.post(path, json=body), 422, "WEBHOOK_TARGET_REFUSED")
    assert (await sdk.threads.get(tid))["status"] == "idle"
    assert await sdk.runs.list(tid) == []
    assert await sdk.threads.search(metadata={"stateless": True}) == []


async def test_a_run_that_ended_before_its_webhook_was_written_is_delivered_by_the_write(
    api: ServerProcess,
    owner_key: str,
    sdk: LangGraphClient,
    receiver: Receiver,
    isolated_db: str,
    start_worker: StartWorker,
) -> None:
    """The other side of the race `create_one_off` closes: the run's `session_end` committed
    first, so no trigger will deliver; the webhook's own write does, once."""
    await ready(start_worker())
    tid = (await sdk.threads.create())["thread_id"]
    run = await sdk.runs.create(tid, GRAPH, input=said("Write it."), context=SCRIPTED)
    await sdk.runs.join(tid, run["run_id"])
    [owner] = await query(isolated_db, "SELECT owner_id FROM sessions WHERE id = %s", (tid,))
    async with (
        await psycopg.AsyncConnection.connect(isolated_db, row_factory=dict_row) as conn,
        conn.transaction(),
    ):
        await webhook_store.create_one_off(
            conn, owner["owner_id"], UUID(tid), 1, receiver.url, new_secret()
        )
    [request] = await until(lambda: receiver.requests)
    [secret] = await query(
        isolated_db,
        "SELECT secret FROM webhook_run_secrets WHERE owner_id = %s",
        (owner["owner_id"],),
    )
    body = request.verified(secret["secret"])
    assert body["run_id"] == run["run_id"] and body["status"] == "success"
    # Its next run's end finds the webhook spent: still one delivery.
    await sdk.runs.wait(tid, GRAPH, input=said("Once more."))
    assert len(await one_off_deliveries(isolated_db, tid)) == 1
