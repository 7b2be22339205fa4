"""Stage 0's observer: Prometheus metrics of the scheduler and the whole pipeline, its spans, its batch log.

The driver is where the pipeline's timings meet: every batch comes back with each stage's compute
and credit wait (`StageTiming`), so `skippy_pipeline_stage_compute_seconds_total{stage_id}` shows
every stage's utilisation from stage 0 alone, and `skippy_pipeline_stage_prefill_compute_seconds_total{stage_id}`
(its compute on batches carrying prefill rows) its prefill tokens/s. Stage 0's own batches feed the same `StageMetrics`
as every other stage. `DriverTelemetry` is built from the driver's parts (its identity, its
`SequenceTable`, its `BatchLauncher` with the batches in flight and the downstream link, a getter of
their limit), never from the driver itself. Hooks: `iteration` when a batch's predictions are back (and its debug log
`iteration_done`, with every stage's timing: a prompt's per-chunk timeline), `outcome` for each request's share of
it, `finished` when a request ends. Spans:
summary `stage.openai_prefill` (a request's first token) and `stage.openai_generation_summary` (its
totals); debug `stage.scheduler_iteration`, `stage.binary_llama_decode` (stage 0's compute) and
`stage.openai_decode_token` (phase cold, warmup, steady). Bounded queues' refusals are counters the driver
and its request endpoint move: `waiting_refused` (a direct submit past `max_waiting`, answered queue_full)
and `events_to_overflow` (a direct token event a client's full event socket refused; its request failed).
`replays` / `replayed_tokens`: requests replayed after a later stage died, or submitted from a resume point
(skippy.driver.replay); `preemptions` and the KV pool's gauges (`watch_pool`): skippy.driver.cell_pool.
`abandoned`: a request whose client went away (Cancel.abandoned), counted by the phase it was in
(`skippy_driver_requests_abandoned_total{phase="queued|prefill|decode"}`) and logged `request_abandoned`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from skippy.driver.batches import BatchLauncher, InFlight
from skippy.driver.postprocess import Outcome
from skippy.driver.sequence import SeqState, Sequence, SequenceTable
from skippy.log import get_logger
from skippy.protocol import FinishReason, Predictions, StageIdentity
from skippy.stage.telemetry import bytes_out, credits_outstanding
from skippy.telemetry.links import LinkMetrics
from skippy.telemetry.metrics import SECONDS_BUCKETS, StageMetrics
from skippy.telemetry.process import Telemetry, current, wall_time
from skippy.transport.curve_guard import LinkGuard

__all__ = ["DriverTelemetry"]

WARMUP_TOKENS = 4  # decode tokens after the first that count as warm-up in stage.openai_decode_token


class DriverTelemetry:
    def __init__(self, identity: StageIdentity, table: SequenceTable, launcher: BatchLauncher,
                 max_iterations: Callable[[], int], *, lanes: int, n_batch: int, telemetry: Telemetry | None = None,
                 link_guard: Callable[[], LinkGuard | None] = lambda: None) -> None:
        """`table` and `launcher` (the batches in flight, the downstream link) are read when scraped, and so are
        `max_iterations` (micro-batches kept in flight at most) and `link_guard` (the CURVE guard of stage 0's
        links, once secured); `lanes` and `n_batch` go on the start span."""
        self.telemetry = telemetry or current()
        self.log = get_logger()
        self.n_embd = identity.n_embd
        self.launcher = launcher
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.stage = StageMetrics(
            registry, identity.stage_id, queue_depth=lambda: len(table.waiting),
            kv_cells=lambda: sum(seq.length for seq in list(table.running)), sessions=lambda: len(table.running),
            credits_outstanding=lambda: credits_outstanding(launcher.downstream))
        for name, doc, read in (
                ("skippy_driver_sessions_running", "requests holding a session on every stage", lambda: len(table.running)),
                ("skippy_driver_sessions_waiting", "requests waiting for a free lane", lambda: len(table.waiting)),
                ("skippy_driver_micro_batches_in_flight", "micro-batches between stage 0 and the predictions' return",
                 lambda: len(launcher.inflight)),
                ("skippy_driver_micro_batches_limit", "micro-batches kept in flight at most", max_iterations)):
            Gauge(name, doc, registry=registry).set_function(read)
        self.prefill_tokens = Counter("skippy_driver_prefill_tokens", "prompt tokens run through the pipeline", registry=registry)
        self.decode_tokens = Counter("skippy_driver_decode_tokens", "tokens generated and delivered", registry=registry)
        self.iterations = Counter("skippy_driver_iterations", "micro-batches completed", registry=registry)
        self.requests = Counter("skippy_driver_requests", "requests finished, by finish reason", ["finish_reason"],
                                registry=registry)
        self.proposed = Counter("skippy_driver_speculative_proposed", "draft tokens sent in verify windows", registry=registry)
        self.accepted = Counter("skippy_driver_speculative_accepted", "draft tokens the final stage accepted",
                                registry=registry)
        self.stage_compute = Counter("skippy_pipeline_stage_compute_seconds", "each stage's compute, from batch timings",
                                     ["stage_id"], registry=registry)
        self.stage_prefill_compute = Counter(
            "skippy_pipeline_stage_prefill_compute_seconds", "each stage's compute on batches carrying prefill rows "
            "(skippy_driver_prefill_tokens_total over it: the stage's prefill tokens/s)", ["stage_id"], registry=registry)
        self.stage_wait = Counter("skippy_pipeline_stage_credit_wait_seconds", "each stage's credit waits, from batch timings",
                                  ["stage_id"], registry=registry)
        self.waiting_refused = Counter("skippy_driver_waiting_refused", "requests refused with queue_full: stage 0's "
                                       "queue of requests waiting for a lane was full", registry=registry)
        self.events_to_overflow = Counter("skippy_driver_events_to_overflow", "direct token events refused by a client's "
                                          "full event socket (the request then failed with slow_client)", registry=registry)
        self.replays = Counter("skippy_driver_replays", "requests prefilled again: paused ones once a later stage"
                               " that died is back, and ones submitted from a resume point", registry=registry)
        self.replayed_tokens = Counter("skippy_driver_replayed_tokens", "committed tokens prefilled again by replays",
                                       registry=registry)
        self.preemptions = Counter("skippy_driver_preemptions", "sessions preempted to give their KV cells to older"
                                   " ones (they replay once cells are free)", registry=registry)
        self.abandoned_requests = Counter("skippy_driver_requests_abandoned", "requests whose client went away, by the"
                                          " phase they were in: queued (no lane yet), prefill, decode", ["phase"],
                                          registry=registry)
        for phase in ("queued", "prefill", "decode"):
            self.abandoned_requests.labels(phase)
        registry.register(LinkMetrics(link_guard))
        self.hops = Histogram("skippy_pipeline_hop_seconds", "send -> receive between consecutive stages", ["hop"],
                              registry=registry, buckets=SECONDS_BUCKETS)
        self._last_token: dict[int, float] = {}  # session -> wall time of its last delivered token
        self.telemetry.attach(registry)
        self.telemetry.span("stage.scheduler_start", self.telemetry.started_at, max_iterations_in_flight=max_iterations(),
                            max_active_sequences=lanes, n_batch=n_batch)

    def watch_pool(self, cells: int, used: Callable[[], int]) -> None:
        """The KV pool's size and the cells sessions and prefix cache entries hold (skippy.driver.cell_pool)."""
        Gauge("skippy_driver_kv_pool_cells", "KV cells every lane shares", registry=self.registry).set(cells)
        Gauge("skippy_driver_kv_pool_cells_used", "KV pool cells held by sessions (reserved) and prefix cache entries",
              registry=self.registry).set_function(used)

    def iteration(self, entry: InFlight, msg: Predictions, hops: list[float], in_flight: int) -> None:
        """A micro-batch's predictions are back (stage 0's compute, every stage's timings, the `hops` in ms;
        `in_flight`: the batches in flight when they came, this one included)."""
        rows = entry.rows
        sent = bytes_out(self.launcher.downstream, rows, self.n_embd)
        self.stage.observe(rows, entry.compute_ms, entry.credit_wait_ms, 0, sent)
        self.iterations.inc()
        prefill = sum(len(pw.tokens) for pw in entry.plan if pw.is_prefill)
        if prefill:
            self.prefill_tokens.inc(prefill)
        for t in msg.timings:
            self.stage_compute.labels(t.stage_id).inc(t.compute_ms / 1e3)
            if prefill:
                self.stage_prefill_compute.labels(t.stage_id).inc(t.compute_ms / 1e3)
            if t.credit_wait_ms > 0:
                self.stage_wait.labels(t.stage_id).inc(t.credit_wait_ms / 1e3)
        for a, b in zip(msg.timings, msg.timings[1:]):
            self.hops.labels(f"{a.stage_id}->{b.stage_id}").observe(max(0.0, b.recv_at - a.sent_at))
        self.log.debug("iteration_done", batch_id=msg.batch_id, rows=rows, sessions=len(entry.plan),
                       prefill_rows=prefill, hop_ms=[round(h, 3) for h in hops],
                       stage_compute_ms={t.stage_id: round(t.compute_ms, 3) for t in msg.timings},
                       timings=[[t.stage_id, round(t.recv_at, 6), round(t.compute_ms, 3), round(t.credit_wait_ms, 3),
                                 round(t.sent_at, 6)] for t in msg.timings])
        if not self.telemetry.debug_spans or not msg.timings:
            return
        first = msg.timings[0]
        self.telemetry.span("stage.binary_llama_decode", first.recv_at, first.recv_at + first.compute_ms / 1e3, debug=True,
                            batch_id=msg.batch_id, decode_batch_size=rows, stage0_compute_ms=first.compute_ms)
        stage_ms = {f"stage_compute_ms.{t.stage_id}": t.compute_ms for t in msg.timings}
        self.telemetry.span("stage.scheduler_iteration", first.recv_at, debug=True, batch_id=msg.batch_id, rows=rows,
                            sessions=len(entry.plan), prefill_rows=prefill, credit_wait_ms=entry.credit_wait_ms,
                            forward_write_ms=entry.write_ms(), in_flight=in_flight,
                            extra=stage_ms)

    def outcome(self, outcome: Outcome) -> None:
        """One request's share of a returned batch: its delivered tokens and speculative counts."""
        seq = outcome.seq
        delivered = sum(len(e.tokens) for e in outcome.events)
        if delivered:
            self.decode_tokens.inc(delivered)
        if outcome.proposed:
            self.proposed.inc(outcome.proposed)
            self.accepted.inc(min(outcome.proposed, max(0, outcome.returned - 1)))
        if not outcome.committed:
            return
        now = time.time()
        first = len(seq.generated) == len(outcome.committed)
        if first and seq.first_token_at is not None:
            self.telemetry.span("stage.openai_prefill", wall_time(seq.admitted_at or seq.submitted_at),
                                wall_time(seq.first_token_at), request_id=seq.request_id, session_id=seq.session_id,
                                prompt_tokens=len(seq.prompt),
                                queue_ms=((seq.admitted_at or seq.submitted_at) - seq.submitted_at) * 1e3)
        elif self.telemetry.debug_spans:
            before = len(seq.generated) - len(outcome.committed)
            phase = "cold" if before == 1 else "warmup" if before <= WARMUP_TOKENS else "steady"
            self.telemetry.span("stage.openai_decode_token", self._last_token.get(seq.session_id, now), now, debug=True,
                                request_id=seq.request_id, session_id=seq.session_id, tokens=len(outcome.committed),
                                generated_tokens=len(seq.generated), phase=phase)
        self._last_token[seq.session_id] = now

    def abandoned(self, seq: Sequence) -> None:
        """A request's client went away: counted by its phase, logged with how much of its prompt had run."""
        phase = "queued" if seq.state is SeqState.WAITING else "prefill" if seq.prefilling else "decode"
        self.abandoned_requests.labels(phase).inc()
        self.log.info("request_abandoned", request_id=seq.request_id, session_id=seq.session_id, phase=phase,
                      prompt_tokens=len(seq.prompt), prefilled_tokens=min(seq.prefilled, len(seq.prompt)),
                      cached_tokens=seq.prefix.matched, generated_tokens=len(seq.generated), in_flight=seq.in_flight)

    def finished(self, seq: Sequence, reason: FinishReason, error: str | None, speculative: dict[str, Any] | None) -> None:
        """A request ended: its totals as one summary span."""
        self._last_token.pop(seq.session_id, None)
        self.requests.labels(str(reason)).inc()
        if not self.telemetry.spans:
            return
        now = time.perf_counter()
        first = seq.first_token_at or now
        stages = {f"stage_compute_ms.{k}": round(d.get("compute_ms", 0.0), 3) for k, d in seq.stage_ms.items()}
        spec = {f"speculative.{k}": v for k, v in (speculative or {}).items() if isinstance(v, int | float | str)}
        self.telemetry.span("stage.openai_generation_summary", wall_time(seq.submitted_at), request_id=seq.request_id,
                            session_id=seq.session_id, finish_reason=str(reason), error=error, prompt_tokens=len(seq.prompt),
                            generated_tokens=len(seq.generated), ttft_ms=(first - seq.submitted_at) * 1e3,
                            decode_ms=(now - first) * 1e3, extra={**stages, **spec})
