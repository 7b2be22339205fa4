"""Reply credits: at most `limit` un-credited messages toward one downstream (backpressure you can count).

Only the owning event loop touches them, so no lock: `release` and `reset` are plain calls (a credit
can come back inside a Credit message or folded into the final stage's Predictions)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


@dataclass
class CreditStats:
    limit: int
    outstanding: int = 0
    max_outstanding: int = 0
    waits: int = 0
    wait_ms: float = 0.0
    granted: int = 0


class ReplyCredits:
    """At most `limit` un-credited messages toward one downstream."""

    def __init__(self, limit: int) -> None:
        self.stats = CreditStats(limit=max(1, limit))
        self._freed = asyncio.Event()

    async def acquire(self) -> float:
        """Take a credit, waiting while none is free; returns the wait in ms."""
        stats = self.stats
        if stats.outstanding < stats.limit:  # the common case: no clock, no wait
            stats.outstanding += 1
            stats.max_outstanding = max(stats.max_outstanding, stats.outstanding)
            return 0.0
        start = time.perf_counter()
        stats.waits += 1
        while stats.outstanding >= stats.limit:
            self._freed.clear()
            await self._freed.wait()
        stats.outstanding += 1
        stats.max_outstanding = max(stats.max_outstanding, stats.outstanding)
        waited = (time.perf_counter() - start) * 1e3
        stats.wait_ms += waited
        return waited

    def release(self) -> None:
        if self.stats.outstanding > 0:
            self.stats.outstanding -= 1
            self.stats.granted += 1
        self._freed.set()

    def give_back(self) -> None:
        """Return a credit taken for a message that was then not sent."""
        self.stats.outstanding = max(0, self.stats.outstanding - 1)
        self._freed.set()

    def reset(self) -> None:
        """Forget outstanding credits (the downstream restarted or was re-greeted)."""
        self.stats.outstanding = 0
        self._freed.set()
