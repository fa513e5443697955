"""Model faults, pure: which provider answers are retried, how long the backoff waits, what
Retry-After means, and the idle guard on a stream. No network, no database."""

from __future__ import annotations

import asyncio
import email.utils
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.agent.models import ModelFault, RetryPolicy
from app.agent.models.faults import (
    fault_for_status,
    idle_guarded,
    is_context_overflow,
    retry_after_seconds,
)

# --- classification -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "detail", "kind", "code"),
    [
        (429, "slow down", "rate_limited", "MODEL_UNAVAILABLE"),
        (500, "oops", "server_error", "MODEL_UNAVAILABLE"),
        (502, "bad gateway", "server_error", "MODEL_UNAVAILABLE"),
        (503, "loading model", "server_error", "MODEL_UNAVAILABLE"),
        (529, "overloaded_error", "server_error", "MODEL_UNAVAILABLE"),
        (408, "timeout", "server_error", "MODEL_UNAVAILABLE"),
        (400, "bad tools", "bad_request", "MODEL_BAD_REQUEST"),
        (422, "invalid", "bad_request", "MODEL_BAD_REQUEST"),
        (401, "no key", "auth_failed", "MODEL_AUTH_FAILED"),
        (403, "forbidden", "auth_failed", "MODEL_AUTH_FAILED"),
        (404, "no such model", "not_found", "MODEL_NOT_FOUND"),
        (400, '{"code": "context_length_exceeded"}', "context_too_long", "MODEL_CONTEXT_TOO_LONG"),
        (
            400,
            "the request exceeds the available context size, try increasing it",
            "context_too_long",
            "MODEL_CONTEXT_TOO_LONG",
        ),
        (400, "prompt is too long: 210000 tokens > 200000 maximum", "context_too_long", None),
    ],
)
def test_http_answers_are_classified(status: int, detail: str, kind: str, code: str | None) -> None:
    fault = fault_for_status(status, detail)
    assert fault.kind == kind
    assert fault.status == status
    assert fault.retryable == (kind in {"rate_limited", "server_error"})
    if code is not None:
        assert fault.code == code
    assert str(status) in fault.message and detail in fault.message


def test_a_server_error_is_retried_even_if_it_mentions_the_context() -> None:
    assert fault_for_status(503, "context size unknown, still loading").retryable


def test_context_overflow_markers() -> None:
    assert is_context_overflow("This model's maximum context length is 8192 tokens")
    assert not is_context_overflow("invalid value for temperature")


def test_the_message_is_bounded() -> None:
    assert len(fault_for_status(500, "x" * 100_000).message) <= 2000


# --- Retry-After ----------------------------------------------------------------------------


def test_retry_after_in_seconds_milliseconds_and_dates() -> None:
    assert retry_after_seconds({"retry-after": "7"}) == 7
    assert retry_after_seconds({"retry-after": "0.5"}) == 0.5
    assert retry_after_seconds({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert retry_after_seconds({"retry-after": date}, now=1_000_000) == 30
    assert retry_after_seconds({"retry-after": date}, now=2_000_000) == 0  # in the past
    assert retry_after_seconds({}) is None
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({"retry-after": "nan"}) is None
    assert retry_after_seconds({"retry-after": "99999999"}) == 3600


def test_the_fault_carries_retry_after() -> None:
    fault = fault_for_status(429, "busy", {"retry-after": "3"})
    assert fault.retry_after == 3


# --- backoff --------------------------------------------------------------------------------


def test_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    policy = RetryPolicy(max_retries=4, initial_delay=1.0, max_delay=10.0)
    assert [policy.delay(n, uniform=lambda: 0.0) for n in (1, 2, 3, 4, 5)] == [
        0.5,
        1.0,
        2.0,
        4.0,
        5.0,
    ]
    assert [policy.delay(n, uniform=lambda: 1.0) for n in (1, 2, 3, 4, 5)] == [
        1.0,
        2.0,
        4.0,
        8.0,
        10.0,
    ]


def test_retry_after_is_honoured_and_capped() -> None:
    policy = RetryPolicy(max_delay=30.0)
    assert policy.delay(1, retry_after=7.0) == 7.0
    assert policy.delay(3, retry_after=0.0) == 0.0
    assert policy.delay(1, retry_after=300.0) == 30.0


def test_retries_allowed() -> None:
    policy = RetryPolicy(max_retries=2)
    assert [policy.allows(n) for n in (1, 2, 3)] == [True, True, False]
    assert not RetryPolicy(max_retries=0).allows(1)


@given(
    retry=st.integers(1, 10_000),
    initial=st.floats(0, 100),
    cap=st.floats(0, 1000),
    jitter=st.floats(0, 1),
    retry_after=st.one_of(st.none(), st.floats(0, 10_000)),
)
def test_delays_stay_within_bounds(
    retry: int, initial: float, cap: float, jitter: float, retry_after: float | None
) -> None:
    policy = RetryPolicy(initial_delay=initial, max_delay=cap)
    delay = policy.delay(retry, retry_after, uniform=lambda: jitter)
    assert 0 <= delay <= cap
    if retry_after is None:
        ceiling = min(cap, initial * 2.0 ** min(retry - 1, 62))
        assert ceiling / 2 <= delay + 1e-9
        # Later retries never wait less than earlier ones at the same jitter.
        assert policy.delay(retry + 1, uniform=lambda: jitter) >= delay - 1e-9


# --- the idle guard -------------------------------------------------------------------------


async def _ticks(gaps: list[float]) -> AsyncIterator[int]:
    for index, gap in enumerate(gaps):
        await asyncio.sleep(gap)
        yield index


async def test_the_idle_guard_passes_a_lively_stream() -> None:
    assert [i async for i in idle_guarded(_ticks([0.01] * 5), 0.5)] == [0, 1, 2, 3, 4]


async def test_the_idle_guard_fails_a_stalled_stream() -> None:
    seen: list[int] = []
    with pytest.raises(ModelFault) as raised:
        async for item in idle_guarded(_ticks([0.0, 0.0, 1.0]), 0.2):
            seen.append(item)
    assert seen == [0, 1]
    assert raised.value.kind == "idle_timeout" and raised.value.retryable
    assert "FERRYMAN_MODEL_IDLE_TIMEOUT" in raised.value.message
