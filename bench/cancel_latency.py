"""Cancel latency: `POST /cancel` to the durable `session_end {cancelled}`, for sessions
sleeping in a tool on a worker in another process.

    python -m bench.cancel_latency --sessions 200

The API process and a worker process run against a fresh database. Sessions are cancelled one at
a time; the end of each measurement is the moment the owner stream delivers the
`session_status {cancelled}` event, which commits in the same transaction as `session_end`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import httpx
from httpx_sse import aconnect_sse

from bench.stats import latency_line
from tests.support import ServerProcess, WorkerProcess, fresh_database

SLEEPING = [{"toolCalls": [{"name": "sleep", "arguments": {"seconds": 600}}]}]


async def measure(api: str, sessions: int, batch: int) -> list[float]:
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=api, timeout=30) as http:
        cursor = (await http.get("/api/agent", params={"limit": 1})).json()["cursor"]
        cancelled: dict[str, asyncio.Future[float]] = {}
        started = asyncio.Event()

        async def watch() -> None:
            async with aconnect_sse(
                http,
                "GET",
                "/api/agent/owner-events",
                headers={"Last-Event-ID": cursor},
                timeout=httpx.Timeout(None),
            ) as source:
                started.set()
                async for event in source.aiter_sse():
                    if event.event != "session_status":
                        continue
                    envelope = json.loads(event.data)
                    waiter = cancelled.get(envelope["sessionId"])
                    if envelope["data"]["status"] == "cancelled" and waiter and not waiter.done():
                        waiter.set_result(time.perf_counter())

        watcher = asyncio.create_task(watch())
        await started.wait()
        done = 0
        while done < sessions:
            count = min(batch, sessions - done)
            ids = [
                (
                    await http.post("/api/agent", json={"prompt": "sleep", "script": SLEEPING})
                ).json()["id"]
                for _ in range(count)
            ]
            for session_id in ids:  # wait until each is asleep in its tool
                while True:
                    page = (await http.get(f"/api/agent/{session_id}/transcript")).json()
                    if any(e["type"] == "tool_call_start" for e in page["events"]):
                        break
                    await asyncio.sleep(0.02)
            for session_id in ids:
                cancelled[session_id] = asyncio.get_running_loop().create_future()
                start = time.perf_counter()
                response = await http.post(f"/api/agent/{session_id}/cancel")
                assert response.status_code == 202, response.text
                latencies.append(await asyncio.wait_for(cancelled[session_id], 10) - start)
            done += count
            print(f"  {done}/{sessions} cancelled", flush=True)
        watcher.cancel()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--batch", type=int, default=20, help="sessions asleep at a time")
    args = parser.parse_args()
    with fresh_database("ferryman_bench") as url:
        api = ServerProcess(url).start()
        worker = WorkerProcess(url, concurrency=args.batch).start()
        try:
            latencies = asyncio.run(measure(api.url, args.sessions, args.batch))
        finally:
            worker.stop()
            api.stop()
    print()
    print(latency_line("cancel -> durable session_end", latencies))


if __name__ == "__main__":
    sys.exit(main())
