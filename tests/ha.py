"""A PostgreSQL 15 primary and a streaming-replication standby of it, in a temporary directory,
for failover tests: Debian's PostgreSQL 15 binaries, run as `nobody` when we are root
(PostgreSQL refuses to run as root), as `bench.compare.Cluster` runs its private cluster."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import psycopg

from bench.compare import free_port, run_server_command

BIN = Path("/usr/lib/postgresql/15/bin")
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


class ReplicatedPair:
    """`start()` makes the primary, then the standby with `pg_basebackup -R`; `synchronous`
    makes the primary wait for the standby's flush at every commit."""

    def __init__(self, synchronous: bool = True) -> None:
        self.synchronous = synchronous
        self.root = Path(tempfile.mkdtemp(prefix="ferryman-ha-"))
        self.user = "nobody" if os.geteuid() == 0 else None
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
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
