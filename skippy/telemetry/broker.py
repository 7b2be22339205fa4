"""The admission broker's numbers: queue depth, admitted, 429s, concurrency; one span per request.

Gauges and the outcome counters are read from the broker when scraped (nothing on the request
path); `admitted` and `finished` are the broker's two hooks. `skippy_broker_rejected_429_total` counts
the refusals an adapter turns into HTTP 429 (queue_full, admission_timeout). Each request ends
with a summary span `stage.openai_admission` from its arrival to its end, with its queue wait,
outcome, tokens and pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric

from skippy.protocol import TokenEvents
from skippy.telemetry.process import Telemetry, current
from skippy.telemetry.stage import SECONDS_BUCKETS

if TYPE_CHECKING:
    from brokers.broker import Broker, _Request

__all__ = ["BrokerTelemetry", "HTTP_429_CODES"]

HTTP_429_CODES = frozenset({"queue_full", "admission_timeout"})


class BrokerTelemetry:
    def __init__(self, broker: Broker, telemetry: Telemetry | None = None) -> None:
        self.broker = broker
        self.telemetry = telemetry or current()
        self.registry = registry = CollectorRegistry(auto_describe=True)
        admission = lambda: broker.queue  # noqa: E731 - the broker may replace its queue; read it when scraped
        for name, doc, read in (
                ("skippy_broker_queue_depth", "requests waiting for a generation permit", lambda: admission().waiting),
                ("skippy_broker_running", "generation permits held", lambda: admission().running),
                ("skippy_broker_concurrency", "generation permits (current concurrency)", lambda: admission().concurrency),
                ("skippy_broker_queue_capacity", "waiting requests at most", lambda: admission().capacity),
                ("skippy_broker_pipelines_ready", "pipeline replicas taking requests",
                 lambda: len(broker.pool.ready_links()))):
            Gauge(name, doc, registry=registry).set_function(read)
        self.admitted_total = Counter("skippy_broker_admitted", "requests given a generation permit", registry=registry)
        registry.register(self)  # the outcome counters, read from the broker's own tally when scraped
        self.queue_wait = Histogram("skippy_broker_queue_wait_seconds", "arrival -> permit", registry=registry,
                                    buckets=SECONDS_BUCKETS)
        self.telemetry.attach(registry)

    def collect(self) -> Iterator[Metric]:
        outcomes = dict(self.broker.outcomes)  # one copy (the event loop may add to it meanwhile)
        by_outcome = CounterMetricFamily("skippy_broker_requests", "requests finished or refused, by outcome "
                                         "(finish reason or error code)", labels=["outcome"])
        for outcome, n in sorted(outcomes.items()):
            by_outcome.add_metric([outcome], n)
        yield by_outcome
        rejected = CounterMetricFamily("skippy_broker_rejected_429", "requests refused with queue_full or admission_timeout")
        rejected.add_metric([], sum(n for outcome, n in outcomes.items() if outcome in HTTP_429_CODES))
        yield rejected

    def _wall(self, instant: float) -> float:
        """An instant of the broker's clock as wall-clock seconds."""
        return time.time() - (self.broker.clock() - instant)

    def admitted(self, req: _Request) -> None:
        self.admitted_total.inc()
        if req.admitted_at is not None:
            self.queue_wait.observe(max(0.0, req.admitted_at - req.received_at))

    def finished(self, req: _Request, final: TokenEvents, outcome: str) -> None:
        """A request that had queued has ended: its summary span."""
        if not self.telemetry.spans:
            return
        now = self.broker.clock()
        queue_end = req.admitted_at if req.admitted_at is not None else now
        self.telemetry.span("stage.openai_admission", self._wall(req.received_at), self._wall(now),
                            request_id=req.submit.request_id, outcome=outcome, finish_reason=str(final.finish_reason),
                            queue_ms=(queue_end - req.received_at) * 1e3, tokens=req.tokens,
                            pipeline=req.link.endpoint if req.link is not None else None)
