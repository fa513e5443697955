"""Exponential back-off for the loops that reconnect or re-read after a database failure."""

from __future__ import annotations

import asyncio


class Backoff:
    """Delays of `first`, doubling up to `cap`; `reset()` once an attempt succeeds."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first = first
        self.cap = cap
        self.delay = first

    def reset(self) -> None:
        self.delay = self.first

    async def wait(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.cap)
