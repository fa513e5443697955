"""DBOS Transact: a workflow of three checkpointed steps (a model turn, a tool, a model turn),
the shape of Ferryman's scripted session, enqueued on a DBOS queue and run by worker processes.

The steps do no real work: each returns a small value that DBOS checkpoints, as a model turn or
a tool result would be. The queue is registered by `setup` with its polling interval
(`--polling`, seconds: DBOS's default is 1.0) and `worker_concurrency` (per worker process);
each worker launches DBOS with its own executor id, and DBOS's queue thread dequeues from then
on. Workers are told apart by executor id so that none recovers another's workflows at launch.

`enqueue` (`bench.compare --end-to-end`) is one client process of an application that enqueues
its share of the units through DBOS's own API (`Queue.enqueue`, from `--threads` threads, as
many as the HTTP connections of a Ferryman client process): DBOS launched with no queue to
listen to before the gate, the enqueues after it; it writes the CPU seconds it spent from the
gate to its last enqueue to `--out` and exits.
"""

from __future__ import annotations

from typing import Any

from bench.peers.common import parser, wait_for_go

QUEUE = "ferryman_bench"
APP = "ferryman-bench"
UNIT = "workflow of 3 checkpointed steps (model turn, tool, model turn)"

DONE_SQL = "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"
STARTED_SQL = "SELECT min(started_at_epoch_ms) / 1000.0 FROM dbos.workflow_status"
FINISHED_SQL = "SELECT max(updated_at) / 1000.0 FROM dbos.workflow_status WHERE status = 'SUCCESS'"


def _sqlalchemy_url(url: str) -> str:
    """DBOS takes a SQLAlchemy-style URL; ours are libpq key=value strings or URLs."""
    import psycopg

    info = psycopg.conninfo.conninfo_to_dict(url)
    user = info.get("user", "postgres")
    host = info.get("host", "127.0.0.1")
    port = info.get("port", 5432)
    return f"postgresql://{user}@{host}:{port}/{info['dbname']}"


def _dbos(url: str, executor_id: str) -> Any:
    from dbos import DBOS

    steps = _register()
    DBOS(
        config={
            "name": APP,
            "system_database_url": _sqlalchemy_url(url),
            "executor_id": executor_id,
            "application_version": "bench",  # the same in every process
            "log_level": "WARNING",
        }
    )
    return steps


def _register() -> Any:
    """Define the steps and the workflow (registered with DBOS at definition)."""
    from dbos import DBOS

    @DBOS.step()
    def model_turn(index: int, turn: int) -> dict[str, Any]:
        if turn == 1:
            return {
                "text": "noting",
                "toolCalls": [{"name": "put_note", "arguments": {"key": "k", "text": "v"}}],
            }
        return {"text": "done"}

    @DBOS.step()
    def put_note(key: str, text: str) -> dict[str, Any]:
        return {"ok": True, "key": key, "chars": len(text)}

    @DBOS.workflow()
    def agent_session(index: int) -> str:
        first = model_turn(index, 1)
        call = first["toolCalls"][0]
        put_note(**call["arguments"])
        return str(model_turn(index, 2)["text"])

    return agent_session


def setup(url: str, units: int, polling: float, concurrency: int) -> None:
    from dbos import DBOS

    workflow = _dbos(url, "bench-setup")
    DBOS.listen_queues([])  # this process only enqueues
    DBOS.launch()  # creates DBOS's system schema
    try:
        queue = DBOS.register_queue(
            QUEUE,
            worker_concurrency=concurrency,
            polling_interval_sec=polling,
            on_conflict="always_update",
        )
        for index in range(units):
            queue.enqueue(workflow, index)
    finally:
        DBOS.destroy()


def enqueue(
    url: str, index: int, units: int, first: int, threads: int, ready: str, out: str
) -> None:
    import os
    import time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from dbos import DBOS

    workflow = _dbos(url, f"bench-client-{index}")
    DBOS.listen_queues([])  # this process only enqueues
    DBOS.launch()
    queue = DBOS.retrieve_queue(QUEUE)
    assert queue is not None, f"no queue {QUEUE}: run setup first"
    with ThreadPoolExecutor(threads) as pool:
        wait_for_go(ready)
        cpu = time.process_time()
        units_here = range(first, first + units)
        for handle in pool.map(lambda unit: queue.enqueue(workflow, unit), units_here):
            assert handle.workflow_id
        cpu = time.process_time() - cpu
    Path(out).write_text(f"{cpu}\n")
    DBOS.destroy(workflow_completion_timeout_sec=0)
    os._exit(0)


def worker(url: str, index: int, ready: str) -> None:
    import os
    import signal
    import threading

    from dbos import DBOS

    _dbos(url, f"bench-worker-{index}")
    wait_for_go(ready)
    DBOS.launch()  # starts the queue thread, which reads the queue's settings from the database
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # after launch: ours, not DBOS's
    stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=0)
    os._exit(0)  # without waiting for DBOS's remaining threads


def main() -> None:
    root, setup_args, _ = parser(__doc__.split("\n\n")[0], enqueue=True)
    setup_args.add_argument("--polling", type=float, default=1.0)
    setup_args.add_argument("--concurrency", type=int, default=16)
    args = root.parse_args()
    if args.command == "setup":
        setup(args.url, args.units, args.polling, args.concurrency)
    elif args.command == "enqueue":
        enqueue(args.url, args.index, args.units, args.first, args.threads, args.ready, args.out)
    else:
        worker(args.url, args.index, args.ready)


if __name__ == "__main__":
    main()
