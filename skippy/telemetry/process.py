"""One process's telemetry: its level, its span queue, its Prometheus registries and /metrics server.

Each process entry point (`skippy stage`, `skippy broker`, `skippy adapter`) builds a `Telemetry`
from its options and `install`s it; the components of the process (stage server, driver, broker,
adapter) take `current()` and attach their own Prometheus registries to it. Without an install
(components built in tests or benchmarks) `current()` is a disabled telemetry: spans go nowhere and
nothing is served. `serve_metrics` starts the process's /metrics server (skippy.telemetry.metrics_server,
daemon threads) on an ephemeral port of `--metrics-bind` (default loopback), behind the API key
(`$SKIPPY_OPENAI_API_KEY`, the adapter's) when one is set, and adds its URL to the process's `ready`
fields, so launchers can list it in the run directory (skippy.telemetry.targets). Spans are only
queued when an OTLP endpoint is set and the level is not `off`; `debug` spans only at `debug`.
"""

from __future__ import annotations

import atexit
import time
from collections.abc import Iterator, Mapping

import prometheus_client
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from skippy.config import TelemetryLevel
from skippy.config.api_key import api_key_from
from skippy.config.link_keys import non_loopback
from skippy.log import add_ready_fields, get_logger
from skippy.telemetry.events import AttrValue, EventQueue, SpanEvent
from skippy.telemetry.metrics_server import MetricsServer
from skippy.telemetry.options import TelemetryOptions

__all__ = ["DEFAULT_METRICS_BIND", "Telemetry", "current", "install", "start_telemetry", "wall_time"]

DEFAULT_METRICS_BIND = "127.0.0.1"

prometheus_client.disable_created_metrics()  # no *_created series: counters and histograms only


def wall_time(perf: float) -> float:
    """A `time.perf_counter()` instant as wall-clock seconds since the epoch."""
    return time.time() - (time.perf_counter() - perf)


