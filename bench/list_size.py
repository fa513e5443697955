"""Session list size and server memory, before and after the list answered summaries.

30 sessions (keys mode, one owner), each with a 100,000-character prompt and 100,000 characters
of instructions (random emoji, 4 bytes each in UTF-8, which PostgreSQL cannot compress away);
then every page of GET /api/agent (limit 50, so one page unless FERRYMAN_LIST_MAX_BYTES cuts
it), `--reads` times, `--parallel` at once. Reports the bytes of the first page and of a full
read, and the API process's RSS before the first read and its peak while reading (psutil,
sampled every 5 ms), for a checkout of the code before (`--before`, with its own .venv: main)
and this one, side by side:

    python -m bench.list_size --before /work/main

The database is $DATABASE_URL's server; a fresh database is made for each run and dropped.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.support import ServerProcess, create_owner_key, fresh_database

SESSIONS = 30
CHARS = 100_000


EMOJI = [chr(c) for c in range(0x1F600, 0x1F650)]


def text(rng: random.Random) -> str:
    return "".join(rng.choices(EMOJI, k=CHARS))


class Peak(threading.Thread):
    """A process's highest RSS while it runs."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.005)


def read_all(http: httpx.Client) -> tuple[int, int, int]:
    """(first page's bytes, every page's bytes, pages) of one full read of the list."""
    first = total = pages = 0
    token = None
    while True:
        params = {"limit": 50, **({"pageToken": token} if token else {})}
        page = http.get("/api/agent", params=params)
        assert page.status_code == 200, page.text
        first = first or len(page.content)
        total += len(page.content)
        pages += 1
        token = page.json()["nextPageToken"]
        if token is None:
            return first, total, pages


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 1e6


def measure(checkout: Path | None, reads: int, parallel: int) -> dict[str, Any]:
    rng = random.Random(7)
    with fresh_database("ferryman_bench_list") as url:
        _, key = create_owner_key(url)
        api = ServerProcess(url, env={"FERRYMAN_AUTH": "keys"}, checkout=checkout).start()
        try:
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            with httpx.Client(base_url=api.url, headers=headers, timeout=300) as http:
                for i in range(SESSIONS):
                    body = {"prompt": text(rng), "instructions": text(rng), "title": f"s{i}"}
                    raw = json.dumps(body, ensure_ascii=False).encode()
                    created = http.post("/api/agent", content=raw)
                    assert created.status_code == 201, created.text
                before = rss_mb(api.pid)
                peak = Peak(api.pid)
                peak.start()
                with ThreadPoolExecutor(parallel) as pool:
                    results = list(pool.map(lambda _: read_all(http), range(reads)))
                peak.done.set()
                peak.join()
        finally:
            api.stop()
    first, total, pages = results[0]
    return {
        "first page bytes": first,
        "bytes per full read": total,
        "pages per full read": pages,
        "RSS before MB": round(before, 1),
        "RSS peak MB": round(peak.peak / 1e6, 1),
        "RSS growth MB": round(peak.peak / 1e6 - before, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code before (with .venv)")
    parser.add_argument("--reads", type=int, default=4)
    parser.add_argument("--parallel", type=int, default=1)
    args = parser.parse_args()
    runs = {"this checkout": measure(None, args.reads, args.parallel)}
    if args.before:
        before = measure(args.before, args.reads, args.parallel)
        runs = {f"before ({args.before})": before, **runs}
    names = list(runs)
    print(f"{'':24}" + "".join(f"{n:>28}" for n in names))
    for label in runs[names[0]]:
        print(f"{label:24}" + "".join(f"{runs[n][label]:>28}" for n in names))


if __name__ == "__main__":
    sys.exit(main())
