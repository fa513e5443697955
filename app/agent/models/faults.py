"""Telling a provider's failures apart, once for every provider: which are worth a retry, how
long the provider asked us to wait, and which can only fail the session."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import AsyncIterator, Mapping
from typing import TypeVar

from app.agent.models.base import FaultKind, ModelFault

# What providers say when a prompt does not fit: OpenAI (`context_length_exceeded`), llama.cpp
# (`exceed_context_size_error`, "exceeds the available context size"), vLLM ("maximum context
# length"), Anthropic ("prompt is too long"), Ollama ("context length").
T = TypeVar("T")

_CONTEXT_MARKERS = (
    "context_length_exceeded",
    "exceed_context_size",
    "context size",
    "context length",
    "context window",
    "prompt is too long",
    "too many tokens",
)
# The longest Retry-After honoured as given; longer ones are capped by the retry policy.
_MAX_RETRY_AFTER = 3600.0


def is_context_overflow(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in _CONTEXT_MARKERS)


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The wait a response asks for: `retry-after-ms` (OpenAI), else `Retry-After` in seconds
    or as an HTTP date; None when absent or unreadable."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return _bounded(float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return _bounded(float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw).timestamp()
    except (TypeError, ValueError):
        return None
    return _bounded(when - (time.time() if now is None else now))


def _bounded(seconds: float) -> float | None:
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER)


def fault_for_status(
    status: int, detail: str, headers: Mapping[str, str] | None = None
) -> ModelFault:
    """The fault an HTTP error answer stands for."""
    kind: FaultKind
    if is_context_overflow(detail) and status < 500:
        kind = "context_too_long"
    elif status in (408, 409, 425, 429):
        # 408 timeouts and 409 lock conflicts are transient too (OpenAI retries both).
        kind = "rate_limited" if status == 429 else "server_error"
    elif status >= 500:
        kind = "server_error"
    elif status in (401, 403):
        kind = "auth_failed"
    elif status == 404:
        kind = "not_found"
    else:
        kind = "bad_request"
    message = f"the model provider answered {status}: {detail}".strip()
    retry_after = retry_after_seconds(headers) if headers is not None else None
    return ModelFault(kind, message[:2000], retry_after=retry_after, status=status)


async def idle_guarded(chunks: AsyncIterator[T], idle_timeout: float) -> AsyncIterator[T]:
    """`chunks`, failing with an `idle_timeout` fault when the next one takes longer than
    `idle_timeout` seconds: a stream that stalls is retried instead of holding the session."""
    iterator = aiter(chunks)
    while True:
        try:
            async with asyncio.timeout(idle_timeout):
                chunk = await anext(iterator)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise ModelFault(
                "idle_timeout",
                f"the model stream sent nothing for {idle_timeout:g} s"
                " (FERRYMAN_MODEL_IDLE_TIMEOUT)",
            ) from None
        yield chunk
