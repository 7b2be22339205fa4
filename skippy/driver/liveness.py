"""Which downstream stages are alive: every stage heartbeats to stage 0, and silence means dead.

A ZeroMQ PUSH queues silently toward a peer that died, so stage 0 cannot learn it from sends; it
learns it from heartbeats that stop. `dead_after_s` and the clock are constructor arguments so a
test can use a short bound without patching module state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

DEAD_AFTER_S = 3.0  # default: no heartbeat for this long and the stage is dead


class Liveness:
    def __init__(self, stages: Iterable[str], dead_after_s: float = DEAD_AFTER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.dead_after_s = dead_after_s
        self.clock = clock
        now = clock()
        self.last_seen = {stage: now for stage in stages}
        self.dead: str | None = None

    def heard(self, stage_id: str) -> bool:
        """Record a heartbeat; True when it comes from the stage that was dead (it is back)."""
        self.last_seen[stage_id] = self.clock()
        if stage_id == self.dead:
            self.dead = None
            return True
        return False

    def mark_dead(self, stage_id: str) -> bool:
        """True when this is news (no stage was dead yet)."""
        if self.dead is not None:
            return False
        self.dead = stage_id
        return True

    def silent(self) -> str | None:
        """The first stage not heard from within `dead_after_s` (None while one is already dead)."""
        if self.dead is not None:
            return None
        now = self.clock()
        return next((s for s, seen in self.last_seen.items() if now - seen > self.dead_after_s), None)
