"""Provider budgets (docs/budgets.md): which budget a model call counts against, and the
arithmetic of the shared buckets. Pure: the clock comes in as an argument. The store's
statement (app/store/budgets.py) does the same arithmetic in SQL, under the budget row's lock.

A budget's requests per minute and tokens per minute are token buckets that hold a minute's
worth and refill continuously: a call is admitted while the request bucket holds one whole
request and the token bucket is not in debt; the call takes one request at once, and its
tokens (the usage the provider reports) when it ends, so a bucket may go below zero by one
wave of calls and then admits none until it has refilled past zero.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

WaitReason = Literal["concurrency", "rpm", "tpm", "paused"]
PROVIDERS = ("openai", "anthropic")


@dataclass(frozen=True)
class Budget:
    max_concurrent: int | None = None
    rpm: int | None = None
    tpm: int | None = None

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.max_concurrent, self.rpm, self.tpm))


@dataclass(frozen=True)
class Bucket:
    """A budget's shared state: the levels at `at` (seconds), and a pause until `paused_until`."""

    requests: float = math.inf
    tokens: float = math.inf
    at: float = 0.0
    paused_until: float | None = None


def refill(level: float, per_minute: int | None, elapsed: float) -> float:
    """The level `elapsed` seconds on: up by `per_minute`/60 a second, up to a minute's worth."""
    if per_minute is None:
        return math.inf
    return min(float(per_minute), level + per_minute / 60.0 * max(elapsed, 0.0))


def refilled(bucket: Bucket, budget: Budget, now: float) -> Bucket:
    elapsed = now - bucket.at
    return Bucket(
        refill(bucket.requests, budget.rpm, elapsed),
        refill(bucket.tokens, budget.tpm, elapsed),
        max(now, bucket.at),
        bucket.paused_until,
    )


def refusal(bucket: Bucket, budget: Budget, now: float) -> tuple[WaitReason, float] | None:
    """Why a call at `now` must wait on a refilled `bucket`, and until when (seconds); None
    when it may go (as far as the rates and the pause say: the slots are counted apart)."""
    if bucket.paused_until is not None and bucket.paused_until > now:
        return "paused", bucket.paused_until
    if budget.rpm is not None and bucket.requests < 1:
        return "rpm", now + (1 - bucket.requests) * 60.0 / budget.rpm
    if budget.tpm is not None and bucket.tokens <= 0:
        # Past zero, not to it: a tiny step on, so the call at that time is admitted.
        return "tpm", now + (-bucket.tokens) * 60.0 / budget.tpm + 1e-3
    return None


def admit(
    bucket: Bucket, budget: Budget, now: float
) -> tuple[Bucket, tuple[WaitReason, float] | None]:
    """One call's try at `now`: the bucket after it, and the refusal if it was refused."""
    level = refilled(bucket, budget, now)
    refused = refusal(level, budget, now)
    if refused is not None:
        return level, refused
    taken = level.requests - 1 if budget.rpm is not None else level.requests
    return Bucket(taken, level.tokens, level.at, level.paused_until), None


def spend(bucket: Bucket, budget: Budget, now: float, tokens: int) -> Bucket:
    """A call that ended at `now` having used `tokens`."""
    level = refilled(bucket, budget, now)
    spent = level.tokens - tokens if budget.tpm is not None else level.tokens
    return Bucket(level.requests, spent, level.at, level.paused_until)


def pause(bucket: Bucket, until: float) -> Bucket:
    """A provider's Retry-After: nobody calls before `until` (a later pause is kept)."""
    paused = until if bucket.paused_until is None else max(bucket.paused_until, until)
    return Bucket(bucket.requests, bucket.tokens, bucket.at, paused)


# --- which budget ---------------------------------------------------------------------------


def budget_key(model: str, budgets: Mapping[str, Budget]) -> str | None:
    """The budget a call of `model` ("openai:gpt-4o") counts against: the model's own where
    one is configured ("openai:gpt-4o"), else its provider's ("openai"), else none."""
    if model in budgets:
        return model
    provider, _, name = model.partition(":")
    if name and provider in budgets:
        return provider
    return None


_FIELDS = {"maxConcurrent": "max_concurrent", "rpm": "rpm", "tpm": "tpm"}


def parse_budgets(text: str) -> dict[str, Budget]:
    """FERRYMAN_PROVIDER_BUDGETS: a JSON object keyed "provider" or "provider:model", each
    `{"maxConcurrent": n, "rpm": n, "tpm": n}` (any of them; an empty object shares only the
    provider's pauses). Raises ValueError with what is wrong."""
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ValueError('must be a JSON object, {"openai:gpt-4o": {"rpm": 500}}')
    budgets: dict[str, Budget] = {}
    for key, entry in data.items():
        provider, _, _ = key.partition(":")
        if provider not in PROVIDERS:
            raise ValueError(
                f"{key!r}: the key is 'provider' or 'provider:model', with a provider of"
                f" {', '.join(PROVIDERS)}"
            )
        if not isinstance(entry, dict) or set(entry) - set(_FIELDS):
            raise ValueError(f"{key!r}: an object of {', '.join(_FIELDS)}")
        values: dict[str, Any] = {}
        for name, value in entry.items():
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"{key!r}.{name}: a whole number of at least 1")
            values[_FIELDS[name]] = value
        budgets[key] = Budget(**values)
    return budgets
