"""Idempotent and non-idempotent tools across a worker crash (SPEC section 5)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from tests.support import (
    ServerProcess,
    WorkerProcess,
    client,
    create_owner_key,
    wait_for_status,
)

TOOLS_ENV = {"FERRYMAN_TOOL_MODULES": "tests.tools:TOOLS", "FERRYMAN_LEASE_TTL": "10"}


async def _transcript(http, session_id: str) -> list[dict]:  # type: ignore[no-untyped-def]
    return (await http.get(f"/api/agent/{session_id}/transcript", params={"limit": 1000})).json()[
        "events"
    ]


async def _wait_for_event(http, session_id: str, type_: str, timeout: float = 20) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout / 0.05)):
        if any(e["type"] == type_ for e in await _transcript(http, session_id)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {type_} in {session_id}")


async def test_interrupted_non_idempotent_call_is_not_rerun(
    server: ServerProcess, database_url: str, tmp_path: Path
) -> None:
    _, key = create_owner_key(database_url)
    path = tmp_path / "effects.txt"
    script = [
        {
            "toolCalls": [
                {"name": "record", "arguments": {"path": str(path), "text": "charge", "linger": 30}}
            ]
        },
        {"text": "done"},
    ]
    first = WorkerProcess(database_url, env=TOOLS_ENV, concurrency=1).start()
    second: WorkerProcess | None = None
    try:
        async with client(server.url, key) as http:
            created = (
                await http.post("/api/agent", json={"prompt": "pay", "script": script})
            ).json()
            await _wait_for_event(http, created["id"], "tool_call_start")
            for _ in range(100):  # the side effect lands before the tool lingers
                if path.exists() and path.read_text():
                    break
                await asyncio.sleep(0.05)
            first.signal(signal.SIGKILL)
            second = WorkerProcess(database_url, env=TOOLS_ENV, concurrency=1).start()
            await wait_for_status(http, created["id"], {"succeeded", "failed"}, timeout=30)
            events = await _transcript(http, created["id"])
    finally:
        first.stop(signal.SIGKILL)
        if second:
            second.stop()
    assert len(path.read_text().splitlines()) == 1, "the non-idempotent call ran twice"
    results = [e["data"] for e in events if e["type"] == "tool_result"]
    assert results[0]["interrupted"] is True and results[0]["content"] == "worker interrupted"
    assert results[1]["isError"] is True and "not run again" in results[1]["content"]
    resumed = [e["data"] for e in events if e["type"] == "session_resumed"]
    assert resumed and resumed[0]["repairedToolCalls"] == [results[0]["toolCallId"]]
    assert events[-1]["type"] == "session_end" and events[-1]["data"]["status"] == "succeeded"


async def test_tool_raising_becomes_an_error_result(
    server: ServerProcess, database_url: str
) -> None:
    _, key = create_owner_key(database_url)
    script = [
        {"toolCalls": [{"name": "explode", "arguments": {"message": "kaboom"}}]},
        {"text": "recovered"},
    ]
    worker = WorkerProcess(database_url, env=TOOLS_ENV, concurrency=1).start()
    try:
        async with client(server.url, key) as http:
            created = (await http.post("/api/agent", json={"prompt": "x", "script": script})).json()
            await wait_for_status(http, created["id"], {"succeeded", "failed"}, timeout=30)
            events = await _transcript(http, created["id"])
    finally:
        worker.stop()
    result = next(e["data"] for e in events if e["type"] == "tool_result")
    assert result["isError"] is True and result["content"] == "RuntimeError: kaboom"
    assert events[-1]["data"]["status"] == "succeeded"
