"""The admission broker's observer: queue depth, admitted, 429s, concurrency; one span per request.

`BrokerTelemetry` is built from the broker's parts (a getter of its admission queue, which the broker
may replace, the count of ready pipelines, its outcome tally and its clock), never from the broker.
Gauges and the outcome counters are read when scraped (nothing on the request path); `admitted` and
`finished` are the broker's two hooks, `finished` given a `FinishedRequest` (the request's times,
tokens and pipeline as plain values). `skippy_broker_rejected_429_total` counts the refusals an
adapter turns into HTTP 429 (queue_full, admission_timeout); `skippy_broker_relay_overflow_total{reason}` the
messages an adapter's queue refused (full) or that had no adapter (gone), which the broker moves,
`skippy_broker_requests_abandoned_total{phase="queued"}` the requests whose client went away while queued, and
`skippy_link_*` its CURVE guard's counts (skippy.telemetry.links). Each request ends with a summary span
`stage.openai_admission` from its arrival to its end, with its queue wait, outcome, tokens and pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric

from brokers.admission import AdmissionQueue
from skippy.protocol import TokenEvents
from skippy.protocol.kinds import http_status
from skippy.telemetry.links import LinkMetrics
from skippy.telemetry.metrics import SECONDS_BUCKETS
from skippy.telemetry.process import Telemetry, current
from skippy.transport.curve_guard import LinkGuard

__all__ = ["BrokerTelemetry", "FinishedRequest"]


@dataclass(frozen=True)
class FinishedRequest:
    """A request as it ended at the broker (instants on the broker's clock)."""

    request_id: str
    received_at: float
    admitted_at: float | None  # None: it never left the queue
    ended_at: float
    tokens: int
    pipeline: str | None  # the endpoint of the replica it went to

    @property
    def queue_s(self) -> float:
        """Arrival -> permit (-> its end, when it never got one)."""
        return (self.admitted_at if self.admitted_at is not None else self.ended_at) - self.received_at


class BrokerTelemetry:
    def __init__(self, queue: Callable[[], AdmissionQueue], pipelines_ready: Callable[[], int],
                 outcomes: Mapping[str, int], clock: Callable[[], float], telemetry: Telemetry | None = None,
                 link_guard: Callable[[], LinkGuard | None] = lambda: None) -> None:
        """`queue` and `pipelines_ready` are read when scraped; `outcomes` (requests by outcome) is the
        broker's own tally, read then too, and so is `link_guard` (the guard of its links to the pipelines,
        once secured); `clock` is the broker's."""
        self.telemetry = telemetry or current()
        self.outcomes = outcomes
        self.clock = clock
        self.registry = registry = CollectorRegistry(auto_describe=True)
        for name, doc, read in (
                ("skippy_broker_queue_depth", "requests waiting for a generation permit", lambda: queue().waiting),
                ("skippy_broker_running", "generation permits held", lambda: queue().running),
                ("skippy_broker_concurrency", "generation permits (current concurrency)", lambda: queue().concurrency),
                ("skippy_broker_queue_capacity", "waiting requests at most", lambda: queue().capacity),
                ("skippy_broker_pipelines_ready", "pipeline replicas taking requests", pipelines_ready)):
            Gauge(name, doc, registry=registry).set_function(read)
        self.admitted_total = Counter("skippy_broker_admitted", "requests given a generation permit", registry=registry)
        self.relay_overflow = Counter("skippy_broker_relay_overflow", "messages for an adapter refused: its queue at the "
                                      "broker full (it does not read) or no such adapter (gone); its request failed",
                                      ["reason"], registry=registry)
        self.abandoned = Counter("skippy_broker_requests_abandoned", "requests whose client went away while they waited "
                                 "in the admission queue (taken out of it); stage 0 counts those it had", ["phase"],
                                 registry=registry)
        self.abandoned.labels("queued")
        registry.register(LinkMetrics(link_guard))
        registry.register(self)  # the outcome counters, read from the broker's own tally when scraped
        self.queue_wait = Histogram("skippy_broker_queue_wait_seconds", "arrival -> permit", registry=registry,
                                    buckets=SECONDS_BUCKETS)
        self.telemetry.attach(registry)

    def collect(self) -> Iterator[Metric]:
        outcomes = dict(self.outcomes)  # one copy (the event loop may add to it meanwhile)
        by_outcome = CounterMetricFamily("skippy_broker_requests", "requests finished or refused, by outcome "
                                         "(finish reason or error code)", labels=["outcome"])
        for outcome, n in sorted(outcomes.items()):
            by_outcome.add_metric([outcome], n)
        yield by_outcome
        rejected = CounterMetricFamily("skippy_broker_rejected_429", "requests refused with queue_full or admission_timeout")
        rejected.add_metric([], sum(n for outcome, n in outcomes.items() if http_status(outcome) == 429))
        yield rejected

    def _wall(self, instant: float) -> float:
        """An instant of the broker's clock as wall-clock seconds."""
        return time.time() - (self.clock() - instant)

    def admitted(self, queue_s: float) -> None:
        """A request got its permit after `queue_s` seconds in the queue."""
        self.admitted_total.inc()
        self.queue_wait.observe(max(0.0, queue_s))

    def finished(self, req: FinishedRequest, final: TokenEvents, outcome: str) -> None:
        """A request that had queued has ended: its summary span."""
        if not self.telemetry.spans:
            return
        self.telemetry.span("stage.openai_admission", self._wall(req.received_at), self._wall(req.ended_at),
                            request_id=req.request_id, outcome=outcome, finish_reason=str(final.finish_reason),
                            queue_ms=req.queue_s * 1e3, tokens=req.tokens, pipeline=req.pipeline)