class Telemetry:
    def __init__(self, options: TelemetryOptions | None = None, role: str = "process") -> None:
        self.options = options or TelemetryOptions(level=TelemetryLevel.OFF)
        self.level = self.options.level
        self.role = role
        self.started_at = time.time()
        self.queue: EventQueue | None = None
        if self.options.otlp_endpoint is not None and self.level is not TelemetryLevel.OFF:
            from skippy.telemetry.otlp import OtlpSink

            self.queue = EventQueue(self.options.queue_capacity, OtlpSink(self.options.otlp_endpoint, self.options.resource))
        self._collectors: list[Collector] = []
        self._server: MetricsServer | None = None
        self.metrics_url: str | None = None
        self.installed = False  # what `current()` returns; only then are attached registries kept and served

    @property
    def spans(self) -> bool:
        """Summary spans are exported."""
        return self.queue is not None

    @property
    def debug_spans(self) -> bool:
        """Per-message spans are exported (level debug)."""
        return self.queue is not None and self.level is TelemetryLevel.DEBUG

    def span(self, name: str, start_s: float, end_s: float | None = None, *, request_id: str | None = None,
             debug: bool = False, extra: Mapping[str, AttrValue] | None = None, **attributes: AttrValue | None) -> None:
        """Queue a finished span (wall-clock seconds; no end: now) without blocking; a full queue drops and
        counts it. Attributes: `extra` and the keywords (None values left out)."""
        events = self.queue
        if events is None or (debug and self.level is not TelemetryLevel.DEBUG):
            return
        end = time.time() if end_s is None else end_s
        attrs = {**(extra or {}), **{k: v for k, v in attributes.items() if v is not None}}
        events.emit(SpanEvent(name, int(start_s * 1e9), int(end * 1e9), attrs, request_id))

    # -- Prometheus ------------------------------------------------------------------------------
    def attach(self, collector: Collector) -> None:
        """Serve `collector` (a component's registry) from this process's /metrics (when installed: components
        built without an installed telemetry, in tests and benchmarks, keep their registries to themselves)."""
        if self.installed:
            self._collectors.append(collector)

    def collect(self) -> Iterator[Metric]:
        """Every attached registry's metrics, then the telemetry's own counters."""
        for collector in list(self._collectors):
            yield from collector.collect()
        yield from self._own_metrics()

    def _own_metrics(self) -> Iterator[Metric]:
        info = InfoMetricFamily("skippy_telemetry", "this process's telemetry settings")
        info.add_metric([], {"role": self.role, "level": str(self.level), "otlp_endpoint": self.options.otlp_endpoint or ""})
        yield info
        capacity = GaugeMetricFamily("skippy_telemetry_queue_capacity", "telemetry events buffered for export at most")
        capacity.add_metric([], self.options.queue_capacity)
        yield capacity
        depth = GaugeMetricFamily("skippy_telemetry_queue_depth", "telemetry events waiting for export")
        depth.add_metric([], self.queue.depth if self.queue is not None else 0)
        yield depth
        counters = self.queue.counters() if self.queue is not None else dict.fromkeys(("queued", "sent", "dropped"), 0)
        for name in ("queued", "sent", "dropped"):
            family = CounterMetricFamily(f"skippy_telemetry_events_{name}", f"telemetry events {name}")
            family.add_metric([], counters[name])
            yield family
        errors = CounterMetricFamily("skippy_telemetry_export_errors", "failed OTLP exports")
        errors.add_metric([], counters.get("export_errors", 0))
        yield errors

    def render(self) -> bytes:
        """/metrics in Prometheus text format."""
        return prometheus_client.generate_latest(self)  # any object with collect() is a registry

    def serve_metrics(self, host: str = DEFAULT_METRICS_BIND, api_key: str | None = None, endpoint: str | None = None) -> str:
        """Serve /metrics on `host` at an ephemeral port, behind `api_key` when given; returns its URL (also
        announced as `metrics_url`): on a wildcard `host`, at the host of the process's tcp `endpoint` (so a
        stage in another network namespace is scraped where its links are), else loopback."""
        self._server = server = MetricsServer(self, host, api_key)
        if api_key is None and non_loopback(f"tcp://{host}:0"):
            get_logger().warning("metrics_open", error=f"--metrics-bind {host}: /metrics on a non-loopback address"
                                 " without an API key: anyone who reaches it reads it", metrics_bind=host)
        if host in ("0.0.0.0", "", "::"):
            host = _endpoint_host(endpoint) or ("::1" if host == "::" else "127.0.0.1")
        shown = f"[{host}]" if ":" in host else host
        self.metrics_url = f"http://{shown}:{server.server_port}/metrics"
        add_ready_fields(metrics_url=self.metrics_url)
        return self.metrics_url

    def close(self) -> None:
        if self.queue is not None:
            self.queue.close()
        if self._server is not None:
            self._server.close()


_current = Telemetry()


def install(telemetry: Telemetry) -> Telemetry:
    """Make `telemetry` this process's (what `current()` returns); returns it."""
    global _current
    _current = telemetry
    telemetry.installed = True
    return telemetry


def current() -> Telemetry:
    return _current


def _endpoint_host(endpoint: str | None) -> str | None:
    """The concrete host of a tcp:// endpoint (None: not tcp, or a wildcard)."""
    if endpoint is None or not endpoint.startswith("tcp://"):
        return None
    host = endpoint[len("tcp://"):].rpartition(":")[0].strip("[]")
    return None if host in ("*", "", "0.0.0.0", "::") else host


def start_telemetry(options: TelemetryOptions, role: str, endpoint: str | None = None, *, serve: bool = True,
                    metrics_bind: str = DEFAULT_METRICS_BIND, api_key: str | None = None) -> Telemetry:
    """A process entry point's telemetry: installed, closed at exit, and (`serve`) /metrics served on
    `metrics_bind`, behind `api_key` (default: `$SKIPPY_OPENAI_API_KEY`; the adapter serves /metrics on its
    own HTTP port instead); `endpoint`: the process's own, where a wildcard bind is announced."""
    telemetry = install(Telemetry(options, role))
    if serve:
        telemetry.serve_metrics(metrics_bind, api_key if api_key is not None else api_key_from(None), endpoint)
    atexit.register(telemetry.close)
    return telemetry
