"""Slow-reader memory benchmark: what SSE clients that never read cost the API process.

One `ferryman serve --no-worker` child process on a fresh database. Hostile clients open SSE
streams on raw sockets with a tiny receive buffer (`--rcvbuf`) and never read: `--owner-streams`
on the owner stream (live from now) and `--session-streams` on one session whose log already
holds `--backlog` big messages (so they replay it). Then, for `--duration` s at `--rate` a
second, a writer commits big events straight into PostgreSQL with the service's own store
functions (so the same NOTIFY reaches the API's feeds): a new session whose prompt is `--emoji`
emoji (its `session_created` on the owner feed carries the prompt) and a message of as many emoji
on the replayed session. Then every hostile socket closes at once, and `--after-close` s later
the API process's RSS is read again. The database is on $DATABASE_URL's server, else on an
embedded PostgreSQL in a data directory of the benchmarks' own; either way a fresh database is
created for each run and dropped afterwards.

One well-behaved client (the canary) reads the owner stream throughout and counts what it gets:
the hostile clients must not cost it its events.

    python -m bench.slow_readers --duration 60

Prints the API process's RSS at the start, its peak (sampled every 0.2 s, and the kernel's
VmHWM), the median during the writes, and its RSS `--after-close` s after the close; with
`--runs N` (each against a fresh server and database), the median of each figure too. The
server runs under an address-space cap (`--memory-cap-gb`) so that a server that needs more
fails alone instead of taking the machine with it; the figures then say it hit the cap.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import os
import random
import re
import resource
import shlex
import socket
import statistics
import sys
import termios
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, fields

import httpx
import psycopg
from psycopg.rows import dict_row

from app.db.embedded import start_embedded
from app.store.events import append_session_event
from app.store.keys import create_key
from app.store.sessions import NewSession, create_session
from bench.owner_fanout import RssSampler, proc_cpu
from bench.sse_client import Chunked, proc_status, sse_request
from tests.cluster import data_dir_for
from tests.support import ServerProcess, fresh_database, running

MB = 2**20
# Emoticons U+1F600..U+1F64F: 4 bytes each in UTF-8, 12 as a JSON \\u surrogate-pair escape.
EMOJI = [chr(c) for c in range(0x1F600, 0x1F650)]
VARIANTS = 8  # distinct texts the writer cycles through (making one costs ~30 ms)


@dataclass(frozen=True)
class Figures:
    """One run, in MB unless named otherwise."""

    rss_start: float
    rss_peak_sampled: float
    vm_hwm: float
    rss_median_writing: float
    rss_at_close: float
    rss_after_close: float
    streams_open_after_close: int
    events_written: int
    write_seconds: float
    canary_received: int
    server_cpu_pct: float
    hit_cap: bool


async def write_owner_key(url: str) -> tuple[str, str]:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row)
    owner = f"bench-{uuid.uuid4().hex[:8]}"
    async with conn, conn.transaction():
        _, key = await create_key(conn, owner, "bench")
    return owner, key


def new_session(prompt: str) -> NewSession:
    return NewSession(
        prompt=prompt, title="", model="scripted", script=None, tools=None, metadata={}
    )


async def prefill(url: str, owner: str, texts: list[str], backlog: int) -> str:
    """A session whose log holds `backlog` messages of big text after its opening one; its id."""
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row)
    async with conn:
        async with conn.transaction():
            row, _ = await create_session(conn, owner, new_session("the replayed session"), None)
        for n in range(backlog):
            async with conn.transaction():
                data = {"text": texts[n % len(texts)], "delivery": "queued"}
                await append_session_event(conn, row["id"], "user_message", data)
    return str(row["id"])


async def paced(rate: float, duration: float) -> AsyncIterator[int]:
    """0, 1, 2, ...: number n at `n / rate` s from the start, for `duration` s (late ones at
    once, so a slow tick does not lower the rate)."""
    start = time.monotonic()
    for n in range(round(rate * duration)):
        await asyncio.sleep(max(0.0, start + n / rate - time.monotonic()))
        yield n


async def write_events(
    url: str, owner: str, session_id: str, texts: list[str], rate: float, duration: float
) -> tuple[int, float]:
    """At `rate` a second for `duration` s: a session with a big prompt (one owner event) and a
    big message on `session_id`, in one transaction. (owner events written, seconds taken)."""
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row)
    start = time.monotonic()
    async with conn:
        async for n in paced(rate, duration):
            text = texts[n % len(texts)]
            async with conn.transaction():
                await create_session(conn, owner, new_session(text), None)
                data = {"text": text, "delivery": "queued"}
                await append_session_event(conn, uuid.UUID(session_id), "user_message", data)
        return round(rate * duration), time.monotonic() - start


def hostile(port: int, data: bytes, rcvbuf: int) -> socket.socket:
    """A client that asks for a stream and never reads. The receive buffer is set before the
    connection, so the window it advertises is small from the first packet."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    sock.sendall(data)
    return sock


