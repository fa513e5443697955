"""Chaos soak: sessions with tool calls and notes over several worker processes while a killer
SIGKILLs a random worker every few seconds (and restarts it) and the database is restarted once;
an API server serves a client that follows the owner feed the whole time, reconnecting with
Last-Event-ID whenever the stream drops.

With `--hosts N` the processes run on N test hosts (network namespaces, tests/netns.py; root
and iproute2), each an API process and a worker, against a PostgreSQL the hosts reach over their
links; one client per host follows the owner feed, moving to another host whenever its stream
drops, and one host is partitioned once (its link down for `--partition-for`, longer than the
lease TTL, then up). With `--pgbouncer` every process's DATABASE_URL goes through one PgBouncer
in transaction mode (tests/pgbouncer.py) and FERRYMAN_DIRECT_DATABASE_URL straight to
PostgreSQL; PgBouncer is SIGKILLed and started again once. At the end it checks:

- every session is terminal (`succeeded`);
- each client saw every owner event id 1..N exactly once, and the table holds exactly 1..N;
- every session's seqs are contiguous; events ordered by seq have non-decreasing attempts (no
  write of a dead attempt landed after a newer attempt's first event);
- each `session_resumed` repaired exactly the calls its predecessors left unanswered, every call
  is answered once, and notes hold one row per key.

It runs its own embedded PostgreSQL cluster (a dedicated data directory) because it stops and
starts it; on test hosts, a PostgreSQL of its own that listens on their links (the database is
not restarted there: PgBouncer is). Usage:

    python bench/chaos_soak.py --sessions 200 --workers 3 --kill-every 3 --duration 120
    python -m bench.chaos_soak --hosts 3 --pgbouncer --sessions 200 --duration 90

`tests/test_chaos.py` runs CI-sized versions of both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import random
import signal
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import psycopg  # noqa: E402
from psycopg.rows import dict_row  # noqa: E402

from app.db import migrate  # noqa: E402
from bench import compare  # noqa: E402
from bench.stats import percentile  # noqa: E402
from tests import netns  # noqa: E402
from tests.cluster import Cluster, data_dir_for  # noqa: E402
from tests.pgbouncer import PgBouncer, pgbouncer  # noqa: E402
from tests.support import (  # noqa: E402
    ServerProcess,
    WorkerProcess,
    create_owner_key,
    sse,
    wait_logged,
)

LEASE_LOST = "lease lost; run stops writing"  # a worker's log line for a run fenced out
# The API processes' keep-alive: a client that hears nothing for a few of them moves on.
PING_INTERVAL = 2.0
INTERRUPTED = {"isError": True, "interrupted": True, "content": "worker interrupted"}


# --- workers ---------------------------------------------------------------------------------


def worker_ready(worker: WorkerProcess) -> bool:
    with open(worker.log_path, errors="replace") as f:
        return "started (concurrency" in f.read()


@dataclass(frozen=True)
class Place:
    """Where processes run (a test host, or None: this machine) and how they reach the
    database from there: `env` holds FERRYMAN_DIRECT_DATABASE_URL behind PgBouncer."""

    database_url: str
    env: dict[str, str]
    host: netns.Host | None = None


@dataclass
class Fleet:
    """Worker processes, spread over `places` in turn; killed or crashed ones are replaced in
    their place, so `size` keep running."""

    places: list[Place]
    env: dict[str, str]
    size: int
    concurrency: int
    alive: list[WorkerProcess] = field(default_factory=list)
    gone: list[WorkerProcess] = field(default_factory=list)
    kills: dict[int, float] = field(default_factory=dict)  # pid -> moment of SIGKILL

    def spawn(self, worker: WorkerProcess) -> None:
        """Start a copy of `worker` (same database, settings and host)."""
        self.alive.append(dataclasses.replace(worker).start())

    def start(self, timeout: float = 90) -> None:
        for index in range(self.size):
            place = self.places[index % len(self.places)]
            env = {**self.env, **place.env}
            worker = WorkerProcess(
                place.database_url, env=env, netns=place.host, concurrency=self.concurrency
            )
            self.spawn(worker)
        deadline = time.monotonic() + timeout
        while not all(worker_ready(w) for w in self.alive):
            for worker in self.alive:
                assert worker.proc is not None
                if worker.proc.poll() is not None:
                    raise RuntimeError(f"worker exited early:\n{worker.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError("workers not ready in time")
            time.sleep(0.1)

    def ready(self) -> list[WorkerProcess]:
        return [w for w in self.alive if w.proc and w.proc.poll() is None and worker_ready(w)]

    def replace_exited(self) -> int:
        """Replace workers that exited on their own (e.g. started while the database was down)."""
        replaced = 0
        for worker in list(self.alive):
            assert worker.proc is not None
            if worker.proc.poll() is not None:
                self.alive.remove(worker)
                self.gone.append(worker)
                self.spawn(worker)
                replaced += 1
        return replaced

    def kill(self, worker: WorkerProcess) -> None:
        worker.signal(signal.SIGKILL)
        self.kills[worker.pid] = time.monotonic()
        assert worker.proc is not None
        worker.proc.wait(10)
        self.alive.remove(worker)
        self.gone.append(worker)
        self.spawn(worker)

    def stop(self) -> None:
        for worker in self.alive:
            with contextlib.suppress(Exception):
                worker.signal(signal.SIGTERM)
        for worker in self.alive:
            with contextlib.suppress(Exception):
                worker.stop()

    def logs(self) -> str:
        out = []
        for worker in [*self.alive, *self.gone]:
            with contextlib.suppress(OSError), open(worker.log_path, errors="replace") as f:
                out.append(f.read())
        return "\n".join(out)


# --- the owner feed client ---------------------------------------------------------------------


@dataclass
class OwnerFeed:
    """Everything the owner stream delivered, across reconnects."""

    ids: list[int] = field(default_factory=list)
    last_id: str = "0"
    connects: int = 0
    drops: int = 0
    hang_ups: int = 0
    # Reconnects to another API host after a drop.
    moves: int = 0
    resyncs: list[dict[str, Any]] = field(default_factory=list)
    # session id -> [(receipt moment, session_resumed data)]
    resumed: dict[str, list[tuple[float, dict[str, Any]]]] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


async def follow_owner(
    http: httpx.AsyncClient,
    servers: list[str],
    first: int,
    feed: OwnerFeed,
    stop: asyncio.Event,
    rng: random.Random,
    hang_up_every: float | None,
) -> None:
    """Follow the owner stream from id 0 on API server `servers[first]`; whenever it drops
    (and, with `hang_up_every`, at random moments of our own choosing) reconnect from the last
    id seen, as EventSource does: after a drop to the next server, after a hang-up to any."""
    at = first
    while not stop.is_set():
        limit = rng.uniform(0.5, 1.5) * hang_up_every if hang_up_every else None
        path = f"{servers[at]}/api/agent/owner-events"
        try:
            async with (
                asyncio.timeout(limit),
                sse(http, path, last_event_id=feed.last_id) as events,
            ):
                feed.connects += 1
                async for event in events:
                    if not event.data:
                        continue
                    envelope = json.loads(event.data)
                    if event.event == "resync_required":
                        feed.resyncs.append(envelope)
                        continue
                    if not event.id or envelope.get("id") != event.id:
                        continue  # control frame (httpx-sse repeats the last id on every block)
                    feed.ids.append(int(event.id))
                    feed.last_id = event.id
                    feed.changed.set()
                    if envelope["type"] == "session_resumed":
                        feed.resumed.setdefault(envelope["sessionId"], []).append(
                            (time.monotonic(), envelope["data"])
                        )
        except TimeoutError:
            feed.hang_ups += 1
            at = rng.randrange(len(servers))
            continue  # we hung up: reconnect at once
        except httpx.HTTPError:
            if stop.is_set():
                return  # the client closed under the stream: not a drop
        feed.drops += 1
        if len(servers) > 1:
            at = (at + 1) % len(servers)
            feed.moves += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.3)


# --- sessions --------------------------------------------------------------------------------


def make_script(rng: random.Random, index: int) -> tuple[list[dict[str, Any]], list[str]]:
    """2-3 turns of sleep (0.2-1 s) and put_note calls, then a final answer; and the note keys."""
    script: list[dict[str, Any]] = []
    keys: list[str] = []
    for turn in range(rng.randint(2, 3)):
        calls: list[dict[str, Any]] = []
        key = f"s{index}-t{turn}"
        keys.append(key)
        calls.append({"name": "put_note", "arguments": {"key": key, "text": f"value {key}"}})
        calls.append({"name": "sleep", "arguments": {"seconds": round(rng.uniform(0.2, 1.0), 2)}})
        rng.shuffle(calls)
        script.append({"toolCalls": calls})
    script.append({"text": f"session {index} done"})
    return script, keys


async def create_session(
    http: httpx.AsyncClient,
    servers: list[str],
    index: int,
    script: list[dict[str, Any]],
    deadline: float,
) -> str:
    """POST with an Idempotency-Key to the servers in turn, retried through outages (on the
    next server): exactly one session per index."""
    key = f"chaos-{index}-{uuid.uuid4().hex}"
    body = {"prompt": f"chaos session {index}", "script": script}
    at = index % len(servers)
    while True:
        with contextlib.suppress(httpx.HTTPError):
            response = await http.post(
                f"{servers[at]}/api/agent", json=body, headers={"Idempotency-Key": key}
            )
            if response.status_code in (200, 201):
                return str(response.json()["id"])
            if response.status_code != 503:
                raise RuntimeError(f"create answered {response.status_code}: {response.text}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"could not create session {index}")
        at = (at + 1) % len(servers)
        await asyncio.sleep(0.3)


def statuses(url: str, session_ids: list[str]) -> dict[str, str] | None:
    """Each session's status, or None while the database is unreachable."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            rows = conn.execute(
                "SELECT id::text, status FROM sessions WHERE id = ANY(%s::uuid[])", (session_ids,)
            ).fetchall()
    except psycopg.OperationalError:
        return None
    return {row[0]: row[1] for row in rows}


