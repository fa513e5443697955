"""Provider budgets: the bucket arithmetic (app/budgets.py, property tests), the settings, and
the shared statements on a real PostgreSQL (app/store/budgets.py): a slot is one caller's at a
time across connections, a pause and the rates hold for every caller, an expired slot is free.
The workers sharing them are tests/test_budgets_workers.py."""

from __future__ import annotations

import asyncio
import math
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from app.budgets import Bucket, Budget, admit, budget_key, parse_budgets, pause, refusal, spend
from app.config import Settings
from app.db.pool import Database
from app.store import budgets as store

# --- the arithmetic --------------------------------------------------------------------------

times = st.lists(st.floats(0, 600, allow_nan=False), min_size=1, max_size=200).map(sorted)


@given(rpm=st.integers(1, 1000), at=times)
def test_requests_admitted_never_exceed_a_minutes_worth_plus_the_refill(
    rpm: int, at: list[float]
) -> None:
    budget = Budget(rpm=rpm)
    bucket = Bucket(at=0.0)
    admitted: list[float] = []
    for now in at:
        bucket, refused = admit(bucket, budget, now)
        if refused is None:
            admitted.append(now)
    # In any stretch of time, at most the bucket (a minute's worth) and what refilled in it.
    for i, start in enumerate(admitted):
        for j in range(i, len(admitted)):
            span = admitted[j] - start
            assert j - i + 1 <= rpm + rpm * span / 60 + 1e-6


@given(
    rpm=st.integers(1, 600),
    level=st.floats(-50, 0.999, allow_nan=False),
    now=st.floats(0, 1000, allow_nan=False),
)
def test_a_refused_call_is_admitted_at_the_time_it_was_told(
    rpm: int, level: float, now: float
) -> None:
    budget = Budget(rpm=rpm)
    bucket = Bucket(requests=level, at=now)
    refused = refusal(bucket, budget, now)
    assert refused is not None and refused[0] == "rpm"
    until = refused[1]
    assert until > now
    _, again = admit(bucket, budget, until + 1e-9)
    assert again is None
    if until - now > 1e-3:
        _, early = admit(bucket, budget, until - 1e-3)
        assert early is not None


@given(
    tpm=st.integers(1, 100_000),
    used=st.lists(st.integers(0, 50_000), min_size=1, max_size=30),
    gap=st.floats(0, 30, allow_nan=False),
)
def test_tokens_in_debt_refuse_until_refilled_past_zero(
    tpm: int, used: list[int], gap: float
) -> None:
    budget = Budget(tpm=tpm)
    bucket, now = Bucket(at=0.0), 0.0
    for tokens in used:
        bucket, refused = admit(bucket, budget, now)
        if refused is None:
            bucket = spend(bucket, budget, now, tokens)
        else:
            assert refused[0] == "tpm"
            assert bucket.tokens <= 0
            until = refused[1]
            assert admit(bucket, budget, until)[1] is None
        now += gap
        assert bucket.tokens <= tpm


@given(first=st.floats(0, 100), second=st.floats(0, 100), now=st.floats(0, 100))
def test_a_pause_holds_until_the_latest_asked(first: float, second: float, now: float) -> None:
    bucket = pause(pause(Bucket(), first), second)
    refused = refusal(bucket, Budget(), now)
    if now < max(first, second):
        assert refused == ("paused", max(first, second))
    else:
        assert refused is None


def test_no_rate_means_no_refusal() -> None:
    bucket = Bucket(requests=-5, tokens=-5)
    assert refusal(bucket, Budget(max_concurrent=1), 0.0) is None
    assert admit(Bucket(), Budget(), 10.0)[0].requests == math.inf


def test_a_models_own_budget_stands_before_its_providers() -> None:
    budgets = {"openai": Budget(rpm=1), "openai:gpt-4o": Budget(rpm=2)}
    assert budget_key("openai:gpt-4o", budgets) == "openai:gpt-4o"
    assert budget_key("openai:gpt-4o-mini", budgets) == "openai"
    assert budget_key("anthropic:claude", budgets) is None
    assert budget_key("scripted", budgets) is None


def test_the_settings() -> None:
    settings = Settings(
        openai_max_concurrent=4,
        openai_rpm=100,
        anthropic_tpm=1000,
        provider_budgets='{"openai": {"rpm": 50}, "anthropic:claude-x": {"maxConcurrent": 2}}',
    )
    assert settings.budgets() == {
        "openai": Budget(4, 50, None),
        "anthropic": Budget(None, None, 1000),
        "anthropic:claude-x": Budget(2, None, None),
    }
    assert Settings().budgets() == {}
    assert parse_budgets('{"openai": {}}') == {"openai": Budget()}


