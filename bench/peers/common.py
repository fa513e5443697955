"""What the peer commands share: their arguments and the start gate."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def wait_for_go(ready_file: str) -> None:
    """Say this worker is ready (create `ready_file`), then block until `bench.compare` writes
    a line to our stdin."""
    Path(ready_file).write_text("ready\n")
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("stdin closed before go")


def parser(
    description: str,
) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command's parser, and its `setup` and `worker` subparsers (for extra options)."""
    root = argparse.ArgumentParser(description=description)
    commands = root.add_subparsers(dest="command", required=True)
    setup = commands.add_parser("setup", help="install the schema and enqueue the units")
    setup.add_argument("--url", required=True)
    setup.add_argument("--units", type=int, required=True)
    worker = commands.add_parser("worker", help="run one worker process, after the gate")
    worker.add_argument("--url", required=True)
    worker.add_argument("--index", type=int, default=0)
    worker.add_argument("--concurrency", type=int, default=16)
    worker.add_argument("--ready", required=True, help="a file to create once ready")
    return root, setup, worker
