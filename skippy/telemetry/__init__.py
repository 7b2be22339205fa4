"""Observability: OTLP spans through a bounded non-blocking queue, Prometheus metrics from every process,
and the adapter's live /dashboard.

- `options`: the telemetry flags (level, queue capacity, OTLP endpoint) and span resource attributes.
- `events`: the bounded event queue (full: dropped and counted) drained by one background thread.
- `otlp`: that thread's sink: OTLP gRPC export with opentelemetry-sdk's span model and exporter.
- `process`: one process's `Telemetry` (installed by its entry point; `current()`), its /metrics server.
- `stage`, `driver`, `broker`: each component's Prometheus metrics and spans (small hooks in the component);
  the adapter's are in skippy.http.metrics.
- `targets`: `<run_dir>/metrics-targets.json`, where each process serves /metrics (Prometheus file_sd).
- `scrape`, `dashboard`: `/dashboard` and the JSON it polls, merged from every process's /metrics.

The hot path only ever puts an event on a bounded queue or bumps a prometheus_client counter;
gauges are read when scraped.
"""

from skippy.telemetry.options import TelemetryOptions
from skippy.telemetry.process import Telemetry, current, install

__all__ = ["Telemetry", "TelemetryOptions", "current", "install"]
