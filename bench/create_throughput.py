"""Creates at the database's pace: `--creates` native creates (`POST /api/agent`, each with an
opening prompt and an `Idempotency-Key` of its own, as the SDK sends them) from `--in-flight`
concurrent HTTP/1.1 keep-alive connections, spread over `--client-processes` processes, against
an API process alone (`ferryman serve --no-worker`) and against `ferryman serve` (API and
worker in one process, the worker running the sessions as they come).

    python -m bench.create_throughput --creates 5000 --in-flight 32 --rounds 2
    # a change before and after, in one run: main in a worktree of its own beside this checkout
    python -m bench.create_throughput --baseline ../baseline --modes api --rounds 3

One command, from start to end:

1. A private PostgreSQL with `pg_stat_statements` (`bench.compare`'s `Cluster`), deleted at the
   end.
2. For each checkout (this one, and `--baseline DIR`'s with its own `.venv`), mode and round,
   in alternating order: a fresh database, the server started on it, `--warmup` creates to fill
   its pool and warm its caches (not counted), a pause until every backend has reported its
   counts (an idle one may hold them for 10 s), then the measured creates.
3. The client processes open their connections first and all start on one "go"; each create's
   latency is from its request's first byte to its answer's last. Every answer must be 201.

Per create, over the window from "go" to the last answer:

- API CPU: user + system time of the server process (`/proc/PID/stat`), stable where wall
  times are not: the machine's other jobs slow the server's clock, not its instructions;
- write commits: transaction ids consumed, cluster-wide (`txid_current()` before and after);
- transactions: `xact_commit + xact_rollback` of the database, read once the server is frozen
  (SIGSTOP) and its backends terminated, so that every backend has reported its counts;
- statements: `pg_stat_statements` calls in the database (top level, transaction control
  included), the observer's left out; "SQL" leaves out BEGIN, COMMIT and the like;
- PostgreSQL CPU: the postmaster and all its processes, the observer's backend left out.

In `serve` mode the worker's runs of the sessions created so far are in the server's CPU and in
the database's counts too: those figures are the pipeline's, not the creates'.

`--profile DIR` runs the server of the first round under cProfile (the figures of that round
carry its overhead) and writes `DIR/<checkout>-<mode>.prof`, with the top functions by own time
printed at the end; with `--profiler pyinstrument` (`pip install pyinstrument`) it samples the
server's main thread every 0.5 ms instead (a truer split, little overhead) and writes and
prints the call tree as `DIR/<checkout>-<mode>.txt`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import multiprocessing
import os
import pstats
import queue
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import psycopg

from bench.compare import (
    CHILDREN,
    OBSERVER,
    TRANSACTION_CONTROL,
    Cluster,
    free_port,
    log,
    read_counters,
    statements,
    stop_process,
    tear_down,
    wait_idle,
    with_database,
)
from bench.stats import percentile

REPO = Path(__file__).resolve().parent.parent
MODES = {"api": ("serve", "--no-worker"), "serve": ("serve",)}
BODY = {"prompt": "hello", "script": [{"text": "Done."}]}


# --- the clients ------------------------------------------------------------------------------


async def _connection(
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    port: int,
    body: bytes,
    prefix: str,
    todo: list[int],
    latencies: list[float],
    errors: list[str],
) -> None:
    reader, writer = conn
    try:
        while todo:
            index = todo.pop()
            request = (
                f"POST /api/agent HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"Idempotency-Key: {prefix}-{index}\r\n\r\n"
            ).encode() + body
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            answer = await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            if not head.startswith(b"HTTP/1.1 201"):
                errors.append((head.split(b"\r\n", 1)[0] + b" " + answer[:200]).decode())
    finally:
        writer.close()


async def _client(
    port: int, creates: int, in_flight: int, prefix: str, ready: Any, go: Event, body: bytes
) -> tuple[list[float], list[str], float]:
    todo = list(range(creates))
    latencies: list[float] = []
    errors: list[str] = []
    # Connections open before "go", so the measured window has no TCP handshakes.
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(in_flight)]
    ready.put(True)
    await asyncio.get_running_loop().run_in_executor(None, go.wait)
    cpu = time.process_time()
    await asyncio.gather(
        *(_connection(conn, port, body, prefix, todo, latencies, errors) for conn in conns)
    )
    return latencies, errors, time.process_time() - cpu


def client_process(
    port: int,
    creates: int,
    in_flight: int,
    prefix: str,
    ready: Any,
    go: Event,
    out: Any,
    body: bytes,
) -> None:
    try:
        try:
            import uvloop

            result = uvloop.run(_client(port, creates, in_flight, prefix, ready, go, body))
        except ImportError:
            result = asyncio.run(_client(port, creates, in_flight, prefix, ready, go, body))
    except Exception as exc:  # the server went away: say so, rather than leave the parent waiting
        ready.put(False)
        result = ([], [f"client: {type(exc).__name__}: {exc}"], 0.0)
    out.put(result)


class Drivers:
    """`creates` creates over `in_flight` connections in `processes` processes, each create
    with the JSON `body` and an Idempotency-Key of its own: started (connections open) by the
    constructor, let go by `go`, their answers gathered by `collect`. `bench.compare
    --end-to-end` drives its creates with these too."""

    def __init__(
        self,
        port: int,
        creates: int,
        in_flight: int,
        processes: int,
        prefix: str,
        body: dict[str, Any] = BODY,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.ready, self.out, self._go = context.Queue(), context.Queue(), context.Event()
        encoded = json.dumps(body).encode()
        self.procs = []
        for index in range(processes):
            share = creates // processes + (index < creates % processes)
            conns = in_flight // processes + (index < in_flight % processes)
            proc = context.Process(
                target=client_process,
                args=(port, share, conns, f"{prefix}-{index}", self.ready, self._go, self.out),
                kwargs={"body": encoded},
                daemon=True,
            )
            proc.start()
            self.procs.append(proc)
        for _ in self.procs:
            self.ready.get(timeout=120)
        self.started = self.last = 0.0
        self.results: list[tuple[list[float], list[str], float]] = []

    def go(self) -> None:
        self.started = time.perf_counter()
        self._go.set()

    def _gathered(self, result: tuple[list[float], list[str], float]) -> None:
        self.results.append(result)
        self.last = time.perf_counter()

    def errors(self) -> list[str]:
        """The failures of the clients done so far (their answers gathered without waiting)."""
        with contextlib.suppress(queue.Empty):
            while len(self.results) < len(self.procs):
                self._gathered(self.out.get_nowait())
        return [error for _, errors, _ in self.results for error in errors]

    def collect(self, timeout: float = 600) -> Clients:
        """Wait for every client's last answer; the window is from `go` to the last one."""
        while len(self.results) < len(self.procs):
            self._gathered(self.out.get(timeout=timeout))
        for proc in self.procs:
            proc.join(10)
        return Clients(
            self.last - self.started,
            [latency for latencies, _, _ in self.results for latency in latencies],
            [error for _, errors, _ in self.results for error in errors],
            sum(cpu for _, _, cpu in self.results),
        )

    def stop(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def drive(port: int, creates: int, in_flight: int, processes: int, prefix: str) -> Clients:
    """`creates` creates over `in_flight` connections in `processes` processes; the window is
    from "go" to the last process's last answer."""
    drivers = Drivers(port, creates, in_flight, processes, prefix)
    drivers.go()
    return drivers.collect()


@dataclass
class Clients:
    seconds: float
    latencies: list[float]
    errors: list[str]
    cpu: float = 0.0  # the client processes' own, from "go" to their last answer


# --- the server -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkout:
    key: str
    path: Path

    @property
    def python(self) -> str:
        return str(self.path / ".venv" / "bin" / "python") if self.path != REPO else sys.executable


def start_server(
    checkout: Checkout, mode: str, url: str, port: int, log_path: Path, profile: Path | None
) -> subprocess.Popen[bytes]:
    argv = ["ferryman", *MODES[mode]]
    code = f"import sys; from ferryman.cli import main; sys.argv = {argv!r}; "
    if profile is None:
        code += "main()"
    elif profile.suffix == ".txt":  # pyinstrument: sampled, so no overhead per call
        code += (
            "from pyinstrument import Profiler; p = Profiler(interval=0.0005,"
            " async_mode='disabled'); p.start()\ntry:\n    main()\nexcept SystemExit:\n"
            f"    pass\nfinally:\n    p.stop(); open({str(profile)!r}, 'w').write(p.output_text("
            "unicode=False, color=False, show_all=True))"
        )
    else:
        code += f"import cProfile; cProfile.run('main()', {str(profile)!r})"
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "FERRYMAN_HOST": "127.0.0.1",
        "FERRYMAN_PORT": str(port),
        "FERRYMAN_AUTH": "local",
        "FERRYMAN_LOG_LEVEL": "warning",
    }
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [checkout.python, "-c", code],
            cwd=checkout.path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    CHILDREN.append(proc)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{checkout.key} {mode}: the server did not start:\n{tail}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1),
        ):
            return proc
        time.sleep(0.1)