# --- the scenario ----------------------------------------------------------------------------


@dataclass
class ChaosConfig:
    sessions: int = 40
    workers: int = 3
    concurrency: int = 4
    kill_every: float = 2.0
    # Seconds over which sessions are created (0: all at once).
    spread: float = 0.0
    # The killer stops after this many seconds (None: when every session is terminal).
    duration: float | None = None
    # Restart the database this many seconds after the first session (None: never; only on
    # this machine's cluster, not with `hosts`).
    db_restart_at: float | None = 8.0
    db_down: float = 2.0
    # Test hosts (network namespaces), each running an API process and workers in turn (0:
    # everything on this machine, one API process).
    hosts: int = 0
    # Cut one host's link this many seconds after the first session, for `partition_for`.
    partition_at: float | None = None
    partition_for: float = 10.0
    # Every process through one PgBouncer (transaction mode, `pgbouncer_pool` server
    # connections), SIGKILLed this many seconds after the first session and started again
    # `pgbouncer_down` later (None: never).
    pgbouncer: bool = False
    pgbouncer_pool: int = 10
    pgbouncer_restart_at: float | None = None
    pgbouncer_down: float = 2.0
    # The client hangs up the owner stream after about this many seconds and reconnects.
    hang_up_every: float | None = 4.0
    lease_ttl: float = 5.0
    heartbeat_interval: float = 1.0
    max_attempts: int = 1000
    timeout: float = 80.0
    seed: int | None = None
    data_dir: Path = field(default_factory=lambda: data_dir_for("ferryman-chaos"))
    progress: bool = False
    # Keep the database (and the cluster running) for a post-mortem.
    keep: bool = False


