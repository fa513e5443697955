"""Figures the benchmark scripts print."""

from __future__ import annotations

import statistics
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
