"""A PostgreSQL 15 primary and a streaming-replication standby of it, in a temporary directory,
for failover tests: promoted by hand (`ReplicatedPair`) or by pg_auto_failover's monitor
(`AutoFailoverFormation`). Debian's PostgreSQL 15 binaries, run as `nobody` when we are root
(PostgreSQL refuses to run as root), as `bench.compare.Cluster` runs its private cluster."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import psycopg

from bench.compare import free_port, run_server_command

BIN = Path("/usr/lib/postgresql/15/bin")
PG_AUTOCTL = Path("/usr/bin/pg_autoctl")  # Debian's pg-auto-failover-cli
AUTO_FAILOVER_EXTENSION = Path("/usr/share/postgresql/15/extension/pgautofailover.control")
SETTINGS = (
    "listen_addresses=127.0.0.1",
    "max_connections=200",
    "wal_level=replica",
    "max_wal_senders=5",
    "hot_standby=on",
    "fsync=off",
)


class Node:
    def __init__(self, root: Path, name: str, user: str | None) -> None:
        self.root = root
        self.pgdata = root / name
        self.log = root / f"{name}.log"
        self.port = free_port()
        self.user = user

    def run(self, *args: str, timeout: float = 120) -> None:
        run_server_command(args, self.root, self.user, timeout)

    def start(self, *settings: str) -> None:
        options = " ".join(
            [f"-p {self.port}", f"-k {self.root}", *(f"-c {s}" for s in (*SETTINGS, *settings))]
        )
        self.run(
            str(BIN / "pg_ctl"), "-D", str(self.pgdata), "-l", str(self.log), "-w", "-o", options,
            "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self.run(str(BIN / "pg_ctl"), "-D", str(self.pgdata), "-m", mode, "-w", "stop")

    def promote(self) -> None:
        self.run(str(BIN / "pg_ctl"), "-D", str(self.pgdata), "-w", "promote")

    @property
    def running(self) -> bool:
        return (self.pgdata / "postmaster.pid").exists()


def server_directory() -> tuple[Path, str | None]:
    """A temporary directory the servers' user owns, and that user (None: ours)."""
    root = Path(tempfile.mkdtemp(prefix="ferryman-ha-"))
    user = "nobody" if os.geteuid() == 0 else None
    if user:
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    return root, user


