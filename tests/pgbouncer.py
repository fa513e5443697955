"""Debian's PgBouncer (`/usr/sbin/pgbouncer`) in transaction mode in front of the test
PostgreSQL, as many hosted PostgreSQL services run it: its own config and auth file in a
temporary directory, an ephemeral port, and a server pool small enough (`POOL_SIZE`) that the
test's processes, with more client connections than that, share server connections.

PgBouncer refuses to run as root: as root it runs as the owner of the server's Unix socket
directory (the embedded PostgreSQL's user), else as `nobody`.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from tests.support import free_port, missing

PGBOUNCER = "/usr/sbin/pgbouncer"
POOL_SIZE = 5


def require_pgbouncer() -> None:
    """Skip without Debian's pgbouncer, except under CI=true (.ci/run installs it): fail."""
    if os.access(PGBOUNCER, os.X_OK):
        return
    missing(f"{PGBOUNCER} is missing (apt-get install pgbouncer)", "the PgBouncer tests")


@dataclass
class PgBouncer:
    port: int
    user: str
    directory: Path
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None

    def url(self, direct_url: str, host: str = "127.0.0.1") -> str:
        """`direct_url`'s database, user and password, through PgBouncer (at `host`, one of the
        addresses it listens on)."""
        info = conninfo_to_dict(direct_url)
        info.update(host=host, port=str(self.port), user=self.user)
        return make_conninfo(**info)

    def start(self, timeout: float = 15) -> None:
        """Start it and wait until its admin console answers."""
        with open(self.directory / "stdout.log", "ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                output = (self.directory / "stdout.log").read_text(errors="replace")
                raise RuntimeError(f"pgbouncer exited:\n{output}\n{self.logs()}")
            try:
                self.show("VERSION")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop it with `sig` (SIGTERM: PgBouncer closes every connection at once; SIGKILL: it
        crashes)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def show(self, what: str) -> list[dict[str, Any]]:
        """`SHOW <what>` on PgBouncer's admin console (simple query protocol, autocommit)."""
        admin = make_conninfo(
            host="127.0.0.1", port=str(self.port), user=self.user, dbname="pgbouncer"
        )
        with psycopg.connect(admin, autocommit=True, row_factory=dict_row) as conn:
            return conn.execute(f"SHOW {what}").fetchall()

    def logs(self) -> str:
        with contextlib.suppress(OSError):
            return (self.directory / "pgbouncer.log").read_text(errors="replace")
        return ""


def _run_as(host: str) -> str | None:
    """The user PgBouncer runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    if host.startswith("/"):  # a Unix socket directory: its owner can reach the socket
        return pwd.getpwuid(os.stat(host).st_uid).pw_name
    return "nobody"


@contextlib.contextmanager
def pgbouncer(
    server_url: str, pool_size: int = POOL_SIZE, listen: tuple[str, ...] = ()
) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode in front of `server_url`'s server (any database on it),
    on 127.0.0.1 and the addresses in `listen`."""
    require_pgbouncer()
    info = conninfo_to_dict(server_url)
    host = str(info.get("host") or "127.0.0.1")
    user = str(info.get("user") or pwd.getpwuid(os.getuid()).pw_name)
    password = str(info.get("password") or "")
    port = free_port()
    directory = Path(tempfile.mkdtemp(prefix="ferryman-pgbouncer-"))
    run_as = _run_as(host)
    # auth_type=trust takes any client, but wants its user in the auth file; PgBouncer logs in
    # to PostgreSQL with the password given there.
    (directory / "users.txt").write_text(f'"{user}" "{password}"\n')
    (directory / "pgbouncer.ini").write_text(
        f"""[databases]
* = host={host} port={info.get("port") or 5432}

[pgbouncer]
listen_addr = {",".join(["127.0.0.1", *listen])}
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory / "users.txt"}
admin_users = {user}
pool_mode = transaction
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 1000
logfile = {directory / "pgbouncer.log"}
"""
    )
    if run_as is not None:
        uid = pwd.getpwnam(run_as).pw_uid
        for path in (directory, *directory.iterdir()):
            os.chown(path, uid, -1)
    args = [PGBOUNCER, *(["-u", run_as] if run_as else []), str(directory / "pgbouncer.ini")]
    bouncer = PgBouncer(port=port, user=user, directory=directory, args=args)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(directory, ignore_errors=True)
