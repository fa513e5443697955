"""Fork latency: `POST /api/agent/{id}/fork` of a session of 100, 1,000 and 10,000 events, at
its last event (the whole log copied), beside a create (`POST /api/agent`) as the baseline.

    python -m bench.fork --rounds 30

An API server (no worker: nothing runs the forks) on a fresh database. Each parent is made by
a create and then filled by SQL with a conversation of realistic shapes and sizes (a user
message, an assistant message calling a tool, its `tool_call_start` and a `tool_result` of
about 1.5 KB, over and over: about 0.7 KB of data an event), as a long agent session's log
is. Times are the client's, request to answer, one request at a time; each round forks every
size once and creates once, in that order, so drift touches all alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import httpx
import psycopg

from bench.stats import percentile
from tests.support import ServerProcess, fresh_database

SIZES = (100, 1_000, 10_000)

# One turn of four events, as data; %(n)s is the turn's number (each event's text differs).
FILL = """
    WITH turns AS (
        SELECT g AS n, 2 + 4 * (g - 1) AS first FROM generate_series(1, %(turns)s) g
    ), events AS (
        SELECT first AS seq, 'user_message' AS type,
               jsonb_build_object('text', 'question ' || n || ' ' || repeat('q', 200),
                                  'delivery', 'queued') AS data FROM turns
        UNION ALL
        SELECT first + 1, 'assistant_message', jsonb_build_object(
            'text', 'answer ' || n || ' ' || repeat('a', 500), 'stopReason', 'tool_use',
            'toolCalls', jsonb_build_array(jsonb_build_object(
                'id', 'call_' || n, 'name', 'get_note', 'arguments',
                jsonb_build_object('key', 'k' || n)))) FROM turns
        UNION ALL
        SELECT first + 2, 'tool_call_start', jsonb_build_object(
            'toolCallId', 'call_' || n, 'name', 'get_note',
            'arguments', jsonb_build_object('key', 'k' || n)) FROM turns
        UNION ALL
        SELECT first + 3, 'tool_result', jsonb_build_object(
            'toolCallId', 'call_' || n, 'name', 'get_note', 'isError', false,
            'content', repeat('r', 1500)) FROM turns
    )
    INSERT INTO session_events (session_id, seq, attempt, type, data)
    SELECT %(id)s, seq, 1, type, data FROM events WHERE seq <= %(last)s
"""


def make_parent(http: httpx.Client, url: str, events: int) -> str:
    """A session whose log has `events` events."""
    session_id: str = http.post("/api/agent", json={"prompt": "a long session"}).json()["id"]
    with psycopg.connect(url, autocommit=True) as conn:
        turns = (events - 1 + 3) // 4
        conn.execute(FILL, {"id": session_id, "turns": turns, "last": events})
        conn.execute("UPDATE sessions SET last_seq = %s WHERE id = %s", (events, session_id))
    return session_id


def line(label: str, seconds: Sequence[float]) -> str:
    ms = [s * 1000 for s in seconds]
    return (
        f"{label:<22} median {statistics.median(ms):7.2f} ms  p99 {percentile(ms, 99):7.2f} ms"
        f"  max {max(ms):7.2f} ms  (n={len(ms)})"
    )


def measure(api: str, url: str, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"create (baseline)": []}
    with httpx.Client(base_url=api, timeout=60) as http:
        parents = {size: make_parent(http, url, size) for size in SIZES}
        for size in SIZES:
            times[f"fork of {size:,} events"] = []
        for _ in range(rounds):
            for size, parent in parents.items():
                start = time.perf_counter()
                response = http.post(f"/api/agent/{parent}/fork", json={"atSeq": size})
                times[f"fork of {size:,} events"].append(time.perf_counter() - start)
                assert response.status_code == 201, response.text
                assert response.json()["lastSeq"] == size
            start = time.perf_counter()
            response = http.post("/api/agent", json={"prompt": "a long session"})
            times["create (baseline)"].append(time.perf_counter() - start)
            assert response.status_code == 201, response.text
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    with fresh_database("ferryman_bench") as url:
        api = ServerProcess(url).start()
        try:
            times = measure(api.url, url, args.rounds)
        finally:
            api.stop()
    for label, seconds in times.items():
        print(line(label, seconds))


if __name__ == "__main__":
    sys.exit(main())
