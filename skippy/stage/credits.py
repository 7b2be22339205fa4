"""Reply credits: at most `limit` un-credited messages toward one downstream (backpressure you can count)."""

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
        self._changed = asyncio.Condition()

    async def acquire(self) -> float:
        """Take a credit, waiting while none is free; returns the wait in ms."""
        start = time.perf_counter()
        async with self._changed:
            if self.stats.outstanding >= self.stats.limit:
                self.stats.waits += 1
                await self._changed.wait_for(lambda: self.stats.outstanding < self.stats.limit)
            self.stats.outstanding += 1
            self.stats.max_outstanding = max(self.stats.max_outstanding, self.stats.outstanding)
        waited = (time.perf_counter() - start) * 1e3
        self.stats.wait_ms += waited
        return waited

    async def release(self) -> None:
        async with self._changed:
            if self.stats.outstanding > 0:
                self.stats.outstanding -= 1
                self.stats.granted += 1
            self._changed.notify_all()

    async def reset(self) -> None:
        """Forget outstanding credits (the downstream restarted or was re-greeted)."""
        async with self._changed:
            self.stats.outstanding = 0
            self._changed.notify_all()
