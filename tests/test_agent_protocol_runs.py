"""Run parameters of the Agent Protocol through `langgraph-sdk` against a real server: a
stateless run's `on_completion` (its thread deleted by default, kept with `keep`), the
parameters Ferryman cannot honour refused with 501 NOT_SERVED, and a run's `metadata` kept
with it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import NotFoundError
from langgraph_sdk.schema import RunCreateMetadata

from tests.support import ServerProcess, StartWorker, assert_problem, ready, running

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

GRAPH = "ferryman"
HELLO = {"messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
async def sdk(api: ServerProcess, key: str) -> AsyncIterator[LangGraphClient]:
    """The SDK's client of the module's API server (conftest's `api`), as a fresh owner."""
    client = get_client(url=f"{api.url}/agent-protocol", api_key=key)
    yield client
    await client.http.client.aclose()


def context(text: str) -> dict[str, Any]:
    return {"model": "scripted", "script": [{"text": text}]}


async def gone(sdk: LangGraphClient, thread_id: str, timeout: float = 15.0) -> bool:
    """Whether the thread is deleted within `timeout` (a background delete)."""
    for _ in range(int(timeout / 0.1)):
        try:
            await sdk.threads.get(thread_id)
        except NotFoundError:
            return True
        await asyncio.sleep(0.1)
    return False


async def test_a_stateless_run_deletes_its_thread_unless_kept(
    sdk: LangGraphClient, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    created: list[RunCreateMetadata] = []
    values = await sdk.runs.wait(
        None, GRAPH, input=HELLO, context=context("Hi."), on_run_created=created.append
    )
    assert values["messages"][-1]["content"] == "Hi."
    thread_id = created[0]["thread_id"]
    assert thread_id is not None
    # LangGraph's default for a stateless run: its thread is gone once the answer is back.
    with pytest.raises(NotFoundError):
        await sdk.threads.get(thread_id)

    created.clear()
    values = await sdk.runs.wait(
        None,
        GRAPH,
        input=HELLO,
        context=context("Kept."),
        on_completion="keep",
        on_run_created=created.append,
    )
    kept = await sdk.threads.get(str(created[0]["thread_id"]))
    assert kept["metadata"]["stateless"] is True and kept["metadata"]["on_completion"] == "keep"
    assert kept["values"]["messages"][-1]["content"] == "Kept."

    # A background run and a streamed one: deleted once the run has ended.
    run = await sdk.runs.create(None, GRAPH, input=HELLO, context=context("Later."))
    assert await gone(sdk, run["thread_id"])
    created.clear()
    parts = [
        part
        async for part in sdk.runs.stream(
            None, GRAPH, input=HELLO, context=context("Streamed."), on_run_created=created.append
        )
    ]
    assert parts[-1].event == "end"
    assert await gone(sdk, str(created[0]["thread_id"]))


async def test_a_stateless_run_whose_client_left_is_deleted(
    sdk: LangGraphClient, api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    slow = {"model": "scripted", "script": [{"text": "Slowly.", "chunks": 4, "delayMs": 500}]}
    body = {"assistant_id": GRAPH, "input": HELLO, "context": slow}
    async with httpx.AsyncClient(base_url=f"{api.url}/agent-protocol") as http:
        with pytest.raises(httpx.ReadTimeout):  # the client leaves in the middle of the run
            await http.post("/runs/wait", json=body, headers={"x-api-key": key}, timeout=0.5)
    [thread] = await sdk.threads.search(metadata={"stateless": True})
    assert await gone(sdk, thread["thread_id"], timeout=30)


async def test_a_delete_outlives_its_api_process(
    isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    with running(ServerProcess(isolated_db)) as first:
        client = get_client(url=f"{first.url}/agent-protocol", api_key=key)
        run = await client.runs.create(None, GRAPH, input=HELLO, context=context("Later."))
        await client.http.client.aclose()
    # The process that would delete the thread is gone; the run ends without it.
    await ready(start_worker())
    async with await psycopg.AsyncConnection.connect(isolated_db, autocommit=True) as conn:
        for _ in range(300):
            cur = await conn.execute(
                "SELECT status FROM sessions WHERE id = %s", (run["thread_id"],)
            )
            if (await cur.fetchone()) == ("succeeded",):
                break
            await asyncio.sleep(0.1)
        # Past the grace the retention pass leaves to a live process's own delete.
        await conn.execute(
            "UPDATE sessions SET updated_at = updated_at - interval '2 minutes' WHERE id = %s",
            (run["thread_id"],),
        )
    # The next API process's retention pass (at its start) deletes it.
    with running(ServerProcess(isolated_db)) as second:
        client = get_client(url=f"{second.url}/agent-protocol", api_key=key)
        assert await gone(client, run["thread_id"])
        await client.http.client.aclose()


async def test_what_cannot_be_honoured_is_refused(
    sdk: LangGraphClient, api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker())
    tid = (await sdk.threads.create())["thread_id"]
    refused: list[dict[str, Any]] = [
        {"interrupt_before": ["agent"]},
        {"interrupt_after": "*"},
        {"after_seconds": 5},
        {"checkpoint_id": "00000000-0000-0000-0000-000000000001"},
        {"checkpoint": {"checkpoint_id": "00000000-0000-0000-0000-000000000001"}},
    ]
    async with httpx.AsyncClient(
        base_url=f"{api.url}/agent-protocol", headers={"x-api-key": key}
    ) as http:
        for params in refused:
            body = {"assistant_id": GRAPH, "input": HELLO, **params}
            for path in (f"/threads/{tid}/runs", "/runs", "/runs/wait", "/runs/stream"):
                problem = assert_problem(await http.post(path, json=body), 501, "NOT_SERVED")
                assert next(iter(params)).split("_")[0] in problem["detail"], problem
        # Nothing was written, and no stateless thread was left behind.
        assert (await sdk.threads.get(tid))["status"] == "idle"
        assert await sdk.threads.search(metadata={"stateless": True}) == []
        # The defaults, and what changes nothing here, are taken.
        taken = {
            "interrupt_before": [],
            "after_seconds": 0,
            "stream_subgraphs": True,
            "stream_resumable": True,
            "durability": "sync",
        }
        body = {"assistant_id": GRAPH, "input": HELLO, "context": context("Fine."), **taken}
        answer = await http.post(f"/threads/{tid}/runs/wait", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["messages"][-1]["content"] == "Fine."
    # The thread's newest checkpoint is where a run starts anyway: naming it is fine.
    head = (await sdk.threads.get_state(tid))["checkpoint"]
    values = await sdk.runs.wait(tid, GRAPH, input=HELLO, checkpoint=head)
    assert [m["type"] for m in values["messages"]] == ["human", "ai", "human", "ai"]
    earlier = (await sdk.threads.get_history(tid, limit=10))[-1]["checkpoint"]
    with pytest.raises(httpx.HTTPStatusError) as fork:
        await sdk.runs.create(tid, GRAPH, input=HELLO, checkpoint_id=earlier["checkpoint_id"])
    assert fork.value.response.status_code == 501
    assert "/fork" in fork.value.response.json()["detail"]


async def test_run_metadata_is_kept(sdk: LangGraphClient, start_worker: StartWorker) -> None:
    await ready(start_worker())
    tid = (await sdk.threads.create())["thread_id"]
    run = await sdk.runs.create(
        tid,
        GRAPH,
        input=HELLO,
        context=context("One."),
        metadata={"name": "first", "n": 1},
        multitask_strategy="interrupt",
    )
    assert run["metadata"]["name"] == "first" and run["multitask_strategy"] == "interrupt"
    await sdk.runs.join(tid, run["run_id"])
    second = await sdk.runs.create(tid, GRAPH, input=HELLO, metadata={"name": "second"})
    await sdk.runs.join(tid, second["run_id"])
    got = await sdk.runs.get(tid, run["run_id"])
    assert got["metadata"]["name"] == "first" and got["metadata"]["n"] == 1
    assert got["multitask_strategy"] == "interrupt" and got["status"] == "success"
    listed = await sdk.runs.list(tid)
    assert [r["metadata"]["name"] for r in listed] == ["second", "first"]
    assert listed[0]["multitask_strategy"] == "reject"
    # Bounded as a session's metadata is.
    with pytest.raises(httpx.HTTPStatusError) as big:
        await sdk.runs.create(tid, GRAPH, input=HELLO, metadata={"x": "y" * 20_000})
    assert big.value.response.status_code == 422
