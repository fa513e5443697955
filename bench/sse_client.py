"""The benchmarks' raw SSE client, and the process figures their parents sample.

A subscriber is a bare asyncio Protocol speaking HTTP/1.1 (no StreamReader, no task per read):
it writes the request, checks the status line, de-chunks the body, splits it into frames and
hands each to `frame` with the time its bytes came in. Each benchmark subclasses it to keep what
it measures; thousands of them share one event loop per client process, so it stays cheap.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import math
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, cast

# --------------------------------------------------------------------------------------------
# Client side (runs in the client processes)


class Chunked:
    """Incremental HTTP/1.1 chunked transfer decoding, linear in the bytes fed: a subscriber
    that fell behind reads hundreds of chunks at once, and cutting the rest of its buffer after
    each (as this did) cost it the square of that, so it fell further behind."""

    def __init__(self) -> None:
        self.raw = b""
        self.size = -1
        self.done = False

    def feed(self, data: bytes) -> bytes:
        raw = self.raw + data if self.raw else data
        at = 0
        out: list[bytes] = []
        while not self.done:
            if self.size < 0:
                end = raw.find(b"\r\n", at)
                if end < 0:
                    break
                self.size = int(raw[at:end].split(b";")[0], 16)
                at = end + 2
                if self.size == 0:
                    self.done = True
                    break
            if len(raw) - at < self.size + 2:
                break
            out.append(raw[at : at + self.size])
            at += self.size + 2
            self.size = -1
        self.raw = raw[at:]
        return b"".join(out)


@dataclass
class Subscription:
    """What every subscriber's record has; benchmarks add what they measure."""

    caught_up: bool = False
    error: str | None = None


class ClientState:
    """One client process's state, shared by its subscribers."""

    def __init__(self, connected: Any) -> None:
        self.connected = connected  # shared counter of subscribers past `caught_up`
        self.stopping = False  # set before the streams are cut: no error for that


S = TypeVar("S", bound=Subscription)
C = TypeVar("C", bound=ClientState)


class SseProtocol(asyncio.Protocol, Generic[S, C]):
    """One subscriber. `opened` resolves at `caught_up` (or on failure), `closed` on failure:
    the stream is meant to run until the benchmark cancels it."""

    # Whether the body's last chunk is a failure at once, rather than when the connection goes.
    end_fails: ClassVar[bool] = True

    def __init__(self, sub: S, state: C, request: bytes) -> None:
        self.sub, self.state, self.request = sub, state, request
        self.head = b""
        self.in_body = False
        self.chunked: Chunked | None = None
        self.body = b""
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.WriteTransport, transport).write(self.request)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        now = time.time()  # first: every frame in these bytes arrived now
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self.head[:end], self.head[end + 4 :]
            status = head.split(b"\r\n", 1)[0]
            if b" 200 " not in status:
                self.fail(f"answered {status.decode(errors='replace')}")
                return
            self.in_body = True
            if b"transfer-encoding: chunked" in head.lower():
                self.chunked = Chunked()
        body = self.body + (self.chunked.feed(data) if self.chunked else data)
        start = 0
        while (end := body.find(b"\n\n", start)) >= 0:
            self.frame(body[start:end], now)
            start = end + 2
        self.body = body[start:]
        if self.end_fails and self.chunked is not None and self.chunked.done:
            self.fail("stream ended by the server")

    def frame(self, frame: bytes, now: float) -> None:
        """One SSE frame (without its blank line) that arrived at `now` (epoch seconds)."""

    def catch_up(self) -> None:
        """The stream said `caught_up`: count it and let the next subscriber connect."""
        self.sub.caught_up = True
        with self.state.connected.get_lock():
            self.state.connected.value += 1
        if not self.opened.done():
            self.opened.set_result(None)

    def fail(self, error: str) -> None:
        if self.sub.error is None and not self.state.stopping:
            self.sub.error = error
        for future in (self.opened, self.closed):
            if not future.done():
                future.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(f"stream closed by the server ({exc})" if exc else "stream closed by the server")


def sse_request(host: str, port: int, path: str, key: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}Accept: text/event-stream\r\n\r\n"
    ).encode()


