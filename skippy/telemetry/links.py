"""The link guard's counts on a process's /metrics: CURVE peers admitted and refused (skippy.transport.curve_guard).

`LinkMetrics` is a collector read when scraped, from a getter of the process's `LinkGuard` (None while
its context is not secured: nothing then). Observers that own a secured context register it in their
registry: stage 0's (skippy.driver.telemetry), a later stage's (skippy.stage.telemetry), the broker's.
`skippy_link_refused_unnoted_total` counts refusals beyond the guard's bound on the peers it remembers
for its rate-limited log lines (a flood of strangers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from skippy.transport.curve_guard import LinkGuard

__all__ = ["LinkMetrics"]


class LinkMetrics:
    def __init__(self, guard: Callable[[], LinkGuard | None]) -> None:
        self.guard = guard

    def describe(self) -> Iterator[Metric]:
        return iter(())  # the families exist only once the context is secured

    def collect(self) -> Iterator[Metric]:
        guard = self.guard()
        if guard is None:
            return
        for name, doc, value in (
                ("skippy_link_accepted", "CURVE handshakes admitted (a key the topology names)", guard.accepted),
                ("skippy_link_refused", "CURVE handshakes refused: a key the topology does not name, or no CURVE",
                 guard.refused),
                ("skippy_link_refused_unnoted", "refusals of peers not remembered for the log: the guard's bound "
                 "on remembered peers was full of peers heard from lately", guard.refused_unnoted),
                ("skippy_link_handshakes_failed", "handshakes that failed on bound sockets (any reason)",
                 guard.failed_handshakes)):
            family = CounterMetricFamily(name, doc)
            family.add_metric([], value)
            yield family
