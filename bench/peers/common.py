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
    description: str, enqueue: bool = False
) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command's parser, and its `setup` and `worker` subparsers (for extra options); with
    `enqueue`, an `enqueue` subcommand too (`bench.compare --end-to-end`'s client processes)."""
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
    if enqueue:
        client = commands.add_parser(
            "enqueue", help="enqueue units from this client process, after the gate"
        )
        client.add_argument("--url", required=True)
        client.add_argument("--index", type=int, default=0)
        client.add_argument("--units", type=int, required=True, help="this process's share")
        client.add_argument("--first", type=int, default=0, help="the first unit's number")
        client.add_argument("--threads", type=int, default=8, help="enqueues in flight")
        client.add_argument("--ready", required=True, help="a file to create once ready")
        client.add_argument("--out", required=True, help="a file for this process's CPU seconds")
    return root, setup, worker