@pytest.mark.parametrize(
    "text",
    [
        "[1]",
        "{not json",
        '{"mistral": {"rpm": 1}}',
        '{"openai": {"rpm": 0}}',
        '{"openai": {"rpm": 1.5}}',
        '{"openai": {"burst": 1}}',
        '{"openai": 3}',
    ],
)
def test_bad_budgets_are_refused_at_start(text: str) -> None:
    with pytest.raises(ValidationError, match="provider_budgets"):
        Settings(provider_budgets=text)


# --- the statements on PostgreSQL --------------------------------------------------------------


def fresh_key() -> str:
    return f"openai:test-{uuid.uuid4().hex[:8]}"


async def take(db: Database, key: str, budget: Budget, ttl: float = 30) -> store.Verdict:
    async with db.connection() as conn:
        await store.ensure(conn, key, budget)
        return await store.acquire(conn, key, budget, uuid.uuid4(), "w", ttl)


async def test_slots_are_one_callers_each_under_concurrent_tries(db: Database) -> None:
    key, budget = fresh_key(), Budget(max_concurrent=3)
    verdicts = await asyncio.gather(*(take(db, key, budget) for _ in range(10)))
    taken = [v.slot for v in verdicts if v.admitted]
    assert sorted(taken) == [0, 1, 2]  # type: ignore[type-var]
    assert all(not v.slot_free for v in verdicts if not v.admitted)


async def test_a_released_slot_is_free_and_an_expired_one_too(db: Database) -> None:
    key, budget = fresh_key(), Budget(max_concurrent=1)
    holder = uuid.uuid4()
    async with db.connection() as conn:
        await store.ensure(conn, key, budget)
        first = await store.acquire(conn, key, budget, holder, "w", 30)
        assert first.admitted and first.slot == 0
        assert not (await store.acquire(conn, key, budget, uuid.uuid4(), "w", 30)).admitted
        await store.release(conn, key, budget, holder, 0)
        short = await store.acquire(conn, key, budget, uuid.uuid4(), "w", 0.2)
        assert short.admitted
    # Its holder never gives it back (a worker killed): it frees itself once expired.
    for _ in range(100):
        if (await take(db, key, budget)).admitted:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the expired slot stayed taken")


async def test_renewed_slots_hold(db: Database) -> None:
    key, budget = fresh_key(), Budget(max_concurrent=1)
    holder = uuid.uuid4()
    async with db.connection() as conn:
        await store.ensure(conn, key, budget)
        assert (await store.acquire(conn, key, budget, holder, "w", 0.3)).admitted
        await store.renew(conn, [holder], 30)
    await asyncio.sleep(0.5)
    assert not (await take(db, key, budget)).admitted


async def test_requests_per_minute_are_shared(db: Database) -> None:
    key, budget = fresh_key(), Budget(rpm=5)
    verdicts = await asyncio.gather(*(take(db, key, budget) for _ in range(12)))
    assert sum(v.admitted for v in verdicts) == 5
    refused = next(v for v in verdicts if not v.admitted)
    reason = refusal(Bucket(refused.requests, refused.tokens, 0.0), budget, 0.0)
    assert reason is not None and reason[0] == "rpm"
    assert 0 < reason[1] <= 12.0 + 1e-6  # one request refills in 12 s at 5 a minute


async def test_tokens_spent_refuse_the_next_call(db: Database) -> None:
    key, budget = fresh_key(), Budget(tpm=600)
    holder = uuid.uuid4()
    async with db.connection() as conn:
        await store.ensure(conn, key, budget)
        assert (await store.acquire(conn, key, budget, holder, "w", 30)).admitted
        await store.release(conn, key, budget, holder, None, used_tokens=700)
        refused = await store.acquire(conn, key, budget, uuid.uuid4(), "w", 30)
    assert not refused.admitted and -100 <= refused.tokens < 0


async def test_a_pause_refuses_every_caller_until_it_ends(db: Database) -> None:
    key, budget = fresh_key(), Budget()
    holder = uuid.uuid4()
    async with db.connection() as conn:
        await store.ensure(conn, key, budget)
        assert (await store.acquire(conn, key, budget, holder, "w", 30)).admitted
        await store.release(conn, key, budget, holder, None, pause=0.5)
    other = await take(db, key, budget)
    assert not other.admitted and other.paused_until is not None
    assert 0.2 < (other.paused_until - other.at).total_seconds() <= 0.5
    for _ in range(100):
        if (await take(db, key, budget)).admitted:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the pause never ended")