@dataclass
class ChaosReport:
    seed: int
    elapsed: float = 0.0
    sessions: list[str] = field(default_factory=list)
    final_status: dict[str, str] = field(default_factory=dict)
    kills: int = 0
    startup_kills: int = 0
    worker_restarts: int = 0
    db_restarted: bool = False
    pgbouncer_restarted: bool = False
    partitioned: str | None = None  # the host whose link went down
    owner_head: int = 0
    # One client per API process, each starting on its own.
    feeds: list[OwnerFeed] = field(default_factory=list)
    resumes: int = 0
    resume_reasons: dict[str, int] = field(default_factory=dict)
    crash_to_resume: list[float] = field(default_factory=list)
    # When the database, PgBouncer or a host was away (monotonic): kills then measure the
    # outage, not the runtime.
    outages: list[tuple[float, float]] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    # Claims per session (attempt) -> sessions; runs of live workers fenced out (lease lost).
    attempts: dict[int, int] = field(default_factory=dict)
    fenced_out: int = 0
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        terminal = sum(1 for s in self.final_status.values() if s in TERMINAL)
        succeeded = sum(1 for s in self.final_status.values() if s == "succeeded")
        lines = [
            f"seed {self.seed}, {self.elapsed:.1f}s ("
            + ", ".join(f"{k} {v:.1f}s" for k, v in self.phases.items())
            + ")",
            f"sessions: {len(self.sessions)}, terminal {terminal}, succeeded {succeeded}",
            f"kills: {self.kills} ({self.startup_kills} of them while starting;"
            f" +{self.worker_restarts} restarts of workers that exited),"
            f" database restarted: {self.db_restarted}, PgBouncer restarted:"
            f" {self.pgbouncer_restarted}, partitioned: {self.partitioned}",
        ]
        for feed in self.feeds:
            lines.append(
                f"owner feed: {len(feed.ids)} events received, head {self.owner_head},"
                f" each id 1..N exactly once: {feed.ids == list(range(1, self.owner_head + 1))};"
                f" connects {feed.connects} (hung up {feed.hang_ups}, dropped {feed.drops},"
                f" moved to another host {feed.moves}), resyncs {len(feed.resyncs)}"
            )
        lines += [
            f"resumes: {self.resumes} {self.resume_reasons}; sessions by final attempt:"
            f" {dict(sorted(self.attempts.items()))}; live runs fenced out: {self.fenced_out}",
        ]
        if self.crash_to_resume:
            lines.append(f"crash-to-resume (kill -> owner-feed session_resumed): {stats(self)}")
        lines.append(f"problems: {len(self.problems)}")
        lines += [f"  - {p}" for p in self.problems[:30]]
        return "\n".join(lines)


