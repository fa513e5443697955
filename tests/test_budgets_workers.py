"""Provider budgets shared by worker processes (docs/budgets.md), against the tests' llama.cpp
server (tests/llm) behind a real proxy that counts what reaches it (tests/budget_proxy.py):
two workers with one slot between them never overlap, a 429 with Retry-After met by one
worker pauses the other, a SIGKILLed worker's slot frees itself, a waiting session says so on
its stream (`model_wait`), and a cancel ends a wait at once.

Without xllamacpp these tests skip, except under CI=true, where they fail."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator

import pytest

from tests.budget_proxy import LimitingProxy, limiting_proxy, overlapping
from tests.llm.server import LlamaServer
from tests.llm.tiny_model import TICK
from tests.support import (
    TERMINAL,
    ServerProcess,
    StartWorker,
    client,
    first_delta,
    new_session,
    of_type,
    ready,
    sse,
    transcript,
    wait_event,
    wait_for_status,
)

MODEL = "openai:tiny"


@pytest.fixture
def proxy(llm: LlamaServer) -> Iterator[LimitingProxy]:
    with limiting_proxy(llm.base_url) as proxy:
        yield proxy


def env(proxy: LimitingProxy, **budget: str) -> dict[str, str]:
    return {
        "FERRYMAN_OPENAI_BASE_URL": proxy.base_url,
        "FERRYMAN_MODEL_IDLE_TIMEOUT": "20",
        "FERRYMAN_HEARTBEAT_INTERVAL": "0.5",
        "FERRYMAN_LEASE_TTL": "3",
        **budget,
    }


async def test_two_workers_sharing_one_slot_never_overlap(
    proxy: LimitingProxy, api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    budget = env(proxy, FERRYMAN_OPENAI_MAX_CONCURRENT="1")
    await ready(start_worker(budget), start_worker(budget))
    async with client(api.url, key) as http:
        sids = [await new_session(http, f"hi {i}", model=MODEL, tools=[]) for i in range(6)]
        ended = [await wait_for_status(http, sid, TERMINAL, timeout=90) for sid in sids]
        logs = [await transcript(http, sid) for sid in sids]
    assert [s["status"] for s in ended] == ["succeeded"] * 6
    assert proxy.requests == 6 and proxy.refused == 0
    assert proxy.max_in_flight == 1 and overlapping(proxy.spans) == 1
    workers = {of_type(log, "session_start")[0]["data"].get("workerId") for log in logs}
    waits = [w for log in logs for w in of_type(log, "model_wait")]
    # Both workers ran sessions, and the sessions that waited for the slot said so.
    assert len(workers) == 2, workers
    assert waits and {w["data"]["reason"] for w in waits} == {"concurrency"}


async def test_a_429_met_by_one_worker_pauses_the_other(
    proxy: LimitingProxy, api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    proxy.retry_after = 2.0
    proxy.refuse_next = 1
    budget = env(
        proxy,
        FERRYMAN_PROVIDER_BUDGETS=json.dumps({"openai": {}}),
        FERRYMAN_MODEL_MAX_RETRIES="3",
    )
    await ready(start_worker(budget, concurrency=1), start_worker(budget, concurrency=1))
    async with client(api.url, key) as http:
        first = await new_session(http, "hi", model=MODEL, tools=[])
        retry = await wait_event(http, first, lambda e: e["type"] == "model_retry", timeout=30)
        refused_at = proxy.arrivals[0]
        # The first worker sleeps out its retry with its one run: the second takes this one.
        second = await new_session(http, "hello", model=MODEL, tools=[])
        async with asyncio.timeout(30), sse(http, f"/api/agent/{second}/events") as events:
            async for event in events:
                if event.event == "model_wait":
                    wait = event.json()["data"]
                    break
        done = [await wait_for_status(http, s, TERMINAL, timeout=60) for s in (first, second)]
        logs = [await transcript(http, s) for s in (first, second)]
    assert retry["data"]["reason"] == "rate_limited" and retry["data"]["delayMs"] == 2000
    assert wait["reason"] == "paused" and wait["untilMs"] > time.time() * 1000 - 5000
    assert [s["status"] for s in done] == ["succeeded", "succeeded"]
    starts = [of_type(log, "session_start")[0]["data"].get("workerId") for log in logs]
    assert starts[0] != starts[1]
    # Nobody called the provider again before the Retry-After had passed.
    assert proxy.refused == 1 and proxy.requests == 3
    assert min(proxy.arrivals[1:]) >= refused_at + 2.0 - 0.05


async def test_a_killed_workers_slot_frees_itself(
    proxy: LimitingProxy, api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    budget = env(proxy, FERRYMAN_OPENAI_MAX_CONCURRENT="1")
    victim = start_worker(budget, concurrency=1)
    await ready(victim)
    async with client(api.url, key) as http:
        long = await new_session(
            http, TICK, model=MODEL, tools=[], modelSettings={"maxTokens": 400}
        )
        await first_delta(http, long)
        victim.signal(signal.SIGKILL)
        await ready(start_worker(budget, concurrency=2))
        short = await new_session(http, "hi", model=MODEL, tools=[])
        started = time.monotonic()
        session = await wait_for_status(http, short, TERMINAL, timeout=60)
        took = time.monotonic() - started
        resumed = await wait_for_status(http, long, {"waiting", *TERMINAL}, timeout=60)
    assert session["status"] == "succeeded"
    assert resumed["status"] in ("waiting", "succeeded")
    # The dead worker's slot lasted at most its lease TTL (3 s) after its last renewal.
    assert took < 30, took
    assert proxy.max_in_flight <= 2  # the dead call's connection may linger at the proxy


async def test_a_cancel_ends_a_wait_at_once(
    proxy: LimitingProxy, api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    budget = env(proxy, FERRYMAN_OPENAI_MAX_CONCURRENT="1")
    await ready(start_worker(budget))
    async with client(api.url, key) as http:
        holder = await new_session(
            http, TICK, model=MODEL, tools=[], modelSettings={"maxTokens": 200_000}
        )
        await first_delta(http, holder)
        waiter = await new_session(http, "hi", model=MODEL, tools=[])
        wait = await wait_event(http, waiter, lambda e: e["type"] == "model_wait", timeout=30)
        started = time.monotonic()
        cancelled = await http.post(f"/api/agent/{waiter}/cancel", params={"wait": "true"})
        took = time.monotonic() - started
        await http.post(f"/api/agent/{holder}/cancel", params={"wait": "true"})
        events = await transcript(http, waiter)
    assert wait["data"] == {"reason": "concurrency"}
    assert cancelled.json()["status"] == "cancelled"
    assert took < 3, took
    assert of_type(events, "assistant_message") == []
    assert proxy.requests == 1  # the waiter never reached the provider
