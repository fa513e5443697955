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
    new_session,
    transcript,
    wait_event,
    wait_for_status,
)
from tests.tools import TOOLS_ENV

ENV = {**TOOLS_ENV, "FERRYMAN_LEASE_TTL": "10"}


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
    first = WorkerProcess(database_url, env=ENV, concurrency=1).start()
    second: WorkerProcess | None = None
    try:
        async with client(server.url, key) as http:
            sid = await new_session(http, "pay", script=script)
            await wait_event(http, sid, lambda e: e["type"] == "tool_call_start")
            for _ in range(100):  # the side effect lands before the tool lingers
                if path.exists() and path.read_text():
                    break
                await asyncio.sleep(0.05)
            first.signal(signal.SIGKILL)
            second = WorkerProcess(database_url, env=ENV, concurrency=1).start()
            await wait_for_status(http, sid, {"succeeded", "failed"}, timeout=30)
            events = await transcript(http, sid)
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
    worker = WorkerProcess(database_url, env=ENV, concurrency=1).start()
    try:
        async with client(server.url, key) as http:
            sid = await new_session(http, "x", script=script)
            await wait_for_status(http, sid, {"succeeded", "failed"}, timeout=30)
            events = await transcript(http, sid)
    finally:
        worker.stop()
    result = next(e["data"] for e in events if e["type"] == "tool_result")
    assert result["isError"] is True and result["content"] == "RuntimeError: kaboom"
    assert events[-1]["data"]["status"] == "succeeded"