def unread(sock: socket.socket) -> int:
    """Bytes waiting in the socket's receive queue."""
    return int.from_bytes(
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"), sys.byteorder, signed=True
    )


def wait_answered(socks: list[socket.socket], timeout: float = 60.0) -> None:
    """Until every stream has its response headers (bytes wait unread on each socket)."""
    deadline = time.monotonic() + timeout
    while any(unread(s) == 0 for s in socks):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{sum(unread(s) == 0 for s in socks)} streams never answered")
        time.sleep(0.05)


class Canary(threading.Thread):
    """A client that reads the owner stream as fast as it comes and counts its durable frames
    (a frame that starts with `id:`)."""

    def __init__(self, port: int, data: bytes) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(data)
        self.received = 0

    def run(self) -> None:
        with contextlib.suppress(OSError):
            data = b""
            while b"\r\n\r\n" not in data:
                more = self.sock.recv(1 << 16)
                if not more:
                    return
                data += more
            data = data.split(b"\r\n\r\n", 1)[1]
            chunked, rest = Chunked(), b""
            while True:
                rest += chunked.feed(data)
                *frames, rest = rest.split(b"\n\n")
                self.received += sum(1 for f in frames if f.startswith(b"id: "))
                data = self.sock.recv(1 << 20)
                if not data:
                    return

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def streams_open(port: int) -> int:
    """`ferryman_sse_streams_open` summed over kinds, from /metrics (local mode: no token);
    -1 when the server does not answer (it may have died of its memory cap)."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    except httpx.HTTPError:
        return -1
    return round(
        sum(float(v) for v in re.findall(r"^ferryman_sse_streams_open\{.*\} (\S+)$", text, re.M))
    )


def rss_mb(pid: int) -> float:
    return proc_status(pid, "VmRSS") / MB


def settle_rss(pid: int, seconds: float = 1.0) -> float:
    """The median of a few RSS readings (a single one may catch a passing allocation)."""
    readings = []
    for _ in range(5):
        readings.append(rss_mb(pid))
        time.sleep(seconds / 5)
    return statistics.median(readings)


@contextlib.contextmanager
def closing_all(socks: list[socket.socket]) -> Iterator[list[socket.socket]]:
    try:
        yield socks
    finally:
        for sock in socks:
            sock.close()


def run_once(args: argparse.Namespace, url: str, texts: list[str]) -> Figures:
    owner, key = asyncio.run(write_owner_key(url))
    print("writing the replayed session's backlog...", flush=True)
    session_id = asyncio.run(prefill(url, owner, texts, args.backlog))
    env = dict(item.split("=", 1) for item in args.env)
    with running(ServerProcess(url, env=env)) as server:
        pid = server.pid
        cap = int(args.memory_cap_gb * 2**30)
        resource.prlimit(pid, resource.RLIMIT_AS, (cap, cap))
        rss_start = settle_rss(pid)
        owner_request = sse_request("127.0.0.1", server.port, "/api/agent/owner-events", key)
        session_request = sse_request(
            "127.0.0.1", server.port, f"/api/agent/{session_id}/events", key
        )
        canary = Canary(server.port, owner_request)
        canary.start()
        sockets = [
            hostile(server.port, owner_request, args.rcvbuf) for _ in range(args.owner_streams)
        ]
        sockets += [
            hostile(server.port, session_request, args.rcvbuf) for _ in range(args.session_streams)
        ]
        with closing_all(sockets):
            wait_answered(sockets)
            print(f"{len(sockets)} hostile streams open; RSS {rss_mb(pid):.0f} MB", flush=True)
            sampler = RssSampler(pid)
            samples: list[float] = []
            sampler.start()
            watch = threading.Event()

            def record() -> None:
                while not watch.wait(0.5):
                    samples.append(sampler.current / MB)

            recorder = threading.Thread(target=record, daemon=True)
            recorder.start()
            cpu0, wall0 = proc_cpu(pid), time.monotonic()
            written, write_seconds = asyncio.run(
                write_events(url, owner, session_id, texts, args.rate, args.duration)
            )
            cpu = (proc_cpu(pid) - cpu0) / (time.monotonic() - wall0) * 100
            watch.set()
            rss_at_close = rss_mb(pid)
        # The hostile sockets are closed (with unread data: the kernel resets them).
        closed_at = time.monotonic()
        print(f"closed; RSS {rss_at_close:.0f} MB at the close", flush=True)
        while canary.received < written and time.monotonic() < closed_at + args.canary_drain:
            time.sleep(0.1)
        canary.close()
        time.sleep(max(0.0, closed_at + args.after_close - time.monotonic()))
        rss_after = rss_mb(pid)
        sampler.halt.set()
        hwm = proc_status(pid, "VmHWM") / MB
        still_open = streams_open(server.port)
        hit_cap = "MemoryError" in server.logs(tail=None)
    return Figures(
        rss_start=rss_start,
        rss_peak_sampled=max(sampler.peak / MB, rss_after),
        vm_hwm=hwm,
        rss_median_writing=statistics.median(samples) if samples else float("nan"),
        rss_at_close=rss_at_close,
        rss_after_close=rss_after,
        streams_open_after_close=still_open,
        events_written=written,
        write_seconds=write_seconds,
        canary_received=canary.received,
        server_cpu_pct=cpu,
        hit_cap=hit_cap,
    )


def report(runs: list[Figures], after_close: float) -> str:
    labels = {
        "rss_start": "RSS at the start (MB)",
        "rss_peak_sampled": "RSS peak, sampled every 0.2 s (MB)",
        "vm_hwm": "VmHWM, the kernel's peak (MB)",
        "rss_median_writing": "RSS median while writing (MB)",
        "rss_at_close": "RSS when the hostile clients close (MB)",
        "rss_after_close": f"RSS {after_close:g} s after the close (MB)",
        "streams_open_after_close": "SSE streams still open after that",
        "events_written": "owner events written (one session message each)",
        "write_seconds": "seconds the writes took",
        "canary_received": "canary: owner events received",
        "server_cpu_pct": "server CPU while writing (% of a core)",
        "hit_cap": "server hit its address-space cap",
    }
    header = ["figure"] + [f"run {i + 1}" for i in range(len(runs))]
    header += ["median"] if len(runs) > 1 else []
    rows = [header]
    for f in fields(Figures):
        if f.name not in labels:
            continue
        values = [getattr(r, f.name) for r in runs]
        cells = [_cell(v) for v in values]
        if len(runs) > 1:
            cells.append("" if isinstance(values[0], bool) else _cell(statistics.median(values)))
        rows.append([labels[f.name], *cells])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _cell(value: float | int | bool) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--owner-streams", type=int, default=50)
    parser.add_argument("--session-streams", type=int, default=10)
    parser.add_argument(
        "--backlog", type=int, default=500, help="messages the session streams replay"
    )
    parser.add_argument("--emoji", type=int, default=100_000, help="emoji per prompt and message")
    parser.add_argument(
        "--rate", type=float, default=10.0, help="sessions (and messages) per second"
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of writing")
    parser.add_argument(
        "--after-close", type=float, default=10.0, help="seconds from close to reading"
    )
    parser.add_argument("--rcvbuf", type=int, default=2048, help="the hostile clients' SO_RCVBUF")
    parser.add_argument(
        "--canary-drain", type=float, default=30.0, help="seconds the canary may lag"
    )
    parser.add_argument(
        "--runs", type=int, default=1, help="runs, each on a fresh server and database"
    )
    parser.add_argument("--memory-cap-gb", type=float, default=8.0, help="the server's RLIMIT_AS")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="server environment"
    )
    args = parser.parse_args()
    # The bench database goes on $DATABASE_URL's server, else on an embedded PostgreSQL of the
    # benchmarks' own (not the tests').
    admin_url = os.environ.get("DATABASE_URL") or start_embedded(data_dir_for("ferryman-bench"))
    rng = random.Random(args.seed)
    texts = ["".join(rng.choices(EMOJI, k=args.emoji)) for _ in range(VARIANTS)]
    command = "python -m bench.slow_readers " + shlex.join(sys.argv[1:])
    print(
        f"{command}\nmachine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f};"
        f" {args.owner_streams} owner + {args.session_streams} session streams that never read"
        f" (SO_RCVBUF {args.rcvbuf}); backlog {args.backlog}; {args.emoji:,} emoji"
        f" ({len(texts[0].encode()) / 1000:.0f} kB UTF-8)"
        f" at {args.rate:g}/s for {args.duration:g} s",
        flush=True,
    )
    runs: list[Figures] = []
    for n in range(args.runs):
        with fresh_database("ferryman_bench", admin_url) as url:
            runs.append(run_once(args, url, texts))
        print(f"run {n + 1} done", flush=True)
    print()
    print(command)
    print(report(runs, args.after_close))
    return 0


if __name__ == "__main__":
    sys.exit(main())
