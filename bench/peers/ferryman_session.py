"""Ferryman: a scripted session, as in `bench.throughput`: one model turn that calls the
`put_note` tool, then a turn that answers "done".

`setup` migrates the empty database and creates the sessions (queued; no worker runs yet).
`worker` imports what `ferryman worker` needs, waits at the gate, then runs the `ferryman
worker --concurrency C` command itself in this process (its own start-up, the schema check
and the worker's registration included, as a deployed worker would).

`CREATE_BODY` is the same session as `POST /api/agent` takes it: what `bench.compare
--end-to-end`'s clients send (`setup` then only migrates).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from bench.peers.common import parser, wait_for_go

UNIT = 'session: a turn calling `put_note`, then "done" (scripted)'

DONE_SQL = "SELECT count(*) FROM sessions WHERE status = 'succeeded'"
# The first event a worker wrote (events written at creation have attempt 0).
STARTED_SQL = "SELECT extract(epoch FROM min(created_at)) FROM session_events WHERE attempt > 0"
FINISHED_SQL = "SELECT extract(epoch FROM max(updated_at)) FROM sessions WHERE status = 'succeeded'"
# The scripted model's turns (`bench.throughput`'s sessions too).
SCRIPT: list[dict[str, Any]] = [
    {"text": "noting", "toolCalls": [{"name": "put_note", "arguments": {"key": "k", "text": "v"}}]},
    {"text": "done"},
]
CREATE_BODY = {"prompt": "session", "title": "s", "model": "scripted", "script": SCRIPT}


def setup(url: str, units: int) -> None:
    from app.db import migrate
    from bench.throughput import create_sessions

    migrate.upgrade(url)
    asyncio.run(create_sessions(url, units))


def worker(url: str, concurrency: int, ready: str) -> None:
    # The modules the command imports lazily, imported before the gate.
    import app.db.bootstrap
    import app.runtime.worker
    import app.services  # noqa: F401
    from ferryman.cli import cli

    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("FERRYMAN_LOG_FORMAT", "json")
    wait_for_go(ready)
    cli(["worker", "--concurrency", str(concurrency)])


def main() -> None:
    root, _, _ = parser(__doc__.split("\n\n")[0])
    args = root.parse_args()
    if args.command == "setup":
        setup(args.url, args.units)
    else:
        worker(args.url, args.concurrency, args.ready)


if __name__ == "__main__":
    main()
