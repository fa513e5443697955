"""Figures the benchmark scripts print."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank on sorted values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def latency_line(label: str, seconds: Sequence[float]) -> str:
    ms = [s * 1000 for s in seconds]
    return (
        f"{label}: n={len(ms)} p50={percentile(ms, 50):.1f} ms p90={percentile(ms, 90):.1f} ms "
        f"p99={percentile(ms, 99):.1f} ms max={max(ms):.1f} ms mean={statistics.fmean(ms):.1f} ms"
    )


def machine_speed() -> float:
    """Seconds this machine's Python takes for 10 million additions in a loop, the best of
    three: one core's speed, to set beside figures from machines whose cores differ (two of
    this workplace's 2-core machines have differed by 2x)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        total = 0
        for i in range(10_000_000):
            total += i
        best = min(best, time.perf_counter() - start)
    return best
