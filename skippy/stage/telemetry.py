"""A later stage's observer: its `StageMetrics` fed per batch, and its spans (per batch at debug, per session).

`StageTelemetry` is built from the parts of a stage server it reads (its identity and options, a
getter of its downstream link, its work queue's depth), never from the server itself. The server
calls `batch(...)` once a batch has left the stage (debug spans `stage.binary_llama_decode` and
`stage.binary_message_timing`) and `released(...)` when sessions end (summary span
`stage.binary_session_stop` with the session's totals). `credits_outstanding` and `bytes_out` read a
downstream link the same way for stage 0's driver (skippy.driver.telemetry).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from skippy.config import ServingOptions
from skippy.protocol import Batch, StageIdentity
from skippy.stage.links import DownstreamLink
from skippy.stage.worker import Computed
from skippy.telemetry.links import LinkMetrics
from skippy.telemetry.metrics import StageMetrics, activation_bytes
from skippy.telemetry.process import Telemetry, current
from skippy.transport.curve_guard import LinkGuard

__all__ = ["StageTelemetry", "bytes_out", "credits_outstanding"]

MAX_TRACKED_SESSIONS = 1024  # per-session tallies kept at most (sessions dropped without a release age out)


def credits_outstanding(link: DownstreamLink | None) -> int:
    """Un-credited batches toward `link` (0 at the last stage)."""
    return link.credits.stats.outstanding if link is not None else 0


def bytes_out(link: DownstreamLink | None, rows: int, n_embd: int) -> int:
    """Activation bytes of `rows` rows sent on `link` (0 at the last stage)."""
    return activation_bytes(rows, link.wire.activation_dtype, n_embd) if link is not None else 0


@dataclass
class _Session:
    first_at: float  # wall clock
    batches: int = 0
    rows: int = 0
    compute_ms: float = 0.0
    kv_cells: int = 0


class StageTelemetry:
    """The telemetry hooks of a stage server (stages after stage 0)."""

    def __init__(self, identity: StageIdentity, options: ServingOptions, *, final: bool,
                 queue_depth: Callable[[], int], downstream: Callable[[], DownstreamLink | None],
                 telemetry: Telemetry | None = None, link_guard: Callable[[], LinkGuard | None] = lambda: None) -> None:
        """`queue_depth`, `downstream` (the link, None at the final stage) and `link_guard` (the CURVE guard
        of the stage's links, once secured) are read when needed."""
        self.telemetry = telemetry or current()
        self.stage_id, self.n_embd = identity.stage_id, identity.n_embd
        self.queue_depth = queue_depth
        self.downstream = downstream
        self.forward_mode = "async_writer" if options.async_prefill_forward else "sync_write"
        self.sessions: dict[int, _Session] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self.metrics = StageMetrics(
            self.registry, self.stage_id, queue_depth=queue_depth,
            kv_cells=lambda: sum(s.kv_cells for s in list(self.sessions.values())), sessions=lambda: len(self.sessions),
            credits_outstanding=lambda: credits_outstanding(downstream()))
        self.registry.register(LinkMetrics(link_guard))
        self.telemetry.attach(self.registry)
        self.telemetry.span("stage.binary_server_start", self.telemetry.started_at, n_embd=self.n_embd,
                            final=final, max_inflight=options.max_inflight,
                            reply_credit_limit=options.reply_credit_limit)

    def batch(self, batch: Batch, computed: Computed, recv_at: float, credit_wait_ms: float, write_ms: float) -> None:
        """A batch has left this stage (forwarded, or answered at the final stage)."""
        rows = batch.n_rows
        bytes_in = activation_bytes(rows, batch.wire_dtype, self.n_embd) if batch.hidden is not None else 0
        sent = bytes_out(self.downstream(), rows, self.n_embd)
        self.metrics.observe(rows, computed.compute_ms, credit_wait_ms, bytes_in, sent)
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
            input_activation_bytes=bytes_in, output_activation_bytes=sent,
            forward_mode=self.forward_mode, queue_depth=self.queue_depth())

    def released(self, session_ids: tuple[int, ...]) -> None:
        """Sessions ended here: one summary span each with its totals at this stage."""
        now = time.time()
        for session_id in session_ids:
            tally = self.sessions.pop(session_id, None)
            if tally is not None:
                self.telemetry.span("stage.binary_session_stop", tally.first_at, now, session_id=session_id,
                                    batches=tally.batches, rows=tally.rows, compute_ms=round(tally.compute_ms, 3),
                                    kv_cells=tally.kv_cells)