TERMINAL = {"succeeded", "failed", "cancelled"}


def stats(report: ChaosReport) -> str:
    values = report.crash_to_resume
    return (
        f"n={len(values)} p50={percentile(values, 50):.3f}s p99={percentile(values, 99):.3f}s"
        f" max={max(values):.3f}s mean={statistics.fmean(values):.3f}s"
    )


def dangling_calls(rows: list[dict[str, Any]]) -> list[str]:
    """Ids of calls (assistant calls and tool_call_starts, in order) with no tool_result."""
    answered = {r["data"]["toolCallId"] for r in rows if r["type"] == "tool_result"}
    dangling: list[str] = []
    for row in rows:
        if row["type"] == "assistant_message":
            ids = [c["id"] for c in row["data"].get("toolCalls") or []]
        elif row["type"] == "tool_call_start":
            ids = [row["data"]["toolCallId"]]
        else:
            continue
        dangling += [i for i in ids if i not in answered and i not in dangling]
    return dangling


def check_session(
    session_id: str,
    rows: list[dict[str, Any]],
    last_seq: int,
    notes: dict[str, int],
    keys: list[str],
) -> list[str]:
    problems: list[str] = []
    seqs = [r["seq"] for r in rows]
    if seqs != list(range(1, last_seq + 1)):
        problems.append(f"{session_id}: seqs not contiguous 1..{last_seq}: {seqs}")
    attempts = [r["attempt"] for r in rows]
    if attempts != sorted(attempts):
        problems.append(f"{session_id}: an older attempt wrote after a newer one: {attempts}")
    results: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["type"] == "tool_result":
            results.setdefault(row["data"]["toolCallId"], []).append(row)
    calls = {c["id"] for r in rows for c in r["data"].get("toolCalls") or []}
    for call_id in calls:
        if len(results.get(call_id, [])) != 1:
            problems.append(
                f"{session_id}: call {call_id} answered {len(results.get(call_id, []))}x"
            )
    for resumed in (r for r in rows if r["type"] == "session_resumed"):
        expected = dangling_calls([r for r in rows if r["attempt"] < resumed["attempt"]])
        got = resumed["data"]["repairedToolCalls"]
        if got != expected:
            problems.append(f"{session_id}: attempt {resumed['attempt']} repaired {got}, "
                            f"expected {expected}")  # fmt: skip
        for call_id in got:
            for result in results.get(call_id, []):
                data = {k: result["data"].get(k) for k in INTERRUPTED}
                if data != INTERRUPTED or result["attempt"] != resumed["attempt"]:
                    problems.append(f"{session_id}: repair of {call_id} is {result}")
    if sorted(notes) != sorted(keys) or any(n != 1 for n in notes.values()):
        problems.append(f"{session_id}: notes {notes}, expected one row for each of {keys}")
    return problems


@dataclass
class Deployment:
    """The database (`url`, as this machine reaches it: setup and checks), where the
    processes run, and what the disruptions act on."""

    url: str
    places: list[Place]
    cluster: Cluster | None = None  # this machine's cluster, which the database restart stops
    bouncer: PgBouncer | None = None


def places_for(url: str, hosts: list[netns.Host | None], bouncer: PgBouncer | None) -> list[Place]:
    """A place on each host (None: this machine), reaching the database at its address on the
    hosts' links, through `bouncer` when there is one."""
    made = []
    for host in hosts:
        address = str(host.database.ip) if host else None
        direct = psycopg.conninfo.make_conninfo(url, host=address) if address else url
        if bouncer is None:
            made.append(Place(direct, {}, host))
        else:
            pooled = bouncer.url(direct, address or "127.0.0.1")
            made.append(Place(pooled, {"FERRYMAN_DIRECT_DATABASE_URL": direct}, host))
    return made