async def subscribe(
    host: str, port: int, protocol: SseProtocol[Any, Any], gate: asyncio.Semaphore
) -> None:
    """Run one subscriber until it fails or is cancelled. `gate` bounds the connections still
    being set up (until `caught_up`), so a thousand do not hit the server at once."""
    loop = asyncio.get_running_loop()
    transport: asyncio.BaseTransport | None = None
    try:
        async with gate:
            transport, _ = await loop.create_connection(lambda: protocol, host, port)
            await protocol.opened
        await protocol.closed
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        protocol.sub.error = f"{type(exc).__name__}: {exc}"
    finally:
        if transport is not None:
            transport.close()


ClientMain = Callable[..., Coroutine[Any, Any, None]]


def client_process(main: ClientMain, *args: Any) -> None:
    """A client process's target: `main(*args)` on a fresh uvloop event loop (the servers run on
    uvloop too): asyncio's own loop cost the subscribers more CPU per frame than the API spent
    sending it, on the same cores."""
    import uvloop

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    uvloop.run(main(*args))


class Clients:
    """The client processes of one run and what they share with the parent: `connected`
    (subscribers past `caught_up`, all processes), `counters` (`width` a process, each writes
    its own), `stop`, and `results` (one item from each process at the end)."""

    def __init__(self, nprocs: int, width: int = 1) -> None:
        self.ctx = mp.get_context("spawn")
        self.connected = self.ctx.Value("i", 0)
        self.counters = self.ctx.Array("q", width * nprocs, lock=False)
        self.stop = self.ctx.Event()
        self.results = self.ctx.Queue()
        self.procs: list[Any] = []  # filled as they start, for the caller's cleanup

    def start(self, main: ClientMain, port: int, shares: list[tuple[Any, ...]]) -> None:
        """Process i runs `main(i, "127.0.0.1", port, *shares[i], connected, counters, stop,
        results)`."""
        shared = (self.connected, self.counters, self.stop, self.results)
        for i, share in enumerate(shares):
            proc = self.ctx.Process(
                target=client_process,
                args=(main, i, "127.0.0.1", port, *share, *shared),
                name=f"bench-client-{i}",
            )
            proc.start()
            self.procs.append(proc)

    def collect(self, timeout: float) -> list[Any]:
        """Tell the clients to stop; what each sent back, in the order they came."""
        self.stop.set()
        collected = [self.results.get(timeout=timeout) for _ in self.procs]
        for proc in self.procs:
            proc.join(10)
        return collected


# --------------------------------------------------------------------------------------------
# Process figures (the parents)


def proc_status(pid: int, field_name: str) -> int:
    """A kB field of /proc/<pid>/status (VmRSS, VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    return 0


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]
    return float(sum(values) - idle), float(sum(values))


def tree_cpu(pid: int, gone: float = math.nan) -> float:
    """CPU seconds of a process, its live descendants and the children it reaped; `gone` once
    the process is."""
    import psutil

    try:
        proc = psutil.Process(pid)
        times = proc.cpu_times()
        total = times.user + times.system + times.children_user + times.children_system
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                ct = child.cpu_times()
                total += ct.user + ct.system
        return float(total)
    except psutil.NoSuchProcess:
        return gone


def set_autogroup_nice(pid: str, nice: int) -> int | None:
    """Set the niceness of the scheduler autogroup of `pid`; return the old one (None if the
    kernel has no autogroups or we may not)."""
    path = Path(f"/proc/{pid}/autogroup")
    try:
        old = int(path.read_text().split()[-1])
        path.write_text(str(nice))
    except (OSError, ValueError, IndexError):
        return None
    return old


def renice(nice: int) -> None:
    """Add `nice` to this process's niceness, and give its session's autogroup the same."""
    os.nice(nice)
    # With autogroup scheduling (the default on desktop-style kernels, and here) niceness
    # only ranks processes within one session; between sessions each group gets an equal
    # share. So the session's group gets the same niceness (restored on exit).
    restore = set_autogroup_nice("self", nice)
    if restore is not None:
        atexit.register(set_autogroup_nice, "self", restore)