class ReplicatedPair:
    """`start()` makes the primary, then the standby with `pg_basebackup -R`; `synchronous`
    makes the primary wait for the standby's flush at every commit."""

    def __init__(self, synchronous: bool = True) -> None:
        self.synchronous = synchronous
        self.root, self.user = server_directory()
        self.primary = Node(self.root, "primary", self.user)
        self.standby = Node(self.root, "standby", self.user)

    def url(self, database: str = "postgres") -> str:
        """The libpq multi-host URL an operator gives every process: whichever is writable."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def promote_standby(self) -> None:
        """Promote the standby as an HA tool does: with no standby of its own, the new primary
        must stop waiting for one (pg_auto_failover does the same), or every commit on it waits
        forever for the `synchronous_standby_names` its copy of the old primary's settings
        names. Waiting commits are let go on the reload."""
        self.standby.promote()
        with psycopg.connect(self.admin_url(self.standby), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            conn.execute("SELECT pg_reload_conf()")

    def admin_url(self, node: Node, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{node.port}/{database}"

    def start(self) -> None:
        self.primary.run(
            str(BIN / "initdb"), "-D", str(self.primary.pgdata), "-U", "postgres", "-A", "trust",
            "-E", "UTF8", "--no-locale", "--no-sync",
        )  # fmt: skip
        self.primary.start()
        if self.synchronous:
            # As an operator sets it: in postgresql.auto.conf, which the standby's copy keeps.
            with psycopg.connect(self.admin_url(self.primary), autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
                conn.execute("SELECT pg_reload_conf()")
        self.primary.run(
            str(BIN / "pg_basebackup"), "-D", str(self.standby.pgdata), "-R", "-X", "stream",
            "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
            "-d", f"host=127.0.0.1 port={self.primary.port} user=postgres"
            " application_name=standby",
        )  # fmt: skip
        self.standby.start()

    def close(self) -> None:
        for node in (self.primary, self.standby):
            if node.running:
                with contextlib.suppress(Exception):
                    node.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


# The monitor's decision, shortened from pg_auto_failover's defaults (a health check every 5 s,
# unhealthy after 20 s, 30 s more for the primary to demote itself) so a test fails over in
# seconds: the primary is checked every second and given up 2 s after its last answer.
MONITOR_SETTINGS = (
    "pgautofailover.health_check_period=1000",
    "pgautofailover.health_check_timeout=1000",
    "pgautofailover.health_check_max_retries=1",
    "pgautofailover.health_check_retry_delay=500",
    "pgautofailover.node_considered_unhealthy_timeout=2000",
    "pgautofailover.primary_demote_timeout=2000",
)


class AutoFailoverFormation:
    """pg_auto_failover's monitor and two nodes, each under its own `pg_autoctl run` keeper:
    the first node made is the primary, the second its synchronous standby, which the monitor
    promotes when the primary stops answering (and then stops waiting for a standby)."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.root, self.user = server_directory()
        self.monitor = Node(self.root, "monitor", self.user)
        self.nodes = (Node(self.root, "node1", self.user), Node(self.root, "node2", self.user))
        self.keepers: dict[str, subprocess.Popen[bytes]] = {}

    def environment(self) -> dict[str, str]:
        """pg_autoctl keeps its state under XDG directories and reaches its local server
        through the socket directory and superuser `initdb` made."""
        root = str(self.root)
        return {
            "PATH": f"{BIN}:/usr/bin:/bin",
            "HOME": root,
            "XDG_CONFIG_HOME": f"{root}/config",
            "XDG_DATA_HOME": f"{root}/share",
            "XDG_RUNTIME_DIR": f"{root}/run",
            "PGHOST": root,
            "PGUSER": "postgres",
        }

    def autoctl(self, *args: str) -> str:
        done = subprocess.run(
            [str(PG_AUTOCTL), *args], capture_output=True, text=True, timeout=120,
            user=self.user, env=self.environment(), cwd=self.root,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"pg_autoctl {' '.join(args)}: {done.stderr[-3000:]}")
        return done.stdout

    def initdb(self, node: Node, *settings: str) -> None:
        """`initdb` as ours, so that pg_autoctl adopts the data directory: its own tuning
        would size shared_buffers for the whole machine; `postgresql.auto.conf` overrides it,
        and pg_basebackup copies it to the standby."""
        node.run(
            str(BIN / "initdb"), "-D", str(node.pgdata), "-U", "postgres", "-A", "trust",
            "-E", "UTF8", "--no-locale", "--no-sync",
        )  # fmt: skip
        lines = (
            "shared_buffers=128MB", "fsync=off", "max_connections=200",
            f"unix_socket_directories='{self.root}'", *settings,
        )  # fmt: skip
        with open(node.pgdata / "postgresql.auto.conf", "a") as conf:
            conf.write("".join(f"{line}\n" for line in lines))

    def run_keeper(self, node: Node) -> None:
        log = open(self.root / f"{node.pgdata.name}.keeper.log", "ab")  # noqa: SIM115
        self.keepers[node.pgdata.name] = subprocess.Popen(
            [str(PG_AUTOCTL), "run", "--pgdata", str(node.pgdata)],
            stdout=log, stderr=subprocess.STDOUT, user=self.user, env=self.environment(),
            cwd=self.root, start_new_session=True,
        )  # fmt: skip
        log.close()

    def start(self) -> None:
        self.initdb(self.monitor, *MONITOR_SETTINGS)
        self.autoctl(
            "create", "monitor", "--pgdata", str(self.monitor.pgdata),
            "--pgport", str(self.monitor.port), *self.local_options(),
        )  # fmt: skip
        self.run_keeper(self.monitor)
        monitor_uri = self.autoctl(
            "show", "uri", "--pgdata", str(self.monitor.pgdata), "--formation", "monitor"
        ).strip()
        self.initdb(self.nodes[0])
        # The first node is `single` until the second has caught up with it.
        for node, state in zip(self.nodes, ("single", "secondary"), strict=True):
            self.autoctl(
                "create", "postgres", "--pgdata", str(node.pgdata), "--pgport", str(node.port),
                "--pghost", str(self.root), "--name", node.pgdata.name, "--monitor", monitor_uri,
                "--username", "postgres", "--dbname", self.database, *self.local_options(),
            )  # fmt: skip
            self.run_keeper(node)
            self.wait_for_state(node, state, 60)
        self.wait_for_state(self.nodes[0], "primary", 30)

    def local_options(self) -> tuple[str, ...]:
        return ("--hostname", "127.0.0.1", "--listen", "127.0.0.1", "--auth", "trust", "--no-ssl")

    def states(self) -> dict[str, str]:
        """Each node's state as its keeper last reported it to the monitor."""
        shown = self.autoctl("show", "state", "--pgdata", str(self.monitor.pgdata), "--json")
        return {node["nodename"]: node["current_group_state"] for node in json.loads(shown)}

    def wait_for_state(self, node: Node, state: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (found := self.states().get(node.pgdata.name)) != state:
            if time.monotonic() > deadline:
                raise AssertionError(f"{node.pgdata.name} is {found}, not {state}")
            time.sleep(0.5)

    def url(self) -> str:
        """The multi-host URL pg_autoctl gives clients (target_session_attrs=read-write), as
        the servers' superuser."""
        uri = self.autoctl(
            "show", "uri", "--pgdata", str(self.monitor.pgdata), "--formation", "default"
        ).strip()
        return uri.replace("postgres://", "postgresql://postgres@", 1)

    def admin_url(self, node: Node) -> str:
        return f"postgresql://postgres@127.0.0.1:{node.port}/{self.database}"

    def stop_hard(self, node: Node) -> None:
        """The node's host dies: its keeper killed (no word to the monitor), its PostgreSQL
        stopped without a shutdown checkpoint."""
        keeper = psutil.Process(self.keepers[node.pgdata.name].pid)
        services = [  # named before any is killed: the services end with their supervisor
            process
            for process in keeper.children(recursive=True)
            if process.name().startswith("pg_autoctl")
        ]
        for process in (keeper, *services):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        self.keepers.pop(node.pgdata.name).wait(10)
        node.stop("immediate")

    def close(self) -> None:
        for keeper in self.keepers.values():
            keeper.terminate()  # the keeper stops its PostgreSQL
        for keeper in self.keepers.values():
            try:
                keeper.wait(30)
            except subprocess.TimeoutExpired:
                keeper.kill()
        for node in (*self.nodes, self.monitor):
            if node.running:
                with contextlib.suppress(Exception):
                    node.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