async def run_chaos(config: ChaosConfig) -> ChaosReport:
    seed = config.seed if config.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    report = ChaosReport(seed=seed)
    say = print if config.progress else (lambda *_: None)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if config.hosts:
            deployment = await asyncio.to_thread(on_hosts, config, stack)
        else:
            deployment = await on_this_machine(config, stack)
        try:
            await chaos(config, report, rng, deployment, say)
        finally:
            if config.keep:
                print(f"kept database {deployment.url}")
                stack.pop_all()
    report.elapsed = time.monotonic() - started
    return report


def on_hosts(config: ChaosConfig, stack: contextlib.ExitStack) -> Deployment:
    """Test hosts, a PostgreSQL they reach over their links, a migrated database and
    PgBouncer (when asked), all undone by `stack`."""
    if config.db_restart_at is not None:
        raise ValueError("the database restart needs this machine's cluster (hosts=0)")
    made = stack.enter_context(netns.hosts(config.hosts))
    cluster = compare.Cluster(networks=[made[0].database])
    stack.callback(cluster.stop)
    cluster.start()
    url = stack.enter_context(cluster.database("ferryman_chaos"))
    migrate.upgrade(url)
    bouncer = None
    if config.pgbouncer:
        listen = (str(made[0].database.ip),)
        bouncer = stack.enter_context(pgbouncer(cluster.url, config.pgbouncer_pool, listen))
    return Deployment(url, places_for(url, [*made], bouncer), bouncer=bouncer)