def process_cpu(pid: int) -> float:
    """utime + stime of `pid` in seconds, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- one round --------------------------------------------------------------------------------


@dataclass
class Result:
    label: str
    creates: int
    seconds: float
    latencies: list[float]
    api_cpu: float
    pg_cpu: float
    xids: int
    transactions: int
    statements: int
    sql_statements: int
    load: float
    top: list[tuple[int, float, str]] = field(default_factory=list)

    def per(self, value: float) -> float:
        return value / self.creates

    def row(self) -> dict[str, float]:
        return {
            "creates/s": self.creates / self.seconds,
            "p50 ms": percentile(self.latencies, 50) * 1000,
            "p99 ms": percentile(self.latencies, 99) * 1000,
            "API CPU ms / create": self.per(self.api_cpu) * 1000,
            "PostgreSQL CPU ms / create": self.per(self.pg_cpu) * 1000,
            "write commits / create": self.per(self.xids),
            "transactions / create": self.per(self.transactions),
            "statements / create": self.per(self.statements),
            "SQL / create": self.per(self.sql_statements),
            "load average (1 min)": self.load,
        }


def run_round(
    cluster: Cluster,
    checkout: Checkout,
    mode: str,
    args: argparse.Namespace,
    logs: Path,
    tag: str,
    profile: Path | None,
) -> Result:
    name = re.sub(r"\W", "_", f"ct_{tag}")
    port = free_port()
    with cluster.database(name) as url:
        server = start_server(checkout, mode, url, port, logs / f"{tag}.log", profile)
        try:
            log(f"{tag}: {args.warmup} warm-up creates ...")
            warm = drive(port, args.warmup, args.in_flight, args.client_processes, f"w{tag}")
            if warm.errors:
                raise RuntimeError(f"{tag} warm-up: {warm.errors[:3]}")
            # Backends report their counts when idle, at most 10 s late.
            time.sleep(11 if mode == "api" else 1)
            with psycopg.connect(cluster.url, autocommit=True) as admin:
                admin.execute("SELECT pg_stat_statements_reset()")
                before = read_counters(admin, name)
                observer = psycopg.connect(with_database(url, name, OBSERVER), autocommit=True)
                row = observer.execute("SELECT pg_backend_pid()").fetchone()
                assert row is not None
                observer_pid = int(row[0])
                observer.close()
                pg_before = cluster.server_cpu()
                cpu_before = process_cpu(server.pid)
                log(f"{tag}: {args.creates} creates, {args.in_flight} in flight ...")
                clients = drive(
                    port, args.creates, args.in_flight, args.client_processes, f"m{tag}"
                )
                cpu = process_cpu(server.pid) - cpu_before
                pg_cpu = cluster.server_cpu(exclude=observer_pid) - pg_before
                load = os.getloadavg()[0]
                server.send_signal(signal.SIGSTOP)
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    (name,),
                )
                wait_idle(admin, name)
                after = read_counters(admin, name)
                top = statements(admin, name)
        finally:
            stop_process(server, timeout=20)
    if clients.errors:
        raise RuntimeError(f"{tag}: {len(clients.errors)} failed creates: {clients.errors[:3]}")
    n = len(clients.latencies)
    return Result(
        label=f"{checkout.key} {mode}",
        creates=n,
        seconds=clients.seconds,
        latencies=clients.latencies,
        api_cpu=cpu,
        pg_cpu=pg_cpu,
        xids=after.xid - before.xid - 1,  # the second read's own
        transactions=(after.commits + after.rollbacks)
        - (before.commits + before.rollbacks)
        - cluster.connect_commits
        - 1,  # the observer's start-up and its one read
        statements=sum(calls for calls, _, _ in top),
        sql_statements=sum(
            calls for calls, _, query in top if not TRANSACTION_CONTROL.match(query)
        ),
        load=load,
        top=top[: args.top],
    )


# --- the report -------------------------------------------------------------------------------


def fmt(column: str, value: float) -> str:
    if column == "creates/s":
        return f"{value:,.0f}"
    return f"{value:.2f}"


def report(rounds: list[dict[str, Result]], order: list[str], top: int) -> str:
    columns = list(next(iter(rounds[0].values())).row())
    medians = {
        key: {c: statistics.median(r[key].row()[c] for r in rounds) for c in columns}
        for key in order
    }
    width = max(len(c) for c in columns)
    head = f"{'':{width}}  " + "  ".join(f"{key:>16}" for key in order)
    lines = [f"Median over {len(rounds)} round(s):", head]
    for column in columns:
        cells = "  ".join(f"{fmt(column, medians[key][column]):>16}" for key in order)
        lines.append(f"{column:{width}}  {cells}")
    for number, results in enumerate(rounds, 1):
        lines.append(f"\nround {number}:")
        for key in order:
            row = results[key].row()
            lines.append(
                f"  {key:16} {row['creates/s']:7,.0f} creates/s  p50 {row['p50 ms']:.1f} ms"
                f"  p99 {row['p99 ms']:.1f} ms  API CPU {row['API CPU ms / create']:.3f} ms"
                f"  tx {row['transactions / create']:.2f}  statements"
                f" {row['statements / create']:.2f}  load {row['load average (1 min)']:.1f}"
            )
    if top:
        lines.append(
            f"\nTop statements per create (calls / create, execution ms / create; top {top}):"
        )
        for key in order:
            result = rounds[-1][key]
            lines.append(f"\n{result.label}:")
            for calls, ms, query in result.top:
                lines.append(
                    f"  {calls / result.creates:6.2f} {ms / result.creates:7.3f}  {query[:140]}"
                )
    return "\n".join(lines)


def profile_summary(path: Path, limit: int = 25) -> str:
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.sort_stats("tottime").print_stats(limit)
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--creates", type=int, default=5000, help="measured creates per round")
    parser.add_argument("--warmup", type=int, default=500, help="creates before the window")
    parser.add_argument("--in-flight", type=int, default=32, help="concurrent connections")
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default="api,serve", help="comma-separated: api, serve")
    parser.add_argument("--top", type=int, default=8, help="top statements to show")
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="another Ferryman checkout with its own .venv (e.g. a `git worktree` of main),"
        " run beside this one: a before/after in one run",
    )
    parser.add_argument("--profile", type=Path, metavar="DIR", help="profile the first round")
    parser.add_argument(
        "--profiler",
        choices=["cprofile", "pyinstrument"],
        default="cprofile",
        help="pyinstrument (`pip install pyinstrument`) samples: a truer split, a text tree",
    )
    args = parser.parse_args()
    checkouts = [Checkout("this", REPO)]
    if args.baseline:
        if not (args.baseline / ".venv" / "bin" / "python").exists():
            parser.error(f"--baseline {args.baseline}: no .venv/bin/python there")
        checkouts.append(Checkout("baseline", args.baseline.resolve()))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown := [m for m in modes if m not in MODES]:
        parser.error(f"unknown modes: {', '.join(unknown)}")
    systems = [(c, m) for m in modes for c in checkouts]
    order = [f"{c.key} {m}" for c, m in systems]
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)

    cluster = Cluster()
    logs = cluster.dir / "logs"
    rounds: list[dict[str, Result]] = []
    profiles: list[Path] = []
    try:
        log(f"PostgreSQL in {cluster.dir}, port {cluster.port} ...")
        cluster.start()
        logs.mkdir()
        for number in range(1, args.rounds + 1):
            this_order = systems if number % 2 else systems[::-1]
            results: dict[str, Result] = {}
            for checkout, mode in this_order:
                profile = None
                if args.profile and number == 1:
                    suffix = ".txt" if args.profiler == "pyinstrument" else ".prof"
                    profile = args.profile / f"{checkout.key}-{mode}{suffix}"
                    profiles.append(profile)
                tag = f"r{number}_{checkout.key}_{mode}"
                result = run_round(cluster, checkout, mode, args, logs, tag, profile)
                results[result.label] = result
                log(f"{tag}: {result.row()['creates/s']:,.0f} creates/s")
            rounds.append(results)
        print()
        print(
            f"python -m bench.create_throughput {' '.join(sys.argv[1:])}\n"
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs;"
            f" load average now {' / '.join(f'{x:.1f}' for x in os.getloadavg())};"
            f" {args.creates} creates a round, {args.in_flight} in flight over"
            f" {args.client_processes} client processes"
        )
        print()
        print(report(rounds, order, args.top))
        for path in profiles:
            if path.exists():
                print(f"\n{path} (first round{'' if path.suffix == '.txt' else ', by own time'}):")
                print(path.read_text() if path.suffix == ".txt" else profile_summary(path))
        return 0
    except KeyboardInterrupt:
        log("interrupted: stopping everything ...")
        return 130
    finally:
        tear_down(cluster, logs, "creates", "server")


if __name__ == "__main__":
    sys.exit(main())
