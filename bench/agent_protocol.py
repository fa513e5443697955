"""The same agent work through Ferryman's native API, its Agent Protocol surface and Aegra:
runs/s, server CPU per run, PostgreSQL transactions per run, time to first token.

    python -m bench.agent_protocol surface --runs 1000     # /api/agent beside /agent-protocol
    python -m bench.agent_protocol aegra --runs 1000       # /agent-protocol beside Aegra
    python -m bench.agent_protocol all --runs 1000         # the three in one run
    python -m bench.agent_protocol venv                    # Aegra's venv (the others make it too)

**The work** (one run): a model turn that says "Noting." and calls the note tool `put_note`
(which writes a note to the server's database), then a turn that answers "Done.", each turn
streamed token by token. Ferryman runs it with its scripted model; Aegra with the graph in
`bench/peers/aegra/graph.py` (a LangGraph graph with a deterministic fake chat model and a note
tool writing to Aegra's PostgreSQL store).

**The clients**, in this process, `--in-flight` (30) runs at a time, `--runs` (1,000) of them,
each lane starting its next run as its last one ends (each system at its own pace: runs/s and
latency under saturation); with `--rate R`, a run starts every 1/R s instead, still at most
`--in-flight` at once, so that every system serves the same load: the server CPU per run of
two systems is compared there, since a closed loop runs each at a different load, and CPU per
run falls as load rises (claims, reads and writes are batched across sessions):

- `native`: the Ferryman SDK (`AsyncFerryman`): create a session, follow its event stream until
  `session_end`.
- The agent definition (`--definition`): by default both Ferryman surfaces run one stored
  assistant (the native create names it by `assistantId`, the protocol run by `assistant_id`),
  so they do the same work from the same definition; `inline` sends it in every request
  instead (the native create body; the protocol's graph id and the run's `context`). The
  scripted model's script travels in every request either way.
- `protocol` and `aegra`: the official `langgraph-sdk` async client, the same code for both
  servers: `threads.create()`, then `runs.stream(thread, assistant, input={"messages": ...},
  stream_mode=--stream-mode)` until the stream ends.

**The servers**: one `ferryman serve` process (API and worker in one process, worker slots =
`--in-flight`) serves `native` and `protocol`, alternately, on one database; one Aegra 0.11
process (uvicorn, its Redis broker and 3 in-process workers x `--in-flight`/3 jobs: its
leases and reaper exist only with Redis) on a database of its own, in its own venv
(`--aegra-venv`). Both on the PostgreSQL of `--database-url` (default: `$DATABASE_URL`, else
PostgreSQL at 127.0.0.1:5432); every database is created for the run and dropped at the end.
Both log JSON, as deployed.

**The figures**, per pass (each system, each round; rounds alternate the order):

- runs/s: runs over the wall time from the first create to the last stream's end.
- server CPU per run: user + system time of the server process (and any children), from
  /proc, over the pass and a settle of `--settle` s after it (a run's last writes may follow
  its stream's end), divided by the runs. The client's own CPU is in this process, not the
  server's, and shows on its own line.
- transactions per run: commits + rollbacks of the system's database in pg_stat_database,
  read `--settle` s after the pass (backends report at most once a second), minus the reading
  before it; from the same view, the time its backends spent executing statements
  (`active_time`) and the connections opened (`sessions`); statements per run from
  pg_stat_statements when the server has it loaded.
- first event / first token: from the client starting the run (the create request) to its
  first event (protocol: `metadata`; native: the first frame of the session stream) and to
  its first token (protocol: the first `messages` chunk with text or a tool call; native: the
  first `message_delta`, or `assistant_message` if it came first).

Each pass is preceded by `--warmup` runs that are not measured (first requests import code,
fill caches and pools). Medians over rounds, p50/p99 over the runs of a pass, and the ratios
the claims are about: protocol over native server CPU per run (target at most 1.10, at one
`--rate`), Ferryman's protocol surface over Aegra in runs/s (target at least 5, closed loop).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
from psycopg import sql

from bench.compare import read_counters, stop_process
from bench.sse_client import tree_cpu
from bench.stats import percentile

REPO = Path(__file__).resolve().parent.parent
AEGRA_DIR = REPO / "bench" / "peers" / "aegra"
AEGRA_VERSION = "0.11.0"
AEGRA_PIN = f"aegra-api=={AEGRA_VERSION}"
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PROMPT = "Note that k is v, then say done."
NOTE_ARGUMENTS = {"key": "k", "text": "v"}
# Ferryman's side of the work; bench/peers/aegra/graph.py is Aegra's.
SCRIPT: list[dict[str, Any]] = [
    {"text": "Noting.", "toolCalls": [{"name": "put_note", "arguments": NOTE_ARGUMENTS}]},
    {"text": "Done."},
]
TOOLS = ["put_note"]
FERRYMAN_GRAPH = "ferryman"  # the graph id of Ferryman's agent loop on its protocol surface
ASSISTANT_CONTEXT: dict[str, Any] = {"model": "scripted", "tools": TOOLS}
# A stored assistant has no script (it stands for the model's output): every run carries it.
SCRIPT_CONTEXT: dict[str, Any] = {"script": SCRIPT}
RUN_CONTEXT: dict[str, Any] = {**ASSISTANT_CONTEXT, **SCRIPT_CONTEXT}
# `pip install py-spy` puts it beside this venv's python, which need not be on PATH.
PY_SPY = next(
    (str(p) for p in (Path(sys.executable).parent / "py-spy",) if p.exists()),
    shutil.which("py-spy") or "py-spy",
)
RUN_TIMEOUT = 120.0  # seconds one run may take before it counts as failed


# --- one run ----------------------------------------------------------------------------------


@dataclass
class RunRecord:
    """One run's times, in seconds from its start, and whether it did the work."""

    first_event: float = math.nan
    first_token: float = math.nan
    done: float = math.nan
    ok: bool = False
    error: str = ""