# --- the other protocols show the wait as their custom event -----------------------------------


def test_ag_ui_and_agent_protocol_show_a_wait_as_a_custom_event() -> None:
    from app.protocols.ag_ui.fold import AgUiFold
    from app.protocols.agent_protocol.fold import ThreadFold

    sid = uuid.uuid4()
    log = [
        {"type": "user_message", "seq": 1, "data": {"text": "hi", "delivery": "queued"}},
        {"type": "session_start", "seq": 2, "data": {"workerId": "w", "pid": 1, "attempt": 1}},
        {"type": "model_wait", "seq": 3, "data": {"reason": "paused", "untilMs": 5}},
    ]
    ag_ui, agent_protocol = AgUiFold(sid), ThreadFold(sid)
    for envelope in log[:-1]:
        ag_ui.apply({**envelope, "ts": "2026-12-03T00:00:00Z"}, in_run=True)
        agent_protocol.apply({**envelope, "ts": "2026-12-03T00:00:00Z"}, in_run=True)
    wait = {**log[-1], "ts": "2026-12-03T00:00:00Z"}
    assert (
        "CUSTOM",
        {"name": "model_wait", "value": {"seq": 3, "reason": "paused", "untilMs": 5}},
    ) in ag_ui.apply(wait, in_run=True)
    assert [kind for kind, _ in agent_protocol.apply(wait, in_run=True)] == ["custom"]


# --- a worker's side: the wait, its metric, a cancel -------------------------------------------


async def test_a_worker_waits_for_a_slot_counts_the_wait_and_can_be_cancelled(
    db: Database,
) -> None:
    from prometheus_client import REGISTRY

    from app.runtime.budgets import ProviderBudgets

    key = fresh_key()
    budgets = ProviderBudgets(
        db, None, "w1", {key: Budget(max_concurrent=1)}, ttl=30, renew_interval=1
    )
    told: list[tuple[str, float | None]] = []

    async def on_wait(reason: str, until: float | None) -> None:
        told.append((reason, until))

    async def unguarded(step):  # type: ignore[no-untyped-def]
        return await step

    def waits() -> float:
        value = REGISTRY.get_sample_value(
            "ferryman_model_budget_waits_total", {"provider": "openai", "reason": "concurrency"}
        )
        return value or 0.0

    before = waits()
    first = await budgets.acquire(key, on_wait, unguarded)
    second = asyncio.create_task(budgets.acquire(key, on_wait, unguarded))
    third = asyncio.create_task(budgets.acquire(key, on_wait, unguarded))
    for _ in range(200):
        if len(told) == 2:
            break
        await asyncio.sleep(0.01)
    assert told == [("concurrency", None), ("concurrency", None)]
    assert waits() == before + 2
    third.cancel()  # a cancel ends a wait: the others go on
    await asyncio.gather(third, return_exceptions=True)
    assert not second.done()
    await budgets.release(first)
    ticket = await asyncio.wait_for(second, 10)
    assert ticket.slot == 0
    await budgets.release(ticket)


async def test_a_rate_wait_says_until_when_and_a_release_counts_only_what_is_budgeted(
    db: Database,
) -> None:
    from app.runtime.budgets import ProviderBudgets

    key = fresh_key()
    budgets = ProviderBudgets(db, None, "w1", {key: Budget(rpm=2)}, ttl=30, renew_interval=1)
    told: list[tuple[str, float | None]] = []

    async def on_wait(reason: str, until: float | None) -> None:
        told.append((reason, until))

    async def unguarded(step):  # type: ignore[no-untyped-def]
        return await step

    for _ in range(2):  # a minute's worth: 2 at once
        await budgets.release(await budgets.acquire(key, on_wait, unguarded), used_tokens=99)
    third = asyncio.create_task(budgets.acquire(key, on_wait, unguarded))
    for _ in range(200):
        if told:
            break
        await asyncio.sleep(0.01)
    third.cancel()
    await asyncio.gather(third, return_exceptions=True)
    ((reason, until),) = told
    assert reason == "rpm" and until is not None
    async with db.connection() as conn:
        row = await (
            await conn.execute(
                "SELECT extract(epoch FROM clock_timestamp())::float8 AS now, tokens"
                " FROM provider_budgets WHERE key = %s",
                (key,),
            )
        ).fetchone()
    assert row is not None
    assert 20 < until - row["now"] <= 30  # one request refills in 30 s at 2 a minute
    assert row["tokens"] == math.inf  # no tokens budget: the usage is counted nowhere
