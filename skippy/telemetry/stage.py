"""A stage's numbers: Prometheus metrics of its batches, and its spans (per batch at debug, per session).

`StageMetrics` is what every stage exports, stage 0 included (its driver feeds it): batch rows,
compute time, credit waits, activation bytes in and out, and, read when scraped, queue depth, KV
cells in use (token positions held over all sessions), sessions and credits outstanding.
`StageTelemetry` is the hook a later stage's server calls: `batch(...)` once a batch has left the
stage (debug spans `stage.binary_llama_decode` and `stage.binary_message_timing`) and
`released(...)` when sessions end (summary span `stage.binary_session_stop` with the session's totals).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from skippy.protocol import Batch, WireDtype
from skippy.protocol.activations import row_bytes
from skippy.telemetry.process import Telemetry, current

if TYPE_CHECKING:
    from skippy.stage.server import StageServer
    from skippy.stage.worker import Computed

__all__ = ["StageMetrics", "StageTelemetry"]

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
MAX_TRACKED_SESSIONS = 1024  # per-session tallies kept at most (sessions dropped without a release age out)


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


@dataclass
class _Session:
    first_at: float  # wall clock
    batches: int = 0
    rows: int = 0
    compute_ms: float = 0.0
    kv_cells: int = 0


class StageTelemetry:
    """The telemetry hooks of a stage server (stages after stage 0)."""

    def __init__(self, server: StageServer, telemetry: Telemetry | None = None) -> None:
        self.server = server
        self.telemetry = telemetry or current()
        self.stage_id = server.identity.stage_id
        self.sessions: dict[int, _Session] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        downstream = lambda: server.downstream  # noqa: E731 - read at scrape time
        self.metrics = StageMetrics(
            self.registry, self.stage_id, queue_depth=lambda: server.work.qsize(),
            kv_cells=lambda: sum(s.kv_cells for s in list(self.sessions.values())), sessions=lambda: len(self.sessions),
            credits_outstanding=lambda: (link.credits.stats.outstanding if (link := downstream()) is not None else 0))
        self.telemetry.attach(self.registry)
        self.telemetry.span("stage.binary_server_start", self.telemetry.started_at, n_embd=server.identity.n_embd,
                            final=server.runtime.is_final, max_inflight=server.options.max_inflight,
                            reply_credit_limit=server.options.reply_credit_limit)

    def batch(self, batch: Batch, computed: Computed, recv_at: float, credit_wait_ms: float, write_ms: float) -> None:
        """A batch has left this stage (forwarded, or answered at the final stage)."""
        n_embd, rows = self.server.identity.n_embd, batch.n_rows
        bytes_in = activation_bytes(rows, batch.wire_dtype, n_embd) if batch.hidden is not None else 0
        link = self.server.downstream
        bytes_out = activation_bytes(rows, link.wire.activation_dtype, n_embd) if link is not None else 0
        self.metrics.observe(rows, computed.compute_ms, credit_wait_ms, bytes_in, bytes_out)
        share = computed.compute_ms / max(1, rows)
        for w in batch.windows:
            tally = self.sessions.get(w.session_id)
            if tally is None:
                tally = self.sessions[w.session_id] = _Session(recv_at)
                if len(self.sessions) > MAX_TRACKED_SESSIONS:
                    self.sessions.pop(next(iter(self.sessions)))
            tally.batches += 1
            tally.rows += w.n_tokens
            tally.compute_ms += share * w.n_tokens
            tally.kv_cells = w.pos_start + w.n_tokens
        if not self.telemetry.debug_spans:
            return
        compute_end = computed.started_at + computed.compute_ms / 1e3
        sessions = [w.session_id for w in batch.windows]
        self.telemetry.span("stage.binary_llama_decode", computed.started_at, compute_end, debug=True,
                            batch_id=batch.batch_id, decode_batch_size=rows, session_ids=sessions)
        self.telemetry.span(
            "stage.binary_message_timing", recv_at, debug=True, batch_id=batch.batch_id, decode_batch_size=rows,
            session_ids=sessions, compute_ms=computed.compute_ms, downstream_wait_ms=credit_wait_ms,
            forward_write_ms=write_ms, queue_wait_ms=(computed.started_at - recv_at) * 1e3,
            input_activation_bytes=bytes_in, output_activation_bytes=bytes_out,
            forward_mode="async_writer" if self.server.options.async_prefill_forward else "sync_write",
            queue_depth=self.server.work.qsize())

    def released(self, session_ids: tuple[int, ...]) -> None:
        """Sessions ended here: one summary span each with its totals at this stage."""
        now = time.time()
        for session_id in session_ids:
            tally = self.sessions.pop(session_id, None)
            if tally is not None:
                self.telemetry.span("stage.binary_session_stop", tally.first_at, now, session_id=session_id,
                                    batches=tally.batches, rows=tally.rows, compute_ms=round(tally.compute_ms, 3),
                                    kv_cells=tally.kv_cells)
