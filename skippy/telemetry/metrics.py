"""The metric types every stage shares: `StageMetrics`, its histogram buckets, activation byte counts.

`StageMetrics` is what every stage exports, stage 0 included (its driver feeds it): batch rows,
compute time, credit waits, activation bytes in and out, and, read when scraped, queue depth, KV
cells in use (token positions held over all sessions), sessions and credits outstanding. The
observers that feed it live with what they observe (skippy.stage.telemetry, skippy.driver.telemetry);
`SECONDS_BUCKETS` is also the broker's (brokers.telemetry). Nothing here imports a component.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from skippy.protocol import WireDtype
from skippy.protocol.activations import row_bytes

__all__ = ["ROW_BUCKETS", "SECONDS_BUCKETS", "StageMetrics", "activation_bytes"]

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class StageMetrics:
    """Every stage's Prometheus metrics, labelled with its stage_id, in `registry`."""

    def __init__(self, registry: CollectorRegistry, stage_id: str, *, queue_depth: Callable[[], float],
                 kv_cells: Callable[[], float], sessions: Callable[[], float],
                 credits_outstanding: Callable[[], float]) -> None:
        label = ["stage_id"]
        self.rows = Histogram("skippy_stage_batch_rows", "rows per batch", label, registry=registry,
                              buckets=ROW_BUCKETS).labels(stage_id)
        self.compute = Histogram("skippy_stage_compute_seconds", "llama.cpp compute per batch", label, registry=registry,
                                 buckets=SECONDS_BUCKETS).labels(stage_id)
        self.credit_waits = Counter("skippy_stage_credit_waits", "batches that waited for a downstream credit", label,
                                    registry=registry).labels(stage_id)
        self.credit_wait = Counter("skippy_stage_credit_wait_seconds", "time spent waiting for downstream credits", label,
                                   registry=registry).labels(stage_id)
        activation = Counter("skippy_stage_activation_bytes", "activation bytes on the wire", [*label, "direction"],
                             registry=registry)
        self.bytes_in, self.bytes_out = activation.labels(stage_id, "in"), activation.labels(stage_id, "out")
        for name, doc, read in (("skippy_stage_queue_depth", "messages waiting for the runtime", queue_depth),
                                ("skippy_stage_kv_cells", "KV token positions in use over all sessions", kv_cells),
                                ("skippy_stage_sessions", "sessions holding KV", sessions),
                                ("skippy_stage_credits_outstanding", "un-credited batches toward the downstream",
                                 credits_outstanding)):
            gauge = Gauge(name, doc, label, registry=registry).labels(stage_id)
            gauge.set_function(read)

    def observe(self, rows: int, compute_ms: float, credit_wait_ms: float, bytes_in: int, bytes_out: int) -> None:
        self.rows.observe(rows)
        self.compute.observe(compute_ms / 1e3)
        if credit_wait_ms > 0:
            self.credit_waits.inc()
            self.credit_wait.inc(credit_wait_ms / 1e3)
        if bytes_in:
            self.bytes_in.inc(bytes_in)
        if bytes_out:
            self.bytes_out.inc(bytes_out)


def activation_bytes(rows: int, dtype: WireDtype, n_embd: int) -> int:
    return rows * row_bytes(dtype, n_embd)
