"""Observability's low layer: process-wide telemetry setup and the metric types components share.

- `options.py`: the telemetry flags (level, queue capacity, OTLP endpoint) and span resource attributes.
- `events.py`: the bounded event queue (full: dropped and counted) drained by one background thread.
- `otlp.py`: that thread's sink: OTLP gRPC export with opentelemetry-sdk's span model and exporter.
- `process.py`: one process's `Telemetry` (installed by its entry point; `current()`); start here.
  `metrics_server.py`: its /metrics server (loopback by default, behind the API key when one is set).
- `metrics.py`: `StageMetrics` (every stage's, stage 0's too), the histogram buckets, activation bytes.
- `targets.py`: `<run_dir>/metrics-targets.json`, where each process serves /metrics (Prometheus file_sd).
- `scrape.py`: reading every process's /metrics back and summarising it (the dashboard's, the benchmarks').
- `links.py`: the CURVE link guard's counts (admitted, refused, refused beyond its bound) for an observer's registry.
- `restart_counts.py`: a run's restart counts (`<run_dir>/restarts.json`) served on the adapter's /metrics.

Each component's observer lives with it and feeds these: skippy.stage.telemetry, skippy.driver.telemetry,
brokers.telemetry, skippy.adapter.request_metrics; the adapter's /dashboard page is skippy.adapter.dashboard. Nothing
here imports a component (driver, stage, broker, adapter).

The hot path only ever puts an event on a bounded queue or bumps a prometheus_client counter;
gauges are read when scraped.
"""

from skippy.telemetry.options import TelemetryOptions
from skippy.telemetry.process import Telemetry, current, install

__all__ = ["Telemetry", "TelemetryOptions", "current", "install"]