class Driver(Protocol):
    """Runs one unit of the work through one surface."""

    label: str

    async def run(self, record: RunRecord, started: float) -> None: ...

    async def close(self) -> None: ...


class NativeDriver:
    """Ferryman's own API through its SDK: create the session, follow its stream to the end."""

    label = "Ferryman /api/agent"

    def __init__(self, base_url: str, key: str, assistant_id: str | None) -> None:
        from ferryman.sdk import AsyncFerryman

        self.client = AsyncFerryman(base_url, api_key=key, timeout=RUN_TIMEOUT)
        self.assistant_id = assistant_id

    async def run(self, record: RunRecord, started: float) -> None:
        if self.assistant_id is not None:
            session = await self.client.create_session(
                PROMPT, assistant_id=self.assistant_id, script=SCRIPT
            )
        else:
            session = await self.client.create_session(
                PROMPT, model="scripted", script=SCRIPT, tools=TOOLS
            )
        async for event in self.client.session_events(session.id):
            now = time.perf_counter() - started
            if math.isnan(record.first_event):
                record.first_event = now
            if event.type in ("message_delta", "assistant_message") and math.isnan(
                record.first_token
            ):
                record.first_token = now
            if event.type == "session_end":
                record.ok = event.data.get("status") == "succeeded"
                record.error = "" if record.ok else json.dumps(event.data)[:200]
                return
        record.error = "the stream ended before session_end"

    async def close(self) -> None:
        await self.client.close()


def is_token(data: Any) -> bool:
    """A `messages` part that carries model output: an AI chunk with text or a tool call."""
    message = data[0] if isinstance(data, list) and data else data
    if not isinstance(message, dict) or not str(message.get("type", "")).startswith("AI"):
        return False
    return bool(message.get("content") or message.get("tool_call_chunks"))


def says_done(data: Any) -> bool:
    message = data[0] if isinstance(data, list) and data else data
    return isinstance(message, dict) and "Done." in str(message.get("content", ""))


class ProtocolDriver:
    """An Agent Protocol server through the official `langgraph-sdk` async client: a thread,
    then a streamed run on it. The same code drives Ferryman's surface and Aegra."""

    def __init__(
        self,
        label: str,
        url: str,
        key: str | None,
        assistant_id: str,
        modes: list[str],
        context: dict[str, Any] | None = None,
    ) -> None:
        from langgraph_sdk import get_client

        self.label = label
        self.client = get_client(url=url, api_key=key, timeout=RUN_TIMEOUT)
        self.input: dict[str, Any] = {"messages": [{"role": "user", "content": PROMPT}]}
        self.assistant_id = assistant_id
        self.modes = modes
        self.context = context

    async def run(self, record: RunRecord, started: float) -> None:
        thread = await self.client.threads.create()
        done = False
        async for part in self.client.runs.stream(
            thread["thread_id"],
            self.assistant_id,
            input=self.input,
            context=self.context,
            stream_mode=self.modes,  # type: ignore[arg-type]
        ):
            now = time.perf_counter() - started
            if math.isnan(record.first_event):
                record.first_event = now
            if part.event.startswith("messages"):
                if math.isnan(record.first_token) and is_token(part.data):
                    record.first_token = now
                done = done or says_done(part.data)
            elif part.event == "values":
                messages = part.data.get("messages") if isinstance(part.data, dict) else None
                done = done or bool(messages and says_done(messages[-1]))
            elif part.event == "error":
                record.error = json.dumps(part.data)[:200]
                return
        record.ok = done
        record.error = "" if done else "the stream ended without the final answer"

    async def close(self) -> None:
        await self.client.aclose()


