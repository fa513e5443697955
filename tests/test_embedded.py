"""The front door: `ferryman serve` with no DATABASE_URL runs on an embedded PostgreSQL in its
data directory; another `ferryman` process on that directory joins the same server; the server
stops when its last user exits, even when another user was killed without a chance to say so."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import httpx

from app.db.embedded import start_embedded
from tests.cluster import data_dir_for
from tests.support import REPO, free_port


def _postmaster_pid(data_dir: os.PathLike[str]) -> int | None:
    pid_file = os.path.join(data_dir, "pg", "postmaster.pid")
    if not os.path.exists(pid_file):
        return None
    with open(pid_file) as f:
        return int(f.readline())


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_serve_on_embedded_postgres() -> None:
    data_dir = data_dir_for("ferryman-test-embedded")
    shutil.rmtree(data_dir, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env |= {"FERRYMAN_DATA_DIR": str(data_dir), "FERRYMAN_LOG_FORMAT": "json"}
    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port)],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert serve.poll() is None, serve.stderr.read().decode() if serve.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "serve did not become ready within a minute"
            time.sleep(0.2)
        postmaster = _postmaster_pid(data_dir)
        assert _alive(postmaster)

        # A second process on the same data directory joins the running server.
        created = subprocess.run(
            [sys.executable, "-m", "app", "keys", "create", "--owner", "embedded"],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        key = created.stdout.strip()
        assert _postmaster_pid(data_dir) == postmaster
        headers = {"Authorization": f"Bearer {key}"}
        response = httpx.post(
            f"http://127.0.0.1:{port}/api/agent", json={"prompt": "hi"}, headers=headers
        )
        assert response.status_code == 201
        assert response.json()["ownerId"] == "embedded"

        # A worker joins too, then dies by SIGKILL: it never leaves embedded-postgres's list
        # of the server's users, and must not keep the server alive after serve exits.
        worker = subprocess.Popen(
            [sys.executable, "-m", "app", "worker"],
            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        users = data_dir / "pg" / ".handle_pids.json"
        deadline = time.monotonic() + 60
        while worker.pid not in json.loads(users.read_text()):
            assert worker.poll() is None and time.monotonic() < deadline, "the worker never joined"
            time.sleep(0.1)
        assert _postmaster_pid(data_dir) == postmaster
        worker.kill()
        worker.wait()
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0
    # The last user is gone: the embedded server stops with it.
    for _ in range(100):
        if not _alive(postmaster):
            break
        time.sleep(0.1)
    assert not _alive(postmaster), "the embedded PostgreSQL outlived its last user"
    # And it comes back with the data on the next start.
    url = start_embedded(data_dir)
    assert url
