"""bench.compare's arithmetic: how --end-to-end splits the units over its clients, the
pgbench-derived ceiling and the columns its table shows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.compare import Result, shares, table, with_ceiling


@given(st.integers(min_value=0, max_value=100_000), st.integers(min_value=1, max_value=64))
def test_shares_split_every_unit_once_and_evenly(units: int, processes: int) -> None:
    split = shares(units, processes)
    assert len(split) == processes
    assert sum(count for _, count in split) == units
    # Contiguous: each client's first unit follows the previous one's last.
    expected_first = 0
    for first, count in split:
        assert first == expected_first
        expected_first += count
    counts = [count for _, count in split]
    assert max(counts) - min(counts) <= 1


def result(units: int, seconds: float, xids: int, **more: float) -> Result:
    return Result(key="k", label="k", unit="u", units=units, seconds=seconds, xids=xids, **more)


def test_the_ceiling_is_pgbench_commits_over_the_units_write_commits() -> None:
    pgbench = result(units=45_000, seconds=10.0, xids=45_000)  # 4,500 commits/s
    row = with_ceiling(result(units=1000, seconds=1.0, xids=1500).row(), pgbench)
    assert row["pgbench ceiling units/s"] == pytest.approx(3000.0)  # 4,500 / 1.5
    assert row["share of ceiling"] == pytest.approx(1000 / 3000)
    nothing_written = with_ceiling(result(units=1000, seconds=1.0, xids=0).row(), pgbench)
    assert nothing_written["pgbench ceiling units/s"] is None
    assert nothing_written["share of ceiling"] is None


def test_the_front_columns_show_only_when_measured() -> None:
    workers_only = table([("a", "u", result(10, 1.0, 10).row(), "")])
    assert "API CPU" not in workers_only and "client CPU" not in workers_only
    assert "share of ceiling" in workers_only
    end_to_end = table(
        [
            ("a", "u", result(10, 1.0, 10, api_cpu=0.01, client_cpu=0.002).row(), ""),
            ("b", "u", result(10, 1.0, 10, client_cpu=0.004).row(), ""),
        ]
    )
    header, _, first, second = end_to_end.splitlines()
    assert "API CPU ms / unit" in header and "client CPU ms / unit" in header
    assert "| 1.00 | 0.20 |" in first  # 10 ms and 2 ms of CPU over 10 units
    assert "|  | 0.40 |" in second  # no API process: an empty cell
