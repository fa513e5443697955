"""PgQueuer: no-op jobs, the floor of a PostgreSQL job queue.

`setup` installs PgQueuer's schema and enqueues the jobs in batches. Each worker is one
`QueueManager` on one psycopg connection (autocommit, as PgQueuer requires) with the no-op
entrypoint, `max_concurrent_tasks` 16 (`--concurrency`) and `batch_size` 8 (PgQueuer wants the
cap at least twice the batch), otherwise PgQueuer's defaults. `--concurrency 0` runs PgQueuer's
defaults as they are: `batch_size` 10 and no cap. A finished job is deleted from the queue and
logged (status `successful`) in `pgqueuer_log`, in batches.
"""

from __future__ import annotations

import asyncio

from bench.peers.common import parser, wait_for_go

ENTRYPOINT = "noop"
UNIT = "no-op job"

DONE_SQL = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
STARTED_SQL = "SELECT extract(epoch FROM min(created)) FROM pgqueuer_log WHERE status = 'picked'"
FINISHED_SQL = (
    "SELECT extract(epoch FROM max(created)) FROM pgqueuer_log WHERE status = 'successful'"
)


async def setup(url: str, units: int) -> None:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        queries = Queries(PsycopgDriver(conn))
        await queries.install()
        for start in range(0, units, 500):
            count = min(500, units - start)
            await queries.enqueue([ENTRYPOINT] * count, [None] * count, [0] * count)


async def worker(url: str, concurrency: int, ready: str) -> None:
    import signal
    from datetime import timedelta

    import psycopg
    from pgqueuer import PsycopgDriver, Queries, QueueManager
    from pgqueuer.models import Job

    batch_size = max(1, concurrency // 2) if concurrency else 10
    wait_for_go(ready)
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    qm = QueueManager(Queries(PsycopgDriver(conn)))

    @qm.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        return None

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    try:
        await qm.run(
            batch_size=batch_size,
            max_concurrent_tasks=concurrency or None,
            dequeue_timeout=timedelta(seconds=30),
        )
    finally:
        await conn.close()


def main() -> None:
    root, _, _ = parser(__doc__.split("\n\n")[0])
    args = root.parse_args()
    if args.command == "setup":
        asyncio.run(setup(args.url, args.units))
    else:
        asyncio.run(worker(args.url, args.concurrency, args.ready))


if __name__ == "__main__":
    main()
