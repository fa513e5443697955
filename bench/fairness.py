"""Fair claims: owner A queues a backlog, then owner B queues a few sessions; how long B's wait
for a worker, and what the drain of everything costs, with fair claim keys and with the claim
order of before (first queued, first claimed), side by side in one run.

    python -m bench.fairness --backlog 5000 --late 10 --workers 2 --concurrency 16 --rounds 2
    python -m bench.fairness ... --max-running 32   # and a pass with the owner limit's claim form

Each pass gets a fresh database on `--database-url` (default `$DATABASE_URL`, else the
PostgreSQL at 127.0.0.1:5432). `fifo` passes turn the claim-key triggers off
(alembic/versions/0016_fair_claims.py), so every key is the time the row was written: the
order before fair claims. A's `--backlog` sessions (one scripted model turn each) are written
in one statement; `--workers` worker processes start; once the first session runs and
`--delay` s more have passed, B's `--late` sessions are written. Figures per pass:

- B's wait: from its session's creation to its `session_start` (both the database's clock):
  p50, p99, max;
- sessions/s: every session (A's and B's) over the time from the first `session_start` to the
  last session's end.

Rounds alternate the order of the two modes; the table shows medians over rounds, then each
pass. The target: B's p99 under 1 s with fair claims, sessions/s within 10 % of `fifo`'s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402

from bench.stats import percentile  # noqa: E402
from tests.support import WorkerProcess, fresh_database  # noqa: E402

MODES = ("fifo", "fair")
# With --max-running: fair claims in the form FERRYMAN_OWNER_MAX_RUNNING takes (docs/tenants.md).
LIMITED = "limited"
TRIGGERS = ("sessions_queued_insert", "sessions_queued_update")

# A's backlog or B's sessions, each queued with its opening message, as a create writes them.
QUEUE = """
WITH s AS (
    INSERT INTO sessions (id, owner_id, title, status, model, prompt, script, last_seq)
    SELECT gen_random_uuid(), %(owner)s, %(owner)s || n, 'queued', 'scripted', 'go',
           '[{"text": "done"}]', 1
    FROM generate_series(1, %(count)s) AS n
    RETURNING id
)
INSERT INTO session_events (session_id, seq, attempt, type, data)
SELECT id, 1, 0, 'user_message', '{"text": "go", "delivery": "queued"}' FROM s
"""
WAITS = """
SELECT extract(epoch FROM e.created_at - s.created_at)
FROM sessions s JOIN session_events e ON e.session_id = s.id AND e.type = 'session_start'
WHERE s.owner_id = 'b'
"""
SPAN = """
SELECT count(*) FILTER (WHERE s.status = 'succeeded'), count(*),
       extract(epoch FROM max(s.updated_at) - (SELECT min(created_at) FROM session_events
                                               WHERE type = 'session_start'))
FROM sessions s
"""


@dataclass
class Pass:
    mode: str
    waits: list[float]
    sessions: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.sessions / self.seconds

    def line(self) -> str:
        return (
            f"{self.mode}: B's wait p50 {percentile(self.waits, 50):.3f} s,"
            f" p99 {percentile(self.waits, 99):.3f} s, max {max(self.waits):.3f} s;"
            f" {self.rate:.1f} sessions/s ({self.sessions} in {self.seconds:.1f} s)"
        )


def wait_for(conn: psycopg.Connection, query: str, done: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(query).fetchone()
        if row is not None and row[0] == done:
            return
        time.sleep(0.05)
    raise TimeoutError(f"not done in {timeout} s: {query}")


def one_pass(args: argparse.Namespace, mode: str) -> Pass:
    with (
        fresh_database("bench_fairness", args.database_url) as url,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        if mode == "fifo":
            for trigger in TRIGGERS:
                conn.execute(f"ALTER TABLE sessions DISABLE TRIGGER {trigger}")
        conn.execute(QUEUE, {"owner": "a", "count": args.backlog})
        total = args.backlog + args.late
        env = {"FERRYMAN_LOG_LEVEL": "warning"}
        if mode == LIMITED:
            env["FERRYMAN_OWNER_MAX_RUNNING"] = str(args.max_running)
        workers = [
            WorkerProcess(url, env=env, concurrency=args.concurrency).start()
            for _ in range(args.workers)
        ]
        try:
            started = "SELECT count(*) > 0 FROM session_events WHERE type = 'session_start'"
            wait_for(conn, started, True, 60)
            time.sleep(args.delay)
            conn.execute(QUEUE, {"owner": "b", "count": args.late})
            finished = "SELECT count(*) FROM sessions WHERE status IN ('succeeded', 'failed')"
            wait_for(conn, finished, total, args.timeout)
        finally:
            for worker in workers:
                worker.stop()
        waits = [float(w) for (w,) in conn.execute(WAITS).fetchall()]
        succeeded, count, seconds = conn.execute(SPAN).fetchone()  # type: ignore[misc]
        if succeeded != count or len(waits) != args.late:
            raise RuntimeError(f"{mode}: {succeeded}/{count} succeeded, {len(waits)} B starts")
        return Pass(mode, waits, count, float(seconds))


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report(passes: list[Pass]) -> str:
    lines = ["", f"{'median over rounds':<16}{'B p50 s':>10}{'B p99 s':>10}{'sessions/s':>12}"]
    rates: dict[str, float] = {}
    for mode in [m for m in (*MODES, LIMITED) if any(p.mode == m for p in passes)]:
        mine = [p for p in passes if p.mode == mode]
        p50 = statistics.median(percentile(p.waits, 50) for p in mine)
        p99 = statistics.median(percentile(p.waits, 99) for p in mine)
        rates[mode] = statistics.median(p.rate for p in mine)
        lines.append(f"{mode:<16}{p50:>10.3f}{p99:>10.3f}{rates[mode]:>12.1f}")
    fair_p99 = statistics.median(percentile(p.waits, 99) for p in passes if p.mode == "fair")
    ratio = rates["fair"] / rates["fifo"]
    lines += [
        "",
        f"fair: B's p99 wait {fair_p99:.3f} s (target < 1 s: {met(fair_p99 < 1)})",
        f"fair / fifo, sessions/s: {ratio:.2f} (target >= 0.90: {met(ratio >= 0.9)})",
        *(
            [f"limited / fair, sessions/s: {rates[LIMITED] / rates['fair']:.2f}"]
            if LIMITED in rates
            else []
        ),
        "",
        *(p.line() for p in passes),
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=5000, help="owner A's queued sessions")
    parser.add_argument("--late", type=int, default=10, help="owner B's sessions, queued after")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16, help="slots per worker")
    parser.add_argument("--delay", type=float, default=1.0, help="s from A's first start to B")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900, help="s for one pass to drain")
    parser.add_argument(
        "--max-running",
        type=int,
        help="also a pass with FERRYMAN_OWNER_MAX_RUNNING at this (the limit's claim form)",
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"{args.backlog} sessions of A, then {args.late} of B; {args.workers} workers x"
        f" {args.concurrency} slots; {args.rounds} rounds; load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    passes = []
    for round_ in range(args.rounds):
        modes = (*MODES, LIMITED) if args.max_running else MODES
        for mode in modes if round_ % 2 == 0 else reversed(modes):
            result = one_pass(args, mode)
            print(f"  round {round_ + 1} {result.line()}", flush=True)
            passes.append(result)
    print(report(passes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
