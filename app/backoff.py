"""Exponential back-off for the loops that reconnect or re-read after a database failure, and
the one way they log an outage."""

from __future__ import annotations

import asyncio
import logging


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


class Outage:
    """Logs a connection's outage once: a warning when it starts, an info when it ends, and
    each failed attempt between them only at debug (a long outage must not fill the log)."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log = log
        self.what = what
        self.down = False

    def failed(self, exc: BaseException) -> None:
        if self.down:
            self.log.debug("%s still unavailable: %s", self.what, exc)
            return
        self.down = True
        self.log.warning("%s unavailable: %s", self.what, exc)

    def recovered(self) -> None:
        if self.down:
            self.down = False
            self.log.info("%s is back", self.what)
