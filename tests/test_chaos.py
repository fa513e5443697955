"""A CI-sized chaos run (the scenario of bench/chaos_soak.py): ~40 sessions of sleep and put_note
tool calls over 3 worker processes while a killer SIGKILLs a random worker every ~2 s (and
restarts it) and the database (a dedicated embedded PostgreSQL) is restarted once, with a client
following the owner feed throughout, reconnecting with Last-Event-ID whenever it drops."""

from __future__ import annotations

from bench.chaos_soak import ChaosConfig, run_chaos
from tests.cluster import data_dir_for

# The whole run, from the first session to the last check; setup adds a few seconds.
BOUND_SECONDS = 90.0


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
    print(report.summary())
    assert not report.problems, report.summary()
    assert len(report.sessions) == config.sessions
    assert set(report.final_status.values()) == {"succeeded"}, report.summary()
    assert report.db_restarted, "the database was not restarted"
    assert report.kills >= 5, report.summary()
    assert report.resumes >= 3, report.summary()
    # Every owner event id 1..N reached the client exactly once, in order.
    assert report.owner_feed.ids == list(range(1, report.owner_head + 1)), report.summary()
    assert report.owner_feed.connects >= 2, "the owner stream never had to reconnect"
    assert report.elapsed < BOUND_SECONDS + 30, report.summary()
