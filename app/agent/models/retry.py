"""How long to wait before retrying a model call: exponential backoff with jitter, or what the
provider asked for. Pure: the randomness comes in as an argument."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 4  # FERRYMAN_MODEL_MAX_RETRIES: retries per turn
    initial_delay: float = 1.0  # FERRYMAN_MODEL_RETRY_INITIAL_DELAY, seconds
    max_delay: float = 60.0  # FERRYMAN_MODEL_RETRY_MAX_DELAY, seconds

    def allows(self, retry: int) -> bool:
        """Whether retry number `retry` (1, 2, ...) may be made."""
        return retry <= self.max_retries

    def delay(
        self,
        retry: int,
        retry_after: float | None = None,
        uniform: Callable[[], float] = random.random,
    ) -> float:
        """Seconds before retry number `retry`. A provider's Retry-After is honoured as given
        (capped at `max_delay`); otherwise the backoff doubles from `initial_delay` up to
        `max_delay`, and a random half of it is jitter, so clients that failed together do
        not all come back together."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay)
        ceiling = min(self.max_delay, self.initial_delay * 2.0 ** min(retry - 1, 62))
        return ceiling / 2 + ceiling / 2 * uniform()