async def on_this_machine(config: ChaosConfig, stack: contextlib.ExitStack) -> Deployment:
    """This machine's cluster (one run at a time per data directory: it is stopped and started
    under everyone using it, so a second run waits here), a migrated database and PgBouncer
    (when asked), all undone by `stack`."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    lock = os.open(config.data_dir / "chaos.lock", os.O_CREAT | os.O_RDWR)
    stack.callback(os.close, lock)
    await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
    cluster = Cluster(config.data_dir)
    await asyncio.to_thread(cluster.boot)
    stack.callback(cluster.shutdown)
    url = await asyncio.to_thread(cluster.create_database, "ferryman_chaos")
    stack.callback(cluster.drop_database, url)
    bouncer = None
    if config.pgbouncer:
        bouncer = stack.enter_context(pgbouncer(cluster.url, config.pgbouncer_pool))
    return Deployment(url, places_for(url, [None], bouncer), cluster=cluster, bouncer=bouncer)


async def chaos(
    config: ChaosConfig,
    report: ChaosReport,
    rng: random.Random,
    deployment: Deployment,
    say: Any,
) -> None:
    setup_start = time.monotonic()
    deadline = setup_start + config.timeout
    url = deployment.url
    _, key = create_owner_key(url)
    dbname = psycopg.conninfo.conninfo_to_dict(url).get("dbname")
    env = {
        "FERRYMAN_LEASE_TTL": str(config.lease_ttl),
        "FERRYMAN_HEARTBEAT_INTERVAL": str(config.heartbeat_interval),
        "FERRYMAN_MAX_ATTEMPTS": str(config.max_attempts),
        "FERRYMAN_POOL_TIMEOUT": "2",
    }
    server_env = {
        "FERRYMAN_AUTH": "keys",
        "FERRYMAN_SCRIPTED_MODEL": "true",  # the soak's sessions are scripted (docs/tenants.md)
        "FERRYMAN_POOL_TIMEOUT": "2",
        "FERRYMAN_POLL_INTERVAL": "1",
        "FERRYMAN_PING_INTERVAL": str(PING_INTERVAL),
    }
    servers = [
        ServerProcess(place.database_url, env={**server_env, **place.env}, netns=place.host)
        for place in deployment.places
    ]
    fleet = Fleet(deployment.places, env, config.workers, config.concurrency)
    stop_feed = asyncio.Event()
    report.feeds = [OwnerFeed() for _ in servers]
    scripts: dict[str, list[str]] = {}
    tasks: list[asyncio.Task[Any]] = []
    disruptions: list[asyncio.Task[Any]] = []
    try:
        await asyncio.gather(*(asyncio.to_thread(server.start) for server in servers))
        await asyncio.to_thread(fleet.start)
        report.phases["setup"] = time.monotonic() - setup_start
        urls = [server.url for server in servers]
        say(f"seed {report.seed}; database {dbname}; servers {' '.join(urls)}; "
            f"{config.workers} workers x {config.concurrency}"
            f"{'; through PgBouncer' if deployment.bouncer else ''}")  # fmt: skip
        # A stream silent for a few pings is from a host that went away.
        timeout = httpx.Timeout(5, read=3 * PING_INTERVAL)
        async with httpx.AsyncClient(
            headers={"Authorization": f"Bearer {key}"}, timeout=timeout
        ) as http:
            for first, feed in enumerate(report.feeds):
                follower = follow_owner(
                    http, urls, first, feed, stop_feed, random.Random(rng.random()),
                    config.hang_up_every,
                )  # fmt: skip
                tasks.append(asyncio.create_task(follower))
            chaos_start = time.monotonic()
            done = asyncio.Event()
            # Hosts whose link is (or was just) down: their workers are left alone, to be
            # fenced out.
            cut: set[str] = set()

            def at() -> str:
                return f"[{time.monotonic() - chaos_start:6.1f}s]"

            async def creator() -> None:
                for index in range(config.sessions):
                    script, keys = make_script(rng, index)
                    session_id = await create_session(http, urls, index, script, deadline)
                    scripts[session_id] = keys
                    report.sessions.append(session_id)
                    if config.spread:
                        await asyncio.sleep(config.spread / config.sessions)

            async def killer() -> None:
                while not done.is_set():
                    with contextlib.suppress(TimeoutError):
                        wait = config.kill_every * rng.uniform(0.5, 1.5)
                        await asyncio.wait_for(done.wait(), wait)
                    if done.is_set():
                        return
                    elapsed = time.monotonic() - chaos_start
                    if config.duration is not None and elapsed > config.duration:
                        return
                    report.worker_restarts += fleet.replace_exited()
                    reachable = [w for w in fleet.alive if not (w.netns and w.netns.name in cut)]
                    ready = [w for w in fleet.ready() if w in reachable]
                    starting = [w for w in reachable if w not in ready]
                    if len(ready) >= 2:
                        victim, what = rng.choice(ready), "running"
                    elif starting:
                        # Replacements start slowly on a busy machine: rather than skip a beat,
                        # kill one while it starts (registering, migrating), keeping the last
                        # running worker alive to resume.
                        victim, what = rng.choice(starting), "starting"
                        report.startup_kills += 1
                    else:
                        continue
                    fleet.kill(victim)
                    report.kills += 1
                    where = f" on {victim.netns.name}" if victim.netns else ""
                    say(f"{at()} SIGKILL {what} worker {victim.pid}{where}")

            async def away(what: str, start: Any, back: Any, down: float) -> None:
                """`start()` an outage, and `back()` after `down` seconds; recorded."""
                say(f"{at()} {what} going down")
                down_at = time.monotonic()
                index = len(report.outages)
                report.outages.append((down_at, float("inf")))
                await asyncio.to_thread(start)
                try:
                    await asyncio.sleep(down)
                finally:
                    await asyncio.to_thread(back)
                    report.outages[index] = (down_at, time.monotonic())
                say(f"{at()} {what} back")

            async def database_restart(delay: float) -> None:
                assert deployment.cluster is not None
                await asyncio.sleep(delay)
                cluster = deployment.cluster
                await away("database", cluster.stop, cluster.start, config.db_down)
                report.db_restarted = True

            async def pgbouncer_restart(delay: float) -> None:
                assert deployment.bouncer is not None
                await asyncio.sleep(delay)
                bouncer = deployment.bouncer
                crash = functools.partial(bouncer.stop, signal.SIGKILL)
                await away("PgBouncer", crash, bouncer.start, config.pgbouncer_down)
                report.pgbouncer_restarted = True

            async def partition(delay: float) -> None:
                """Cut the host whose worker runs the most sessions."""
                await asyncio.sleep(delay)
                held = await asyncio.to_thread(leases_by_pid, url)
                on_hosts = [w for w in fleet.ready() if w.netns]
                worker = max(on_hosts, key=lambda w: (held.get(w.pid, 0), rng.random()))
                host = worker.netns
                assert host is not None
                report.partitioned = f"{host.name} (its worker running {held.get(worker.pid, 0)})"
                cut.add(host.name)
                try:
                    await away(f"host {host.name}", host.cut, host.heal, config.partition_for)
                    # Back, it finds its leases gone (a refused write or a heartbeat) and says so.
                    with contextlib.suppress(AssertionError):
                        await wait_logged(worker, LEASE_LOST, timeout=4 * config.lease_ttl)
                finally:
                    cut.discard(host.name)

            async def supervise() -> None:
                while not done.is_set():
                    await asyncio.sleep(1)
                    report.worker_restarts += fleet.replace_exited()

            tasks.append(asyncio.create_task(killer()))
            tasks.append(asyncio.create_task(supervise()))
            if config.db_restart_at is not None:
                disruptions.append(asyncio.create_task(database_restart(config.db_restart_at)))
            if config.pgbouncer_restart_at is not None:
                restart = pgbouncer_restart(config.pgbouncer_restart_at)
                disruptions.append(asyncio.create_task(restart))
            if config.partition_at is not None:
                disruptions.append(asyncio.create_task(partition(config.partition_at)))
            await creator()
            last_progress = 0.0
            while True:
                current = await asyncio.to_thread(statuses, url, report.sessions)
                if current is not None:
                    report.final_status = current
                    terminal = sum(1 for s in current.values() if s in TERMINAL)
                    disrupted = all(task.done() for task in disruptions)
                    if terminal == len(report.sessions) and disrupted:
                        break
                    if time.monotonic() - last_progress > 5:
                        last_progress = time.monotonic()
                        say(f"{at()} {terminal}/{len(report.sessions)} terminal; kills"
                            f" {report.kills}; owner events seen"
                            f" {[len(feed.ids) for feed in report.feeds]}")  # fmt: skip
                if time.monotonic() > deadline:
                    report.problems.append("timed out before every session was terminal")
                    break
                await asyncio.sleep(0.25)
            done.set()
            report.phases["chaos"] = time.monotonic() - chaos_start
            # Let a disruption under way finish, then let the feeds catch up.
            for task in [*tasks[len(report.feeds) :], *disruptions]:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 30)
            report.owner_head = await asyncio.to_thread(owner_head, url)
            catch_up = time.monotonic() + 15
            for feed in report.feeds:
                while (not feed.ids or feed.ids[-1] < report.owner_head) and (
                    time.monotonic() < catch_up
                ):
                    feed.changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(feed.changed.wait(), 0.5)
            stop_feed.set()
    finally:
        stop_feed.set()
        for task in [*tasks, *disruptions]:
            task.cancel()
        await asyncio.gather(*tasks, *disruptions, return_exceptions=True)
        await asyncio.to_thread(fleet.stop)
        for server in servers:
            await asyncio.to_thread(server.stop)
        if deployment.cluster and not await asyncio.to_thread(deployment.cluster.running):
            await asyncio.to_thread(deployment.cluster.start)
    report.phases["run"] = time.monotonic() - setup_start
    await asyncio.to_thread(verify, url, report, scripts, fleet)


def leases_by_pid(url: str) -> dict[int, int]:
    """Running sessions per worker pid."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT lease_pid, count(*) FROM sessions WHERE status = 'running' GROUP BY 1"
        ).fetchall()
    return {int(pid): int(n) for pid, n in rows if pid is not None}