async def drive(
    driver: Driver, runs: int, in_flight: int, rate: float | None = None
) -> tuple[list[RunRecord], float]:
    """`runs` runs, `in_flight` at a time; their records and the wall time of them all. With
    `rate`, a run starts every 1/`rate` s (the same load on every system, so that batching
    helps each alike), still at most `in_flight` at a time."""
    records = [RunRecord() for _ in range(runs)]
    next_index = iter(range(runs))
    began = time.perf_counter()

    async def one(index: int) -> None:
        record = records[index]
        started = time.perf_counter()
        try:
            async with asyncio.timeout(RUN_TIMEOUT):
                await driver.run(record, started)
        except Exception as exc:  # a failed run is counted, and the pass goes on
            record.error = f"{type(exc).__name__}: {exc}"[:200]
        record.done = time.perf_counter() - started

    async def lane() -> None:
        for index in next_index:  # each lane takes the next run until none is left
            await one(index)

    async def paced(index: int, slots: asyncio.Semaphore) -> None:
        assert rate is not None
        await asyncio.sleep(max(0.0, began + index / rate - time.perf_counter()))
        async with slots:
            await one(index)

    if rate is None:
        await asyncio.gather(*(lane() for _ in range(min(in_flight, runs))))
    else:
        slots = asyncio.Semaphore(in_flight)
        await asyncio.gather(*(paced(index, slots) for index in range(runs)))
    return records, time.perf_counter() - began


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def database_url(admin_url: str, name: str) -> str:
    """`admin_url` (a postgresql:// URL) with database `name`: Aegra takes URLs only."""
    parts = urlsplit(admin_url)
    if not parts.scheme.startswith("postgres"):
        raise SystemExit(f"--database-url must be a postgresql:// URL, not {admin_url!r}")
    return urlunsplit(parts._replace(path=f"/{name}"))


@contextlib.contextmanager
def database(admin_url: str, prefix: str) -> Iterator[str]:
    """A new empty database on the server of `admin_url`, dropped afterwards; its name."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early; its log: {log}\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"server not ready in {timeout:.0f} s; its log: {log}")


@dataclass
class Server:
    """A server process under test, on a database of its own."""

    label: str
    database: str
    proc: subprocess.Popen[bytes]
    base_url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        stop_process(self.proc, timeout=20)


@contextlib.contextmanager
def ferryman_server(
    admin_url: str, in_flight: int, logs: Path, repo: Path
) -> Iterator[tuple[Server, str]]:
    """`ferryman serve` of the checkout `repo` (API and worker in one process) on a fresh
    database, migrated by that checkout; the server and an API key of a fresh owner."""
    from app.config import Settings
    from tests.support import create_owner_key

    with database(admin_url, "protobench_ferryman") as name:
        url = database_url(admin_url, name)
        env = {
            **os.environ,
            "PYTHONPATH": str(repo),  # that checkout's `app`, whatever this venv installed
            "DATABASE_URL": url,
            "FERRYMAN_LOG_FORMAT": "json",
            "FERRYMAN_WORKER_CONCURRENCY": str(in_flight),
            # the shipped stream poll (the test fixtures shorten it)
            "FERRYMAN_POLL_INTERVAL": str(Settings.model_fields["poll_interval"].default),
        }
        subprocess.run([sys.executable, "-m", "app", "migrate"], env=env, cwd=repo, check=True)
        _, key = create_owner_key(url)
        port = free_port()
        log = logs / f"ferryman-{port}.log"
        command = [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [*command, str(port)], env=env, cwd=repo, stdout=out, stderr=subprocess.STDOUT
            )
        server = Server("ferryman", name, proc, f"http://127.0.0.1:{port}", log)
        try:
            wait_ready(proc, f"{server.base_url}/readyz", log, 60)
            yield server, key
        finally:
            server.stop()


def ensure_aegra_venv(venv: Path) -> Path:
    """Aegra's venv, made when missing; its python. Aegra 0.11 declares Python 3.12+ but runs
    on 3.11, where pip would otherwise pick 0.6."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating Aegra's venv at {venv} (aegra-api=={AEGRA_VERSION}) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--ignore-requires-python", AEGRA_PIN],
            check=True,
        )
    return python


