"""The HTTP adapter's Prometheus metrics (prometheus_client), its request spans, and the broker's view.

Requests by route and status, error codes, prompt and completion tokens, time to first token and
time per output token histograms, request fields ignored (skippy.adapter.request_fields), speculative counts
summed over requests (also under llama-server's `spec_decode_*` names: skippy.adapter.spec_metrics), and the
pipeline as the broker reports it (ready, running, waiting, concurrency; refreshed when /metrics is scraped). A
generation is tracked from its first token to its end (`generation_started` / `tokens` /
`generation_done`), which also emits its summary span `stage.openai_request_summary`.
`DirectEventsCollector` counts the token event messages stage 0 sent straight to the adapter. The HTTP server's
connection events (skippy.http.server.ConnectionObserver): connections refused past the cap, clients
closed as too slow (head, body or idle deadline), connections open.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from skippy.adapter.prefix_metrics import PrefixCacheMetrics
from skippy.adapter.spec_metrics import SpecDecodeMetrics
from skippy.protocol import Status, TokenEvents
from skippy.protocol.stats import SPECULATIVE_COUNTS, RequestStats
from skippy.telemetry.process import Telemetry, current, wall_time

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
PIPELINE_GAUGES = ("pipeline_ready", "requests_running", "requests_waiting", "generation_concurrency")
REFUSALS = ("max_connections",)
TIMEOUTS = ("head_timeout", "body_timeout", "idle_timeout")


@dataclass
class _Generation:
    started: float  # perf_counter at submit
    first: float  # perf_counter of the first token
    prompt_tokens: int
    kind: str
    tokens: int = 0
    last: float = 0.0


class Metrics:
    def __init__(self, telemetry: Telemetry | None = None) -> None:
        self.telemetry = telemetry or current()
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("skippy_http_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=registry)
        self.errors = Counter("skippy_request_errors", "generations that failed, by error code", ["code"], registry=registry)
        self.prompt_tokens = Counter("skippy_prompt_tokens", "prompt tokens of started generations", registry=registry)
        self.completion_tokens = Counter("skippy_completion_tokens", "tokens generated", registry=registry)
        self.ttft = Histogram("skippy_time_to_first_token_seconds", "submit -> first token", registry=registry,
                              buckets=TTFT_BUCKETS)
        self.tpot = Histogram("skippy_time_per_output_token_seconds", "per request: (last - first token) / (tokens - 1)",
                              registry=registry, buckets=TPOT_BUCKETS)
        self.speculative = {name: Counter(f"skippy_speculative_{name}", f"speculative {name}, summed over requests",
                                          registry=registry) for name in ("requests", *SPECULATIVE_COUNTS)}
        self.spec_decode = SpecDecodeMetrics(registry)
        self.pipeline = {name: Gauge(f"skippy_{name}", f"the broker's {name}", registry=registry) for name in PIPELINE_GAUGES}
        self.wire = Gauge("skippy_activation_wire", "1 for the activation wire format stage 0 certified at startup"
                          " (asked: f32 | f16 | q8 | auto; used; certified)", ["asked", "used", "certified"], registry=registry)
        self.wire_agreement = Gauge("skippy_activation_wire_agreement", "argmax agreement with f32 of each format stage 0"
                                    " tried at startup", ["dtype"], registry=registry)
        self.prefix_cache = PrefixCacheMetrics(registry)
        self.refused = Counter("skippy_http_connections_refused", "connections answered 503 and closed unread, by reason",
                               ["reason"], registry=registry)
        self.slow_clients = Counter("skippy_http_slow_clients_closed", "connections closed at a deadline: the request"
                                    " head or body not whole in time, or idle between requests", ["reason"],
                                    registry=registry)
        self.resumed = Counter("skippy_http_resumed", "generations resumed from the tokens their client was sent after"
                               " their stage 0 or the broker died (skippy.adapter.resume)", registry=registry)
        self.fields_ignored = Counter("skippy_request_fields_ignored", "request fields no route knows, ignored (not"
                                      " refused: --strict-request-fields), by route and field", ["route", "field"],
                                      registry=registry)
        self.open_connections = Gauge("skippy_http_connections_open", "HTTP connections being served", registry=registry)
        for reason in REFUSALS:
            self.refused.labels(reason)
        for reason in TIMEOUTS:
            self.slow_clients.labels(reason)
        self._live: dict[str, _Generation] = {}
        self.telemetry.attach(registry)

    def count_request(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    def requests_total(self) -> int:
        return int(sum(s.value for m in self.requests.collect() for s in m.samples if s.name.endswith("_total")))

    def count_ignored_field(self, route: str, field: str) -> None:
        self.fields_ignored.labels(route, field).inc()

    def connection_refused(self, reason: str) -> None:
        self.refused.labels(reason).inc()

    def connection_timed_out(self, reason: str) -> None:
        self.slow_clients.labels(reason).inc()

    def connections_open(self, count: int) -> None:
        self.open_connections.set(count)

    def count_error(self, code: str) -> None:
        self.errors.labels(code).inc()

    def observe_stats(self, stats: RequestStats | None) -> None:
        """Add a finished request's speculative counts (windows, proposed, accepted, rejects, wasted rows) and
        prefix cache numbers."""
        if stats is None:
            return
        if stats.prefix_cache is not None:
            self.prefix_cache.observe(stats.prefix_cache)
        if stats.speculative is not None:
            self.speculative["requests"].inc()
            for name in SPECULATIVE_COUNTS:
                value = getattr(stats.speculative, name)
                if value > 0:
                    self.speculative[name].inc(value)
            self.spec_decode.observe(stats.speculative)

    def set_pipeline(self, status: Status | None) -> None:
        """The broker's view (None: it did not answer)."""
        values = ((float(status.ready), status.running, status.waiting, status.lane_count) if status is not None
                  else (0.0, 0, 0, 0))
        for name, value in zip(PIPELINE_GAUGES, values):
            self.pipeline[name].set(value)
        self.wire.clear()
        self.wire_agreement.clear()
        if status is not None and status.wire is not None:
            verdict = status.wire
            self.wire.labels(verdict.asked, str(verdict.used), str(verdict.certified).lower()).set(1)
            for dtype, agreement in verdict.tried:
                self.wire_agreement.labels(str(dtype)).set(agreement)

    # -- one generation ---------------------------------------------------------------------------
    def generation_started(self, rid: str, started: float, prompt_tokens: int, kind: str) -> None:
        """The first event of generation `rid` (submitted at perf_counter `started`) has arrived."""
        now = time.perf_counter()
        self.ttft.observe(now - started)
        self.prompt_tokens.inc(prompt_tokens)
        self._live[rid] = _Generation(started, now, prompt_tokens, kind, last=now)

    def tokens(self, rid: str, n: int) -> None:
        """Generation `rid` was given `n` more tokens (one step's)."""
        self.completion_tokens.inc(n)
        gen = self._live.get(rid)
        if gen is not None:
            gen.tokens += n
            gen.last = time.perf_counter()

    def generation_done(self, rid: str, last: TokenEvents | None, stopped: bool) -> None:
        """Generation `rid` ended (`last`: its last event; `stopped`: a stop string ended it)."""
        gen = self._live.pop(rid, None)
        if gen is None:
            return
        tpot = (gen.last - gen.first) / (gen.tokens - 1) if gen.tokens > 1 else None
        if tpot is not None:
            self.tpot.observe(tpot)
        reason = str(last.finish_reason) if last is not None and last.final else "stop" if stopped else "cancelled"
        self.telemetry.span("stage.openai_request_summary", wall_time(gen.started), request_id=rid, kind=gen.kind,
                            finish_reason=reason, prompt_tokens=gen.prompt_tokens, completion_tokens=gen.tokens,
                            ttft_ms=(gen.first - gen.started) * 1e3, tpot_ms=None if tpot is None else tpot * 1e3)

    def render(self) -> bytes:
        """This process's /metrics: with an installed telemetry, everything it serves (the adapter's registry
        and the telemetry's own counters); otherwise (an adapter built in a test) the adapter's registry."""
        if self.telemetry.installed:
            return self.telemetry.render()
        return generate_latest(self.registry)


class DirectEventsCollector(Collector):
    """skippy_direct_token_events_total, read at each scrape: token event messages (one per step, a TokenEvents or an
    EventBatch) stage 0 sent straight to this adapter instead of through the broker (skippy.driver.direct_events)."""

    def __init__(self, count: Callable[[], int]) -> None:
        self.count = count

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("skippy_direct_token_events",
                                  "token event messages (one per step) stage 0 sent straight to this adapter",
                                  value=float(self.count()))