def owner_head(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(max(last_id), 0) FROM owner_cursors").fetchone()
    return int(row[0]) if row else 0


def verify(url: str, report: ChaosReport, scripts: dict[str, list[str]], fleet: Fleet) -> None:
    problems = report.problems
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        sessions = {
            str(r["id"]): r
            for r in conn.execute("SELECT id, status, attempt, last_seq FROM sessions").fetchall()
        }
        owner_ids = [
            r["id"] for r in conn.execute("SELECT id FROM owner_events ORDER BY id").fetchall()
        ]
        events: dict[str, list[dict[str, Any]]] = {}
        for row in conn.execute(
            "SELECT session_id::text AS sid, seq, attempt, type, data, created_at"
            " FROM session_events ORDER BY session_id, seq"
        ).fetchall():
            events.setdefault(row["sid"], []).append(row)
        notes: dict[str, dict[str, int]] = {}
        for row in conn.execute(
            "SELECT session_id::text AS sid, key, count(*) AS n FROM notes GROUP BY 1, 2"
        ).fetchall():
            notes.setdefault(row["sid"], {})[row["key"]] = int(row["n"])
    report.final_status = {sid: str(r["status"]) for sid, r in sessions.items()}
    for row in sessions.values():
        report.attempts[row["attempt"]] = report.attempts.get(row["attempt"], 0) + 1
    logs = fleet.logs()
    report.fenced_out = logs.count(LEASE_LOST)
    if crashed := logs.count("run failed unexpectedly"):
        problems.append(f"{crashed} runs failed with an unexpected error: see the worker logs")
    if len(sessions) != len(report.sessions) or set(sessions) != set(report.sessions):
        problems.append(f"{len(sessions)} sessions in the table, {len(report.sessions)} created")
    for sid, row in sessions.items():
        if row["status"] != "succeeded":
            problems.append(f"{sid}: ended {row['status']} (attempt {row['attempt']})")
        problems += check_session(
            sid, events.get(sid, []), int(row["last_seq"]), notes.get(sid, {}), scripts.get(sid, [])
        )
    # The owner feed: the table holds 1..N, and the client saw each exactly once, in order.
    head = report.owner_head
    if owner_ids != list(range(1, head + 1)):
        problems.append(f"owner_events ids are not 1..{head}")
    for number, feed in enumerate(report.feeds, 1):
        if feed.ids != list(range(1, head + 1)):
            seen = set(feed.ids)
            missing = [i for i in range(1, head + 1) if i not in seen]
            duplicates = sorted({i for i in feed.ids if feed.ids.count(i) > 1})
            problems.append(
                f"owner feed {number}: {len(feed.ids)} ids for head {head};"
                f" missing {missing[:20]}, duplicated {duplicates[:20]}"
            )
        if feed.resyncs:
            problems.append(f"owner feed {number} asked for a resync: {feed.resyncs[:3]}")
    # Resumes, and the time from a kill to the owner feed's `session_resumed`.
    for sid, rows in events.items():
        runs = {r["attempt"]: r for r in rows if r["type"] in ("session_start", "session_resumed")}
        for resumed in (r for r in rows if r["type"] == "session_resumed"):
            report.resumes += 1
            reason = resumed["data"]["reason"]
            report.resume_reasons[reason] = report.resume_reasons.get(reason, 0) + 1
            previous = runs.get(resumed["attempt"] - 1)
            if previous is None:
                continue
            killed_at = fleet.kills.get(int(previous["data"]["pid"]))
            received = sorted(
                at
                for feed in report.feeds
                for at, data in feed.resumed.get(sid, [])
                if data["attempt"] == resumed["attempt"]
            )
            if any(down - 1 <= (killed_at or 0) <= up for down, up in report.outages):
                continue
            if killed_at is not None and received and received[0] > killed_at:
                report.crash_to_resume.append(received[0] - killed_at)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4, help="sessions per worker")
    parser.add_argument("--kill-every", type=float, default=3.0, help="seconds between kills")
    parser.add_argument(
        "--duration", type=float, default=120.0,
        help="seconds of chaos: sessions are created over 70%% of it, the killer stops after it",
    )  # fmt: skip
    parser.add_argument(
        "--db-restart-at", type=float, default=None,
        help="seconds into the run to restart the database (default: half the duration, "
        "without --hosts; negative: never)",
    )  # fmt: skip
    parser.add_argument("--db-down", type=float, default=3.0)
    parser.add_argument(
        "--hosts", type=int, default=0,
        help="test hosts (network namespaces; root), each an API process and a worker in turn",
    )  # fmt: skip
    parser.add_argument(
        "--partition-at", type=float, default=None,
        help="seconds into the run to cut one host's link (default, with --hosts: 30%% of the "
        "duration; negative: never)",
    )  # fmt: skip
    parser.add_argument(
        "--partition-for", type=float, default=None,
        help="seconds the link stays down (default: twice the lease TTL)",
    )  # fmt: skip
    parser.add_argument("--pgbouncer", action="store_true", help="every process through PgBouncer")
    parser.add_argument(
        "--pgbouncer-restart-at", type=float, default=None,
        help="seconds into the run to SIGKILL PgBouncer and start it again (default: 60%% of "
        "the duration; negative: never)",
    )  # fmt: skip
    parser.add_argument("--lease-ttl", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=None, help="overall bound (seconds)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=data_dir_for("ferryman-chaos-soak"),
        help="the embedded cluster's directory: never one another process uses (it is stopped)",
    )
    args = parser.parse_args()

    def moment(given: float | None, default: float | None) -> float | None:
        at = given if given is not None else default
        return at if at is not None and at >= 0 else None

    config = ChaosConfig(
        sessions=args.sessions,
        workers=args.workers,
        concurrency=args.concurrency,
        kill_every=args.kill_every,
        spread=args.duration * 0.7,
        duration=args.duration,
        db_restart_at=moment(args.db_restart_at, None if args.hosts else args.duration / 2),
        db_down=args.db_down,
        hosts=args.hosts,
        partition_at=moment(args.partition_at, args.duration * 0.3 if args.hosts else None),
        partition_for=args.partition_for or 2 * args.lease_ttl,
        pgbouncer=args.pgbouncer,
        pgbouncer_restart_at=moment(
            args.pgbouncer_restart_at, args.duration * 0.6 if args.pgbouncer else None
        ),
        lease_ttl=args.lease_ttl,
        timeout=args.timeout or args.duration * 3 + 120,
        seed=args.seed,
        data_dir=args.data_dir,
        progress=True,
    )
    report = asyncio.run(run_chaos(config))
    print()
    print(report.summary())
    sys.exit(1 if report.problems else 0)


if __name__ == "__main__":
    main()
