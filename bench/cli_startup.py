"""How long `ferryman` commands take to start: wall and CPU time (user + system) of whole
processes, the executables' runs interleaved so that a change in the machine's load falls on all
of them alike. The client commands aim at a port nothing listens on: they fail at their first
request, so what is timed is start-up, not a server.

    python -m bench.cli_startup [--runs 30] [FERRYMAN ...]   # default: .venv/bin/ferryman

Give two executables (another checkout's entry point, say) to compare them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import time
from pathlib import Path

COMMANDS = ("--help", "sessions --help", "sessions list", "run hi --no-follow", "keys list --help")
NOWHERE = "127.0.0.1:9"  # the discard port: refused at once


def once(executable: str, command: str, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [executable, *shlex.split(command)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, _, usage = os.wait4(process.pid, 0)
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("executables", nargs="*", default=[".venv/bin/ferryman"])
    args = parser.parse_args()
    env = {
        **os.environ,
        "FERRYMAN_URL": f"http://{NOWHERE}",
        "DATABASE_URL": f"postgresql://nobody@{NOWHERE}/ferryman",
    }
    print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for command in COMMANDS:  # warm the caches
        for executable in args.executables:
            once(executable, command, env)
    for _ in range(args.runs):
        for command in COMMANDS:
            for executable in args.executables:
                times.setdefault((executable, command), []).append(once(executable, command, env))
    print(f"{'ms, of ' + str(args.runs) + ' runs':<22}median wall  min wall  median cpu")
    for executable in args.executables:
        print(executable)
        for command in COMMANDS:
            walls, cpus = zip(*times[(executable, command)], strict=True)
            print(
                f"  {command:<20}{1000 * statistics.median(walls):11.0f}"
                f"{1000 * min(walls):10.0f}{1000 * statistics.median(cpus):12.0f}"
            )
    print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


if __name__ == "__main__":
    main()