def redis_reachable(redis_url: str) -> bool:
    parts = httpx.URL(redis_url)
    with (
        contextlib.suppress(OSError),
        socket.create_connection(
            (parts.host or "127.0.0.1", parts.port or 6379), timeout=2
        ) as sock,
    ):
        sock.sendall(b"PING\r\n")
        return sock.recv(16).startswith(b"+PONG")
    return False


def drop_redis_keys(python: Path, redis_url: str, prefix: str) -> None:
    """Delete the keys Aegra made under `prefix` (its results cache, run counters)."""
    script = (
        "import redis, sys\n"
        "r = redis.Redis.from_url(sys.argv[1])\n"
        "keys = list(r.scan_iter(match=sys.argv[2] + '*', count=1000))\n"
        "for i in range(0, len(keys), 500):\n"
        "    r.delete(*keys[i:i + 500])\n"
    )
    subprocess.run([str(python), "-c", script, redis_url, prefix], check=False, timeout=60)


@contextlib.contextmanager
def aegra_server(
    admin_url: str, venv: Path, redis_url: str, in_flight: int, logs: Path
) -> Iterator[Server]:
    """Aegra under uvicorn, in its venv, with the graph of bench/peers/aegra, its Redis broker
    and workers, on a fresh database (it runs its migrations at start-up)."""
    python = ensure_aegra_venv(venv)
    if not redis_reachable(redis_url):
        raise SystemExit(
            f"Aegra needs Redis at {redis_url} (its leases, queue and replay): start one, e.g."
            ' redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save ""'
        )
    prefix = f"protobench-{uuid.uuid4().hex[:8]}:"
    with database(admin_url, "protobench_aegra") as name:
        port = free_port()
        log = logs / f"aegra-{port}.log"
        env = {
            **os.environ,
            "DATABASE_URL": database_url(admin_url, name),
            "AEGRA_CONFIG": str(AEGRA_DIR / "aegra.json"),
            "ENV_MODE": "PRODUCTION",  # JSON logs, as deployed
            "AUTH_TYPE": "noop",
            "HOST": "127.0.0.1",
            "PORT": str(port),
            "REDIS_BROKER_ENABLED": "true",
            "REDIS_URL": redis_url,
            "REDIS_CHANNEL_PREFIX": f"{prefix}run:",
            "WORKER_QUEUE_KEY": f"{prefix}jobs",
            "WORKER_COUNT": "3",
            "N_JOBS_PER_WORKER": str(max(1, math.ceil(in_flight / 3))),
            "PYTHONPATH": "",
        }
        command = [str(python), "-m", "uvicorn", "aegra_api.main:app", "--host", "127.0.0.1"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [*command, "--port", str(port)],
                env=env,
                cwd=AEGRA_DIR,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        server = Server("aegra", name, proc, f"http://127.0.0.1:{port}", log)
        try:
            wait_ready(proc, f"{server.base_url}/health", log, 120)
            yield server
        finally:
            server.stop()
            drop_redis_keys(python, redis_url, prefix)


# --- measuring --------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """The counters of one server and its database at one moment."""

    server_cpu: float
    client_cpu: float
    transactions: int
    active_ms: float
    connections: int
    statements: int | None


def database_activity(admin: psycopg.Connection[Any], name: str) -> tuple[float, int]:
    """Milliseconds the backends of database `name` spent executing statements, and the
    connections ever opened to it (pg_stat_database, PostgreSQL 14+)."""
    row = admin.execute(
        "SELECT coalesce(active_time, 0), coalesce(sessions, 0) FROM pg_stat_database"
        " WHERE datname = %s",
        (name,),
    ).fetchone()
    return (float(row[0]), int(row[1])) if row else (0.0, 0)


def has_statements(admin: psycopg.Connection[Any]) -> bool:
    row = admin.execute(
        "SELECT current_setting('shared_preload_libraries') LIKE '%%pg_stat_statements%%'"
        " AND EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements')"
    ).fetchone()
    return bool(row and row[0])


def statement_calls(admin: psycopg.Connection[Any], name: str) -> int:
    row = admin.execute(
        "SELECT coalesce(sum(s.calls), 0) FROM pg_stat_statements s"
        " JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s",
        (name,),
    ).fetchone()
    return int(row[0]) if row else 0


def snapshot(admin: psycopg.Connection[Any], server: Server, statements: bool) -> Snapshot:
    counters = read_counters(admin, server.database)  # clears the stats snapshot first
    active_ms, connections = database_activity(admin, server.database)
    return Snapshot(
        server_cpu=tree_cpu(server.pid),
        client_cpu=time.process_time(),
        transactions=counters.commits + counters.rollbacks,
        active_ms=active_ms,
        connections=connections,
        statements=statement_calls(admin, server.database) if statements else None,
    )


@dataclass
class Pass:
    """The figures of one system in one round."""

    system: str
    runs: int
    ok: int
    wall: float
    server_cpu: float
    client_cpu: float
    pg_active: float
    connections: int
    transactions: int
    statements: int | None
    first_event: list[float]
    first_token: list[float]
    durations: list[float]
    errors: list[str] = field(default_factory=list)
    profile: Path | None = None  # the pass's py-spy recording (--py-spy)

    @property
    def figures(self) -> dict[str, float]:
        per_run = 1000 / self.runs  # ms per run from seconds
        figures = {
            "runs/s": self.runs / self.wall,
            "server CPU ms/run": self.server_cpu * per_run,
            "client CPU ms/run": self.client_cpu * per_run,
            "transactions/run": self.transactions / self.runs,
            "PostgreSQL active ms/run": self.pg_active * per_run,
            "new connections/run": self.connections / self.runs,
        }
        if self.statements is not None:
            figures["statements/run"] = self.statements / self.runs
        for label, values in (
            ("first event", self.first_event),
            ("first token", self.first_token),
            ("run", self.durations),
        ):
            figures[f"{label} p50 ms"] = percentile(values, 50) * 1000
            figures[f"{label} p99 ms"] = percentile(values, 99) * 1000
        return figures


def py_spy(
    args: argparse.Namespace, server: Server, system: str
) -> tuple[subprocess.Popen[bytes], Path] | None:
    """py-spy recording the server through a measured pass, when `--py-spy DIR` asks for it:
    DIR/<system>-<n>.txt, collapsed stacks (`summarize_profile` reads them)."""
    if not args.py_spy:
        return None
    directory = Path(args.py_spy)
    directory.mkdir(parents=True, exist_ok=True)
    n = sum(1 for _ in directory.glob(f"{system}-*.txt")) + 1
    out = directory / f"{system}-{n}.txt"
    command = [args.py_spy_bin, "record", "-p", str(server.pid), "-o", str(out), "-f", "raw"]
    proc = subprocess.Popen(
        [*command, "-r", "100", "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    return proc, out


# Frames on every request's stack or on every stack at all: they rank nothing.
ON_EVERY_STACK = ("app/__main__.py", "app/cli/", "app/api/middleware.py")


def summarize_profile(path: Path, top: int = 15) -> str:
    """The functions of Ferryman's own code (app/) with the largest share of a py-spy
    recording's samples, each counted once per stack it is on (inclusive)."""
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        total += int(count)
        # py-spy names a frame `function (path:line)`, paths relative to the server's cwd
        frames = {
            f
            for f in stack.split(";")
            if ("(app/" in f or "/app/" in f) and not any(skip in f for skip in ON_EVERY_STACK)
        }
        for frame in frames:
            function, _, where = frame.partition(" (")
            name = f"{function} app/{where.rsplit('app/', 1)[-1].split(':')[0]}"
            inclusive[name] = inclusive.get(name, 0) + int(count)
    ranked = sorted(inclusive.items(), key=lambda item: -item[1])[:top]
    lines = [f"{path}: {total} samples; app/ functions, inclusive share:"]
    lines += [f"  {100 * n / max(total, 1):5.1f} %  {name}" for name, n in ranked]
    return "\n".join(lines)


def finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def measure(
    system: str,
    driver: Driver,
    server: Server,
    admin: psycopg.Connection[Any],
    args: argparse.Namespace,
    statements: bool,
    loop: asyncio.AbstractEventLoop,
) -> Pass:
    """Warm up, then one measured pass of `args.runs` runs through `driver`."""
    loop_run = loop.run_until_complete
    if args.warmup:
        warm, _ = loop_run(drive(driver, args.warmup, args.in_flight, args.rate))
        failed = [r.error for r in warm if not r.ok]
        if failed:
            raise SystemExit(f"{system}: {len(failed)} warm-up runs failed, e.g. {failed[0]}")
    time.sleep(args.settle)
    spy = py_spy(args, server, system)
    before = snapshot(admin, server, statements)
    records, wall = loop_run(drive(driver, args.runs, args.in_flight, args.rate))
    client_cpu = time.process_time() - before.client_cpu
    if spy is not None:
        spy[0].send_signal(signal.SIGINT)  # py-spy writes its file when interrupted
        spy[0].wait(60)
    time.sleep(args.settle)
    after = snapshot(admin, server, statements)
    ok = [r for r in records if r.ok]
    return Pass(
        system=system,
        runs=args.runs,
        ok=len(ok),
        wall=wall,
        server_cpu=after.server_cpu - before.server_cpu,
        client_cpu=client_cpu,
        pg_active=(after.active_ms - before.active_ms) / 1000,
        connections=after.connections - before.connections,
        transactions=after.transactions - before.transactions,
        statements=(
            after.statements - before.statements
            if after.statements is not None and before.statements is not None
            else None
        ),
        first_event=finite([r.first_event for r in ok]),
        first_token=finite([r.first_token for r in ok]),
        durations=[r.done for r in ok],
        errors=[r.error for r in records if not r.ok],
        profile=spy[1] if spy else None,
    )


# --- the systems ------------------------------------------------------------------------------

LABELS = {
    "native": "Ferryman /api/agent (SDK)",
    "protocol": "Ferryman /agent-protocol (langgraph-sdk)",
    "aegra": f"Aegra {AEGRA_VERSION} (langgraph-sdk)",
}
SUBCOMMANDS = {
    "surface": ["native", "protocol"],
    "aegra": ["protocol", "aegra"],
    "all": ["native", "protocol", "aegra"],
}


def ferryman_assistant(url: str, key: str) -> str:
    """A stored assistant with the work's definition but its script (which each run carries:
    it stands for the model's output), made through the protocol surface."""
    from langgraph_sdk import get_sync_client

    client = get_sync_client(url=url, api_key=key)
    try:
        assistant = client.assistants.create(
            graph_id=FERRYMAN_GRAPH, name="protobench", context=ASSISTANT_CONTEXT
        )
    finally:
        client.http.client.close()
    return str(assistant["assistant_id"])


def protocol_served(url: str, key: str) -> str | None:
    """None if an Agent Protocol answers at `url`, else what answered instead."""
    try:
        response = httpx.post(
            f"{url}/threads/search", json={"limit": 1}, headers={"x-api-key": key}, timeout=10
        )
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    if response.status_code == 200:
        return None
    return f"POST {url}/threads/search answered {response.status_code}: {response.text[:200]}"


@contextlib.contextmanager
def drivers(
    systems: list[str], args: argparse.Namespace, logs: Path, loop: asyncio.AbstractEventLoop
) -> Iterator[dict[str, tuple[Driver, Server]]]:
    """The servers the systems need, started, and a driver for each system that can run."""
    with contextlib.ExitStack() as stack:
        made: dict[str, tuple[Driver, Server]] = {}
        modes = args.stream_mode.split(",")
        if {"native", "protocol"} & set(systems):
            ferryman, key = stack.enter_context(
                ferryman_server(args.database_url, args.in_flight, logs, Path(args.ferryman_repo))
            )
            print(f"ferryman serve: pid {ferryman.pid}, {ferryman.base_url}, log {ferryman.log}")
            url = ferryman.base_url + args.prefix
            missing = protocol_served(url, key)
            stored = args.definition == "assistant" and missing is None
            assistant = ferryman_assistant(url, key) if stored else None
            print(
                f"definition: the stored assistant {assistant} on both surfaces"
                if assistant
                else "definition: in each request (native: the create body; protocol: the"
                f" graph id {FERRYMAN_GRAPH!r} and the run's context)"
            )
            if "native" in systems:
                made["native"] = (NativeDriver(ferryman.base_url, key, assistant), ferryman)
            if "protocol" in systems:
                if missing is None:
                    driver = ProtocolDriver(
                        LABELS["protocol"],
                        url,
                        key,
                        assistant or FERRYMAN_GRAPH,
                        modes,
                        SCRIPT_CONTEXT if assistant else RUN_CONTEXT,
                    )
                    made["protocol"] = (driver, ferryman)
                else:
                    print(
                        f"SKIPPED protocol: this build serves no Agent Protocol at {url}: {missing}"
                    )
        if "aegra" in systems:
            venv = Path(args.aegra_venv)
            aegra = stack.enter_context(
                aegra_server(args.database_url, venv, args.redis_url, args.in_flight, logs)
            )
            print(f"aegra: pid {aegra.pid}, {aegra.base_url}, log {aegra.log}")
            made["aegra"] = (
                ProtocolDriver(LABELS["aegra"], aegra.base_url, None, "agent", modes),
                aegra,
            )
        try:
            yield made
        finally:
            for used, _ in made.values():
                loop.run_until_complete(used.close())


# --- the report -------------------------------------------------------------------------------


def median_figures(passes: list[Pass]) -> dict[str, float]:
    rows = [p.figures for p in passes]
    return {name: statistics.median(row[name] for row in rows) for name in rows[0]}


def fmt(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def ratio_line(label: str, a: float, b: float, target: str, met: bool) -> str:
    return f"{label}: {a / b:.2f}  (target {target}: {'met' if met else 'NOT met'})"


def report(systems: list[str], passes: list[Pass], rate: float | None = None) -> str:
    by_system = {s: [p for p in passes if p.system == s] for s in systems}
    by_system = {s: ps for s, ps in by_system.items() if ps}
    medians = {s: median_figures(ps) for s, ps in by_system.items()}
    names = list(next(iter(medians.values())))
    width = max(len(n) for n in names) + 2
    header = "".join(f"{LABELS[s]:>44}" for s in medians)
    lines = [f"{'median over rounds':<{width}}{header}"]
    for name in names:
        lines.append(f"{name:<{width}}" + "".join(f"{fmt(m[name]):>44}" for m in medians.values()))
    lines.append("")
    for s, ps in by_system.items():
        rounds = ", ".join(
            f"{p.figures['runs/s']:.1f} runs/s {p.figures['server CPU ms/run']:.2f} ms "
            f"{p.figures['transactions/run']:.2f} tx ({p.ok}/{p.runs} ok)"
            for p in ps
        )
        lines.append(f"{s} by round: {rounds}")
        errors = [e for p in ps for e in p.errors]
        if errors:
            lines.append(f"  {len(errors)} failed runs, e.g. {errors[0]}")
    lines.append("")
    if "native" in medians and "protocol" in medians:
        native, protocol = medians["native"], medians["protocol"]
        cpu = protocol["server CPU ms/run"] / native["server CPU ms/run"]
        label = "protocol / native, server CPU per run"
        if rate is None:
            lines.append(
                f"{label}: {cpu:.2f} (closed loop: each surface at its own load; the target,"
                " at most 1.10, is judged at one --rate)"
            )
        else:
            lines.append(
                ratio_line(
                    f"{label} at {rate:g} runs/s",
                    protocol["server CPU ms/run"],
                    native["server CPU ms/run"],
                    "<= 1.10",
                    cpu <= 1.10,
                )
            )
        lines.append(f"protocol / native, runs/s: {protocol['runs/s'] / native['runs/s']:.2f}")
        lines.append(
            "protocol / native, transactions per run: "
            f"{protocol['transactions/run'] / native['transactions/run']:.2f}"
        )
    if "protocol" in medians and "aegra" in medians:
        protocol, aegra = medians["protocol"], medians["aegra"]
        speed = protocol["runs/s"] / aegra["runs/s"]
        lines.append(
            ratio_line(
                "Ferryman protocol / Aegra, runs/s",
                protocol["runs/s"],
                aegra["runs/s"],
                ">= 5",
                speed >= 5,
            )
        )
        lines.append(
            "Aegra / Ferryman protocol, server CPU per run: "
            f"{aegra['server CPU ms/run'] / protocol['server CPU ms/run']:.2f}; transactions per "
            f"run: {aegra['transactions/run'] / protocol['transactions/run']:.2f}"
        )
    if "native" in medians and "aegra" in medians:
        speed = medians["native"]["runs/s"] / medians["aegra"]["runs/s"]
        lines.append(f"Ferryman native / Aegra, runs/s: {speed:.2f}")
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    root = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = root.add_subparsers(dest="command", required=True)
    venv = commands.add_parser("venv", help="create Aegra's venv (the other commands do too)")
    for command in (
        venv,
        *(
            commands.add_parser(name, help=" beside ".join(systems))
            for name, systems in SUBCOMMANDS.items()
        ),
    ):
        command.add_argument(
            "--aegra-venv",
            default=str(REPO / "bench" / ".venv-aegra"),
            help="Aegra's own venv (made when missing)",
        )
        if command is venv:
            continue
        command.add_argument("--runs", type=int, default=1000, help="measured runs per pass")
        command.add_argument("--in-flight", type=int, default=30, help="runs at once")
        command.add_argument("--rounds", type=int, default=1, help="passes per system")
        command.add_argument(
            "--rate",
            type=float,
            help="start a run every 1/RATE s (the same load on each system) instead of a new"
            " one as each of the --in-flight lanes ends (each system at its own pace)",
        )
        command.add_argument("--warmup", type=int, default=30, help="unmeasured runs first")
        command.add_argument("--settle", type=float, default=2.0, help="seconds around a pass")
        command.add_argument(
            "--stream-mode",
            default="values,messages-tuple",
            help="the protocol runs' stream modes (what useStream asks for)",
        )
        command.add_argument("--prefix", default="/agent-protocol", help="Ferryman's protocol path")
        command.add_argument(
            "--definition",
            choices=("assistant", "inline"),
            default="assistant",
            help="where Ferryman's runs take their agent definition: one stored assistant for"
            " both surfaces, or each request's own (native create body, protocol run context)",
        )
        command.add_argument(
            "--ferryman-repo",
            default=str(REPO),
            help="the checkout whose `ferryman serve` runs (another worktree: before and after)",
        )
        command.add_argument(
            "--database-url",
            default=os.environ.get("DATABASE_URL") or DEFAULT_ADMIN_URL,
            help="a PostgreSQL role that may create databases",
        )
        command.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="for Aegra")
        command.add_argument("--logs", default="/tmp", help="where the servers' logs go")
        command.add_argument(
            "--py-spy",
            metavar="DIR",
            help="record the server with py-spy through each measured pass, into DIR",
        )
        command.add_argument("--py-spy-bin", default=PY_SPY)
    args = root.parse_args(argv)
    if args.command != "venv" and (args.runs < 1 or args.in_flight < 1 or args.rounds < 1):
        root.error("--runs, --in-flight and --rounds are at least 1")
    if args.command != "venv" and args.rate is not None and args.rate <= 0:
        root.error("--rate is more than 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "venv":
        print(ensure_aegra_venv(Path(args.aegra_venv)))
        return 0
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    systems = SUBCOMMANDS[args.command]
    logs = Path(args.logs)
    passes: list[Pass] = []
    with (
        psycopg.connect(args.database_url, autocommit=True) as admin,
        drivers(systems, args, logs, loop) as made,
    ):
        statements = has_statements(admin)
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        print(
            f"{started}: {args.runs} runs x {args.rounds} rounds, {args.in_flight} in flight"
            f"{f' at most, {args.rate:g} started a second' if args.rate else ''},"
            f" warm-up {args.warmup}; stream modes {args.stream_mode}; load"
            f" {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
            flush=True,
        )
        order = [s for s in systems if s in made]
        for round_index in range(args.rounds):
            for system in order if round_index % 2 == 0 else order[::-1]:
                driver, server = made[system]
                result = measure(system, driver, server, admin, args, statements, loop)
                figures = result.figures
                print(
                    f"  round {round_index + 1} {system}: {result.ok}/{result.runs} ok,"
                    f" {figures['runs/s']:.1f} runs/s, server {figures['server CPU ms/run']:.2f}"
                    f" ms/run, {figures['transactions/run']:.2f} tx/run, first token p50"
                    f" {figures['first token p50 ms']:.1f} ms",
                    flush=True,
                )
                passes.append(result)
    for recorded in passes:
        if recorded.profile is not None and recorded.profile.exists():
            print(summarize_profile(recorded.profile))
    print()
    print(f"load at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(report(systems, passes, args.rate))
    missing = [s for s in systems if s not in {p.system for p in passes}]
    return 1 if missing or any(p.ok < p.runs for p in passes) else 0


if __name__ == "__main__":
    sys.exit(main())
