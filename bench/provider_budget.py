"""Provider budgets (docs/budgets.md) against a provider's concurrency limit: the tests' llama.cpp
server (tests/llm) behind a proxy that lets 4 requests through at once and answers 429 with
Retry-After beyond (tests/budget_proxy.py, asyncio, in this process); `--workers` worker
processes and `--sessions` sessions, with `FERRYMAN_OPENAI_MAX_CONCURRENT` set to the limit
(`budget`) and unset (`none`), side by side in one run.

    python -m bench.provider_budget --workers 8 --sessions 128 --limit 4 --rounds 1

Each pass gets a fresh database on `--database-url` (default `$DATABASE_URL`, else the
PostgreSQL at 127.0.0.1:5432); the sessions (one plain model turn each, `openai:tiny`) are
written in one statement before the workers start. The retry settings are the defaults (4
retries, backoff from 1 s), as a deployment has them. Figures per pass: sessions succeeded
and failed; 429s the proxy answered (each one reached a run as a `model_retry`, or failed it);
`model_wait` events; the most requests in flight at the proxy at once; each session's time
from its first start (its claim) to its end (p50, p99), and the drain, from the first start to
the last end (the workers' start-up, slow on a loaded machine, is in neither). Counts do not
depend on the machine's load; times do.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402

from bench.stats import percentile  # noqa: E402
from tests.budget_proxy import LimitingProxy, limiting_proxy  # noqa: E402
from tests.llm.server import llama_server  # noqa: E402
from tests.llm.tiny_model import write_tiny_model  # noqa: E402
from tests.support import WorkerProcess, fresh_database  # noqa: E402

MODES = ("budget", "none")

QUEUE = """
WITH s AS (
    INSERT INTO sessions (id, owner_id, title, status, model, prompt, tools, last_seq)
    SELECT gen_random_uuid(), 'bench', 'hi ' || n, 'queued', 'openai:tiny', 'hi', '[]', 1
    FROM generate_series(1, %(count)s) AS n
    RETURNING id
)
INSERT INTO session_events (session_id, seq, attempt, type, data)
SELECT id, 1, 0, 'user_message', '{"text": "hi", "delivery": "queued"}' FROM s
"""
ENDED = "SELECT count(*) FROM sessions WHERE status IN ('succeeded', 'failed', 'waiting')"
FIGURES = """
SELECT count(*) FILTER (WHERE s.status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE s.status <> 'succeeded') AS failed,
       (SELECT count(*) FROM session_events WHERE type = 'model_retry') AS retries,
       (SELECT count(*) FROM session_events WHERE type = 'model_wait') AS waits
FROM sessions s
"""
# From a session's first start (its claim: the workers' start-up is not counted) to its end.
TIMES = """
SELECT extract(epoch FROM e.created_at - b.created_at)::float8
FROM session_events e
JOIN session_events b ON b.session_id = e.session_id AND b.type = 'session_start' AND b.seq = (
    SELECT min(seq) FROM session_events WHERE session_id = e.session_id AND type = 'session_start')
WHERE e.type = 'session_end'
"""
# From the first session's start to the last one's end.
DRAIN = """
SELECT extract(epoch FROM max(created_at) FILTER (WHERE type = 'session_end')
                        - min(created_at) FILTER (WHERE type = 'session_start'))::float8
