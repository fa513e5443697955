"""CI-sized chaos runs (the scenarios of bench/chaos_soak.py).

- On this machine: ~40 sessions of sleep and put_note tool calls over 3 worker processes while a
  killer SIGKILLs a random worker every ~2 s (and restarts it) and the database (a dedicated
  embedded PostgreSQL) is restarted once, with a client following the owner feed throughout,
  reconnecting with Last-Event-ID whenever it drops.
- On 3 test hosts (network namespaces), each an API process and a worker, all through one
  PgBouncer in transaction mode: workers SIGKILLed (and restarted), PgBouncer SIGKILLed and
  started again, one host's link down for longer than the lease TTL; one client per host
  follows the owner feed, moving to another host when its own goes away.
"""

from __future__ import annotations

import pytest

from bench.chaos_soak import ChaosConfig, ChaosReport, run_chaos
from tests.cluster import data_dir_for

# The whole run, from the first session to the last check; setup adds a few seconds.
BOUND_SECONDS = 90.0


def assert_nothing_lost(report: ChaosReport, config: ChaosConfig) -> None:
    """Every session created once and succeeded; every owner event id 1..N reached every
    client exactly once, in order; within the bound."""
    print(report.summary())
    assert not report.problems, report.summary()
    assert len(report.sessions) == config.sessions
    assert set(report.final_status.values()) == {"succeeded"}, report.summary()
    assert report.feeds, report.summary()
    for feed in report.feeds:
        assert feed.ids == list(range(1, report.owner_head + 1)), report.summary()
    assert report.elapsed < BOUND_SECONDS + 30, report.summary()


async def test_chaos() -> None:
    config = ChaosConfig(
        sessions=40,
        workers=3,
        concurrency=4,
        kill_every=1.5,
        # Sessions keep arriving past the database restart, and long enough for at least five
        # kills now that a death is noticed within milliseconds and recovery is quick.
        spread=10.0,
        db_restart_at=8.0,
        db_down=2.0,
        lease_ttl=5.0,
        timeout=BOUND_SECONDS - 10,
        data_dir=data_dir_for("ferryman-test-chaos"),
        progress=True,
    )
    report = await run_chaos(config)
    assert_nothing_lost(report, config)
    assert report.db_restarted, "the database was not restarted"
    assert report.kills >= 5, report.summary()
    assert report.resumes >= 3, report.summary()
    assert report.feeds[0].connects >= 2, "the owner stream never had to reconnect"


# Its PostgreSQL is its own whatever DATABASE_URL says: a second pass would add nothing.
@pytest.mark.once
async def test_chaos_on_hosts_through_pgbouncer() -> None:
    lease_ttl = 3.0
    config = ChaosConfig(
        sessions=30,
        hosts=3,
        workers=3,
        concurrency=4,
        kill_every=4.0,
        spread=16.0,
        duration=18.0,
        db_restart_at=None,
        pgbouncer=True,
        pgbouncer_restart_at=3.0,
        pgbouncer_down=2.0,
        # Longer than the lease TTL, and than the clients' read timeout after the last ping
        # (2-3 pings): the client on the cut host gives up on it during the cut. The cut
        # worker has the rest of the run to find its leases gone once back.
        partition_at=7.0,
        partition_for=7.0,
        # Clients move only when their stream goes away.
        hang_up_every=None,
        lease_ttl=lease_ttl,
        timeout=BOUND_SECONDS - 10,
        progress=True,
    )
    report = await run_chaos(config)
    assert_nothing_lost(report, config)
    assert report.pgbouncer_restarted, "PgBouncer was not restarted"
    assert report.partitioned, "no host was partitioned"
    # The cut worker's runs were taken over and, once its link was back, fenced out.
    assert report.fenced_out >= 1, report.summary()
    assert report.kills >= 2, report.summary()
    assert len(report.feeds) == 3
    # The partitioned host's client went to another host and missed nothing there.
    assert sum(feed.moves for feed in report.feeds) >= 1, report.summary()
