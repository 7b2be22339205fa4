"""Adaptive generation concurrency: probe one more permit, keep it only if it pays (opt-in).

`AdaptiveConcurrency` owns the `concurrency` of an admission queue between `min_concurrency`
and a hard limit (`max_concurrency`, which the broker moves as pipelines come and go).  It is fed
every completed request (`record(tokens, latency_s)`) and judges time windows of `window_s`
seconds holding at least `min_samples` completions, measuring aggregate throughput (tokens/s)
and p95 request latency.  Only windows under demand count (most completions saw waiters or every
permit busy); an idle window during a probe ends the probe.  The cycle: a window sets the
baseline and, below the limit, **probes** +1 permit; the next window **commits** the probe if
throughput rose >= 3 % while p95 latency rose <= 10 %, otherwise **rolls back** and holds for
`cooldown_windows` windows.  Each decision is logged as an `adaptive_concurrency` event.  Time
comes from the injectable `clock`, so tests are deterministic without sleeping.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from skippy.log import get_logger

__all__ = ["AdaptiveConcurrency", "Decision", "WindowStats"]

THROUGHPUT_GAIN = 1.03  # a probe must raise throughput at least this much...
P95_TOLERANCE = 1.10  # ...without p95 latency rising more than this


class Limited(Protocol):
    """What the controller needs of an admission queue."""

    concurrency: int

    @property
    def running(self) -> int: ...

    @property
    def waiting(self) -> int: ...


@dataclass(frozen=True)
class WindowStats:
    throughput: float  # completed tokens per second over the window
    p95: float  # seconds, nearest-rank p95 of request latency
    samples: int
    saturated: bool  # most completions saw demand for every permit


@dataclass(frozen=True)
class Decision:
    decision: str  # probe | commit | rollback | hold
    old: int
    new: int
    reason: str
    stats: WindowStats


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


class AdaptiveConcurrency:
    def __init__(self, queue: Limited, min_concurrency: int, max_concurrency: int, *, window_s: float = 5.0,
                 min_samples: int = 4, cooldown_windows: int = 2, clock: Callable[[], float] = time.monotonic) -> None:
        if min_concurrency < 1 or max_concurrency < 0:
            raise ValueError(f"need min_concurrency >= 1 and max_concurrency >= 0,"
                             f" got {min_concurrency} and {max_concurrency}")
        if window_s <= 0 or min_samples < 1 or cooldown_windows < 0:
            raise ValueError("window_s must be > 0, min_samples >= 1 and cooldown_windows >= 0")
        self.queue = queue
        self.min_concurrency = min_concurrency
        self.max_concurrency = max_concurrency
        self.window_s = window_s
        self.min_samples = min_samples
        self.cooldown_windows = cooldown_windows
        self.clock = clock
        self.current = min_concurrency
        self.baseline: WindowStats | None = None
        self.trial = False  # a probe permit is live and being judged
        self.cooldown = 0
        self.decisions: deque[Decision] = deque(maxlen=64)  # the latest, for tests and debugging
        self.log = get_logger(component="adaptive_concurrency")
        self._samples: list[tuple[int, float, bool]] = []
        self._window_start = clock()
        self._apply()

    def _apply(self) -> None:
        self.queue.concurrency = min(self.current, self.max_concurrency)

    def set_limit(self, max_concurrency: int) -> None:
        """Move the hard limit (0 while no pipeline is ready); windows measured before it are dropped."""
        if max_concurrency == self.max_concurrency:
            return
        self.max_concurrency = max_concurrency
        if max_concurrency >= 1:
            self.current = min(self.current, max_concurrency)
        self.trial, self.baseline = False, None
        self._reset_window()
        self._apply()

    def record(self, tokens: int, latency_s: float) -> Decision | None:
        """One completed request; returns the decision taken if this completion closed a window."""
        queue = self.queue
        saturated = queue.waiting > 0 or queue.running >= queue.concurrency
        self._samples.append((tokens, latency_s, saturated))
        now = self.clock()
        elapsed = now - self._window_start
        if elapsed < self.window_s or len(self._samples) < self.min_samples:
            return None
        stats = WindowStats(
            throughput=sum(s[0] for s in self._samples) / elapsed,
            p95=p95([s[1] for s in self._samples]),
            samples=len(self._samples),
            saturated=2 * sum(1 for s in self._samples if s[2]) > len(self._samples),
        )
        self._reset_window(now)
        return self._decide(stats)

    def _reset_window(self, now: float | None = None) -> None:
        self._samples = []
        self._window_start = self.clock() if now is None else now

    def _decide(self, stats: WindowStats) -> Decision:
        old = self.current
        if self.trial:
            self.trial = False
            base = self.baseline
            assert base is not None
            if not stats.saturated:
                return self._rollback(old, "demand-ended", stats, base)
            if stats.p95 > base.p95 * P95_TOLERANCE:
                return self._rollback(old, "p95-latency-regression", stats, base)
            if stats.throughput < base.throughput * THROUGHPUT_GAIN:
                return self._rollback(old, "throughput-not-improved", stats, base)
            self.baseline = stats
            return self._emit("commit", old, old, "throughput-improved", stats, base)
        if not stats.saturated:
            return self._emit("hold", old, old, "idle", stats)
        self.baseline = stats
        if self.cooldown > 0:
            self.cooldown -= 1
            return self._emit("hold", old, old, "cooldown", stats)
        if self.current >= self.max_concurrency:
            return self._emit("hold", old, old, "at-limit", stats)
        self.current += 1
        self.trial = True
        return self._emit("probe", old, self.current, "saturated", stats)

    def _rollback(self, old: int, reason: str, stats: WindowStats, base: WindowStats) -> Decision:
        self.current = max(self.min_concurrency, old - 1)
        self.cooldown = self.cooldown_windows
        self.baseline = None
        return self._emit("rollback", old, self.current, reason, stats, base)

    def _emit(self, decision: str, old: int, new: int, reason: str, stats: WindowStats,
              base: WindowStats | None = None) -> Decision:
        """Apply the (possibly new) concurrency and log the decision; `base` is what a trial was judged against."""
        self._apply()
        made = Decision(decision, old, new, reason, stats)
        self.decisions.append(made)
        fields: dict[str, Any] = dict(decision=decision, old=old, new=new, reason=reason,
                                      throughput=round(stats.throughput, 3), p95=round(stats.p95, 4),
                                      samples=stats.samples)
        if base is not None:
            fields.update(baseline_throughput=round(base.throughput, 3), baseline_p95=round(base.p95, 4))
        if decision == "hold":
            self.log.debug("adaptive_concurrency", **fields)
        else:
            self.log.info("adaptive_concurrency", **fields)
        return made
