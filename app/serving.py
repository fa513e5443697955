"""Several API processes on one port: each is a whole `ferryman serve` (its own LISTEN
connection, feeds and worker) on its own SO_REUSEPORT socket, so the kernel spreads connections
across them and SSE fan-out runs on every core."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from types import FrameType

log = logging.getLogger(__name__)


def reuse_port_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def supervise(child_args: list[str], env: dict[str, str], count: int) -> int:
    """Run `count` children (`python -m app serve ...`), pass SIGTERM/SIGINT on to them, and
    return once all have exited (non-zero if any failed). If one dies, the rest are stopped:
    a half-sized fleet would hide the failure."""
    children = [
        subprocess.Popen([sys.executable, "-m", "app", *child_args], env={**os.environ, **env})
        for _ in range(count)
    ]

    def forward(signum: int, _: FrameType | None) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    failed = 0
    remaining = list(children)
    while remaining:
        pid, status = os.wait()
        remaining = [child for child in remaining if child.pid != pid]
        if os.waitstatus_to_exitcode(status) != 0:
            failed += 1
            log.error("API process %d exited with %s; stopping the others", pid, status)
            forward(signal.SIGTERM, None)
    return 1 if failed else 0
