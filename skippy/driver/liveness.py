"""Which downstream stages are alive: every stage heartbeats to stage 0, and silence means dead.

A ZeroMQ PUSH queues silently toward a peer that died, so stage 0 cannot learn it from sends; it
learns it from heartbeats that stop, or from heartbeats signed by another process (`incarnation`):
a stage restarted faster than `dead_after_s` has lost its sessions all the same. A dead stage stays
dead until stage 0 has greeted it again and the chain answered Ready (`revived`). `dead_after_s` and
the clock are constructor arguments so a test can use a short bound without patching module state.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable

DEAD_AFTER_S = 3.0  # default: no heartbeat for this long and the stage is dead


class Heard(enum.Enum):
    """What a heartbeat says about its stage."""

    ALIVE = "alive"  # nothing new
    BACK = "back"  # the dead stage talks again: greet it
    RESTARTED = "restarted"  # another process answers for the stage: what it held is gone


class Liveness:
    def __init__(self, stages: Iterable[str], dead_after_s: float = DEAD_AFTER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.dead_after_s = dead_after_s
        self.clock = clock
        now = clock()
        self.last_seen = {stage: now for stage in stages}
        self.incarnations: dict[str, str] = {}
        self.dead: str | None = None

    def heard(self, stage_id: str, incarnation: str = "") -> Heard:
        """Record a heartbeat from the process `incarnation` ("" = a peer that does not say)."""
        self.last_seen[stage_id] = self.clock()
        previous = self.incarnations.get(stage_id)
        if incarnation:
            self.incarnations[stage_id] = incarnation
        if previous is not None and incarnation and incarnation != previous:
            return Heard.RESTARTED
        return Heard.BACK if stage_id == self.dead else Heard.ALIVE

    def mark_dead(self, stage_id: str) -> bool:
        """True when this is news (no stage was dead yet)."""
        if self.dead is not None:
            return False
        self.dead = stage_id
        return True

    def revived(self) -> str | None:
        """The chain answered stage 0's greeting: the dead stage (returned) is alive again."""
        stage, self.dead = self.dead, None
        return stage

    def silent(self) -> str | None:
        """The first stage not heard from within `dead_after_s` (None while one is already dead)."""
        if self.dead is not None:
            return None
        now = self.clock()
        return next((s for s, seen in self.last_seen.items() if now - seen > self.dead_after_s), None)
