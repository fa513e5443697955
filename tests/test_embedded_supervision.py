"""The embedded PostgreSQL stops underneath running ferryman processes (a PANIC on a full disk,
the OOM killer, an operator): they start it again by themselves, one of them only, and /readyz
recovers without restarting ferryman.

Each test runs its own data directory, whatever $DATABASE_URL says, because it kills the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from app.db.embedded import last_error
from tests.cluster import data_dir_for
from tests.support import (
    ChildProcess,
    ServerProcess,
    WorkerProcess,
    client,
    create_session,
    ready,
    wait_for_status,
)

CHECK_INTERVAL = 0.5  # FERRYMAN_EMBEDDED_CHECK_INTERVAL of the processes under test
# Once the server can run, /readyz must answer 200 within this many seconds.
RECOVERY_BOUND = 15.0
STOPPED = "embedded PostgreSQL stopped; restarting it"
BACK = "embedded PostgreSQL is back"


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A fresh data directory of this test run's alone (another worktree's run of this module
    must not remove it or stop its server); no server is left on it afterwards."""
    path = data_dir_for(f"ferryman-test-supervision-{os.getpid()}")
    shutil.rmtree(path, ignore_errors=True)
    try:
        yield path
    finally:
        for pid in postmasters(path):
            with contextlib.suppress(psutil.NoSuchProcess):
                postmaster = psutil.Process(pid)
                postmaster.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown
                postmaster.wait(30)
        shutil.rmtree(path, ignore_errors=True)


def embedded_env(data_dir: Path) -> dict[str, str]:
    # An empty DATABASE_URL means the embedded server, whatever the test run itself uses.
    return {
        "DATABASE_URL": "",
        "FERRYMAN_DATA_DIR": str(data_dir),
        "FERRYMAN_EMBEDDED_CHECK_INTERVAL": str(CHECK_INTERVAL),
    }


def postmaster_pid(data_dir: Path) -> int | None:
    """The pid in postmaster.pid; None while there is none (or a starting server has not
    written it yet)."""
    with contextlib.suppress(FileNotFoundError, IndexError, ValueError):
        return int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])
    return None


def postmasters(data_dir: Path) -> list[int]:
    """The live postmasters on `data_dir` (their children rewrite their command lines)."""
    pgdata = str(data_dir / "pg")
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] != psutil.STATUS_ZOMBIE and "-D" in cmdline and pgdata in cmdline:
            found.append(proc.pid)
    return found


def records(proc: ChildProcess, event: str) -> list[dict[str, Any]]:
    """The process's JSON log records whose event is `event`."""
    lines = proc.logs(tail=None).splitlines()
    parsed = [json.loads(line) for line in lines if line.startswith("{")]
    return [record for record in parsed if record["event"] == event]


async def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll `predicate()` until true; how long it took."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, f"timed out after {timeout}s: {what}"
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def wait_ready(http: httpx.AsyncClient, timeout: float) -> float:
    """Poll /readyz until it answers 200; how long it took."""
    start = time.monotonic()
    while (response := await http.get("/readyz")).status_code != 200:
        assert time.monotonic() - start < timeout, f"/readyz still not ready: {response.text}"
        await asyncio.sleep(0.05)
    return time.monotonic() - start


def kill_postmaster(data_dir: Path, sig: signal.Signals) -> int:
    """Signal the server's postmaster; its pid."""
    pid = postmaster_pid(data_dir)
    assert pid is not None
    os.kill(pid, sig)
    return pid


def assert_one_outage(proc: ChildProcess) -> dict[str, Any]:
    """One warning when the server stopped and one info when it came back; the info."""
    assert len(records(proc, STOPPED)) == 1, proc.logs()
    back = records(proc, BACK)
    assert len(back) == 1, proc.logs()
    return back[0]


async def test_restarted_once_for_every_process_on_the_data_dir(data_dir: Path) -> None:
    env = embedded_env(data_dir)
    server = ServerProcess("", env=env)
    worker = WorkerProcess("", env=env)
    try:
        server.start()
        worker.start()
        await ready(worker)
        async with client(server.url) as http:
            # SIGQUIT is `pg_ctl stop -m immediate`: no shutdown checkpoint, as after a PANIC.
            old = kill_postmaster(data_dir, signal.SIGQUIT)
            await wait_until(lambda: postmaster_pid(data_dir) != old, 10, "the server to stop")
            took = await wait_ready(http, RECOVERY_BOUND)
            print(f"ready {took:.2f}s after the server stopped")

            # One postmaster, which both processes took for theirs; one of them started it.
            assert postmasters(data_dir) == [postmaster_pid(data_dir)]
            await wait_until(lambda: bool(records(worker, BACK)), 10, "the worker saw it back")
            by = {proc.pid: assert_one_outage(proc) for proc in (server, worker)}
            starters = [pid for pid, back in by.items() if back["restarted_by"] == "this process"]
            assert len(starters) == 1, by

            # Both are whole again: the API takes a session and the worker runs it.
            session = await create_session(http, "after the restart")
            await wait_for_status(http, session["id"], {"succeeded"})

        # The process that only took the restarted server over exits last: the server stops
        # with it, so it knew the new postmaster.
        new = postmaster_pid(data_dir)
        first, last = (server, worker) if starters == [server.pid] else (worker, server)
        assert first.stop() == 0
        assert last.stop() == 0
        assert new is not None
        # A stopped postmaster stays a zombie until its parent (init) reaps it, late under
        # load: count only live ones.
        await wait_until(
            lambda: new not in postmasters(data_dir), 10, "the server stops at the end"
        )
    finally:
        worker.stop()
        server.stop()


async def test_restart_retried_until_the_server_can_run(data_dir: Path) -> None:
    server = ServerProcess("", env=embedded_env(data_dir))
    config = data_dir / "pg" / "postgresql.conf"
    broken = config.with_suffix(".off")
    server_log = data_dir / "pg" / "log"
    try:
        server.start()
        async with client(server.url) as http:
            # The server cannot start for a while (as on a full disk): here, no config file.
            config.rename(broken)
            kill_postmaster(data_dir, signal.SIGKILL)

            def failed_starts() -> int:
                return server_log.read_text().count("could not access the server configuration")

            await wait_until(lambda: failed_starts() >= 2, 15, "two failed restarts")
            assert (await http.get("/readyz")).status_code == 503
            broken.rename(config)
            took = await wait_ready(http, RECOVERY_BOUND)
            print(f"ready {took:.2f}s after the server could run again")

            back = assert_one_outage(server)
            assert back["restarted_by"] == "this process" and back["attempts"] >= 3, back
            await create_session(http, "after the outage")
    finally:
        server.stop()
    assert '"level": "error"' not in server.logs(tail=None)


def test_last_error_names_why_the_server_stopped(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text(
        "LOG:  redo done at 0/1C304C0\n"
        'FATAL:  could not write to file "pg_wal/xlogtemp.1": No space left on device\n'
        "LOG:  shutting down due to startup process failure\n"
        "LOG:  database system is shut down\n"
    )
    assert last_error(log).endswith("No space left on device")
    log.write_text("LOG:  received immediate shutdown request\nLOG:  database system is shut down")
    assert last_error(log) == "LOG:  database system is shut down"
    assert last_error(tmp_path / "missing") == ""