FROM session_events
"""


@dataclass
class Pass:
    mode: str
    succeeded: int
    failed: int
    refused: int  # 429s the proxy answered
    retries: int  # model_retry events
    waits: int  # model_wait events
    max_in_flight: int
    times: list[float]
    drain: float  # s from the first session's start to the last one's end
    wall: float  # s from the workers' start to the last end

    def line(self) -> str:
        return (
            f"{self.mode}: {self.succeeded} succeeded, {self.failed} failed; {self.refused}"
            f" 429s, {self.retries} model_retry, {self.waits} model_wait; max {self.max_in_flight}"
            f" in flight; session p50 {percentile(self.times, 50):.2f} s, p99"
            f" {percentile(self.times, 99):.2f} s; drain {self.drain:.1f} s"
            f" (wall {self.wall:.1f} s)"
        )


def one_pass(args: argparse.Namespace, mode: str, proxy: LimitingProxy) -> Pass:
    proxy.reset()
    with (
        fresh_database("bench_budget", args.database_url) as url,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        conn.execute(QUEUE, {"count": args.sessions})
        env = {
            "FERRYMAN_LOG_LEVEL": "warning",
            "FERRYMAN_OPENAI_BASE_URL": proxy.base_url,
            "FERRYMAN_OPENAI_API_KEY": "bench",
            "FERRYMAN_MODEL_IDLE_TIMEOUT": "60",
            "FERRYMAN_CLAIM_INTERVAL": "0.2",
        }
        if mode == "budget":
            env["FERRYMAN_OPENAI_MAX_CONCURRENT"] = str(args.limit)
        started = time.monotonic()
        workers = [
            WorkerProcess(url, env=env, concurrency=args.concurrency).start()
            for _ in range(args.workers)
        ]
        try:
            deadline = time.monotonic() + args.timeout
            while conn.execute(ENDED).fetchone()[0] < args.sessions:  # type: ignore[index]
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{mode}: not done in {args.timeout} s")
                time.sleep(0.1)
            wall = time.monotonic() - started
        finally:
            for worker in workers:
                worker.stop()
        figures = conn.execute(FIGURES).fetchone()
        assert figures is not None
        times = [float(t) for (t,) in conn.execute(TIMES).fetchall()]
        drain = conn.execute(DRAIN).fetchone()
        assert drain is not None
    return Pass(
        mode,
        int(figures[0]),
        int(figures[1]),
        proxy.refused,
        int(figures[2]),
        int(figures[3]),
        proxy.max_in_flight,
        times,
        float(drain[0]),
        wall,
    )


def report(passes: list[Pass], limit: int) -> str:
    header = (
        f"{'median over rounds':<20}{'ok':>6}{'failed':>8}{'429s':>7}{'retries':>9}"
        f"{'waits':>7}{'max in flight':>15}{'p50 s':>8}{'p99 s':>8}{'drain s':>9}"
    )
    lines = ["", header]
    for mode in MODES:
        mine = [p for p in passes if p.mode == mode]

        def med(values: list[float]) -> float:
            return statistics.median(values)

        lines.append(
            f"{mode:<20}{med([p.succeeded for p in mine]):>6.0f}"
            f"{med([p.failed for p in mine]):>8.0f}{med([p.refused for p in mine]):>7.0f}"
            f"{med([p.retries for p in mine]):>9.0f}{med([p.waits for p in mine]):>7.0f}"
            f"{max(p.max_in_flight for p in mine):>15}"
            f"{med([percentile(p.times, 50) for p in mine]):>8.2f}"
            f"{med([percentile(p.times, 99) for p in mine]):>8.2f}"
            f"{med([p.drain for p in mine]):>9.1f}"
        )
    budgeted = [p for p in passes if p.mode == "budget"]
    ok = all(p.refused == 0 and p.failed == 0 and p.max_in_flight <= limit for p in budgeted)
    lines += [
        "",
        f"budget: zero 429s, every session succeeded, at most {limit} in flight:"
        f" {'met' if ok else 'NOT met'}",
        "",
        *(p.line() for p in passes),
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=128)
    parser.add_argument("--limit", type=int, default=4, help="requests the proxy lets through")
    parser.add_argument("--concurrency", type=int, default=16, help="slots per worker")
    parser.add_argument("--retry-after", type=float, default=1.0, help="the proxy's 429s ask")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900, help="s for one pass")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"{args.sessions} sessions; {args.workers} workers x {args.concurrency} slots; the"
        f" provider allows {args.limit} at once; {args.rounds} rounds;"
        f" load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    passes = []
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_model(Path(tmp) / "tiny.gguf")
        with (
            llama_server(model, n_parallel=args.limit) as llm,
            limiting_proxy(llm.base_url, args.limit, args.retry_after) as proxy,
        ):
            for round_ in range(args.rounds):
                for mode in MODES if round_ % 2 == 0 else reversed(MODES):
                    result = one_pass(args, mode, proxy)
                    print(f"  round {round_ + 1} {result.line()}", flush=True)
                    passes.append(result)
    print(report(passes, args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
