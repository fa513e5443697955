"""Procrastinate: no-op jobs through its async worker.

`setup` applies Procrastinate's schema and defers the jobs in batches. Each worker process
runs `App.run_worker_async` with `concurrency` 16 (`--concurrency`) over Procrastinate's
psycopg connector (a connection pool), otherwise its defaults: LISTEN/NOTIFY on, jobs kept
after they finish (status `succeeded`, with a `succeeded` row in `procrastinate_events`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.peers.common import parser, wait_for_go

UNIT = "no-op job"

DONE_SQL = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
STARTED_SQL = "SELECT extract(epoch FROM min(at)) FROM procrastinate_events WHERE type = 'started'"
FINISHED_SQL = (
    "SELECT extract(epoch FROM max(at)) FROM procrastinate_events WHERE type = 'succeeded'"
)


def _app(url: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop")
    async def noop(index: int) -> None:
        return None

    return app


async def setup(url: str, units: int) -> None:
    app = _app(url)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        noop = app.tasks["noop"]
        for start in range(0, units, 500):
            batch = range(start, min(units, start + 500))
            await noop.batch_defer_async(*({"index": index} for index in batch))


async def worker(url: str, index: int, concurrency: int, ready: str) -> None:
    app = _app(url)
    wait_for_go(ready)
    async with app.open_async():
        await app.run_worker_async(concurrency=concurrency, name=f"bench-{index}")


def main() -> None:
    root, _, _ = parser(__doc__.split("\n\n")[0])
    args = root.parse_args()
    if args.command == "setup":
        asyncio.run(setup(args.url, args.units))
    else:
        asyncio.run(worker(args.url, args.index, args.concurrency, args.ready))


if __name__ == "__main__":
    main()
