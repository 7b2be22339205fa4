"""The driver at stage 0: admits requests, runs the iteration scheduler, keeps micro-batches in flight.

It owns stage 0's runtime (layers [0, a)), the link to stage 1 (credits, wire condition), and the
PULL where everything comes back: predictions straight from the final stage, credits, errors and
heartbeats. Python API: `submit(...)` returns a handle whose async iterator yields `TokenEvent`s
ending with a finish reason (stop, length, cancelled, error); `cancel(request_id)`. A finished or
cancelled request releases its session on every stage. A stage whose heartbeats stop fails the
requests in flight with an error naming it, and new requests are refused until it is back.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq.asyncio

from skippy.config import PrefillChunkOptions, ServingOptions
from skippy.driver.events import DriverUnavailable, RequestHandle, TokenEvent
from skippy.driver.prefill import ChunkObservation, ChunkPlanner
from skippy.driver.scheduler import PlannedWindow, Sequence, decode_rows_per_iteration, plan_iteration
from skippy.log import get_logger
from skippy.protocol import (
    Batch, ConfigureSession, Credit, ErrorReport, Heartbeat, Hello, Message, Predictions, ProtocolError, Ready,
    ReleaseSessions, SessionPrediction, SetWire, StageIdentity, StageTiming, TokenLogprob, Window, decode,
)
from skippy.runtime.errors import RuntimeUsageError
from skippy.runtime.sampling import SamplingParams
from skippy.runtime.stage_runtime import SessionWindow, StageRuntime
from skippy.stage.handshake import await_ready, connectable
from skippy.stage.predict import predict
from skippy.stage.links import DownstreamLink, ReplyCredits, apply_wire
from skippy.transport import PullQueue

DEAD_AFTER_S = 3.0  # no heartbeat for this long: the stage is dead


@dataclass
class InFlight:
    plan: list[PlannedWindow]
    compute_ms: float
    credit_wait_ms: float
    sent: asyncio.Future[float] | None = None


@dataclass
class DriverStats:
    iterations: int = 0
    max_rows: int = 0
    max_sessions: int = 0
    max_in_flight: int = 0
    hop_ms: deque[list[float]] = field(default_factory=lambda: deque(maxlen=4096))
    compute_ms: dict[str, float] = field(default_factory=dict)  # per stage, summed over batches


def micro_batches(options: ServingOptions) -> int:
    """Iterations kept in flight by default: one per host. Stages sharing a host share its cores, so
    overlapping their compute only shrinks batches (measured on 2 cores, Gemma 3, 8 streams over 2
    stages: 182 tok/s with one batch in flight vs 96 tok/s with two)."""
    if options.topology is None:
        return 1
    return len({stage.host or stage.stage_id for stage in options.topology.stages})


class Driver:
    def __init__(self, options: ServingOptions, runtime: StageRuntime, *, max_iterations_in_flight: int | None = None) -> None:
        cfg = options.config
        self.options = options
        self.runtime = runtime
        self.identity = StageIdentity(cfg.stage_id, 0, cfg.layer_start, cfg.layer_end, runtime.model_digest, runtime.n_embd)
        self.max_iterations = max_iterations_in_flight or micro_batches(options)
        self.prefill = options.openai.prefill if options.openai else PrefillChunkOptions()
        self.log = get_logger()
        self.ctx = zmq.asyncio.Context()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runtime-stage0")
        self.credits = ReplyCredits(options.max_inflight)
        self.stats = DriverStats()
        self.op_log: list[tuple[str, Any]] = []  # ("batch", windows) / ("release", ids) in stage order
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.by_request: dict[str, tuple[Sequence, RequestHandle]] = {}
        self.inflight: dict[int, InFlight] = {}
        self.pending_releases: list[int] = []
        self.dead: str | None = None
        self.last_seen: dict[str, float] = {}
        self._ids = itertools.count(1)
        self._batch_ids = itertools.count(1)
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self.inbound: PullQueue | None = None
        self.downstream: DownstreamLink | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self.inbound = PullQueue(self.ctx, self.options.bind_addr, decoder=lambda f: decode(f, n_embd=None))
        early: list[Message] = []
        downstream = self.options.config.downstream
        if downstream is not None:
            self.downstream = DownstreamLink(self.ctx, downstream.endpoint, self.options.wire)
            await self.downstream.send(Hello(self.identity, connectable(self.inbound.endpoint)))
            await await_ready(self.inbound, self.options, early)
            watched = [s.stage_id for s in self.options.topology.stages[1:]] if self.options.topology else [downstream.stage_id]
            self.last_seen = {stage: time.monotonic() for stage in watched}
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(c) for c in (self._recv_loop(early), self._schedule_loop(), self._monitor())]
        self.log.info("pipeline_ready", stages=len(self.last_seen) + 1, max_iterations_in_flight=self.max_iterations)

    async def close(self) -> None:
        for seq, _ in list(self.by_request.values()):
            self._finish(seq, "cancelled", "driver shutting down")
        await self._flush_releases()
        if self.downstream is not None:
            await asyncio.wait_for(self.downstream.drain(), 2.0)
        for task in self._tasks:
            task.cancel()
        for link in (self.downstream, self.inbound):
            if link is not None:
                link.close()
        self.executor.shutdown(wait=True)
        self.ctx.term()

    # -- API ---------------------------------------------------------------------------------
    def submit(self, prompt: list[int] | np.ndarray, sampling: SamplingParams | None = None, max_tokens: int = 16,
               stop_tokens: frozenset[int] = frozenset(), request_id: str | None = None) -> RequestHandle:
        if self.dead is not None:
            raise DriverUnavailable(f"pipeline unavailable: stage {self.dead} is down")
        tokens = np.asarray(prompt, np.int32)
        ctx_size = self.runtime.spec.ctx_size
        if len(tokens) == 0 or len(tokens) >= ctx_size:
            raise RuntimeUsageError(f"prompt of {len(tokens)} tokens must have 1..{ctx_size - 1} tokens (ctx_size {ctx_size})")
        if max_tokens < 1:
            raise RuntimeUsageError(f"max_tokens must be >= 1, got {max_tokens}")
        request_id = request_id or uuid.uuid4().hex
        if request_id in self.by_request:
            raise RuntimeUsageError(f"request id {request_id!r} is already in flight")
        seq = Sequence(request_id, next(self._ids), tokens, sampling or SamplingParams(), max_tokens, stop_tokens,
                       ChunkPlanner(self.prefill))
        handle = RequestHandle(request_id)
        self.by_request[request_id] = (seq, handle)
        self.waiting.append(seq)
        self._wakeup.set()
        return handle

    def cancel(self, request_id: str) -> None:
        entry = self.by_request.get(request_id)
        if entry is None:
            return
        seq = entry[0]
        seq.cancelled = True
        if seq in self.waiting:
            self.waiting.remove(seq)
            self._finish(seq, "cancelled", released=False)
        elif not seq.in_flight:
            self._finish(seq, "cancelled")
        self._wakeup.set()

    # -- scheduling ----------------------------------------------------------------------------
    async def _schedule_loop(self) -> None:
        while True:
            self._wakeup.clear()
            await self._flush_releases()
            while self.waiting and len(self.running) < self.runtime.spec.lane_count:
                await self._admit(self.waiting.popleft())
            if self.dead is None and len(self.inflight) < self.max_iterations:
                decoding = sum(1 for s in self.running if s.generated and not s.prefilling)
                plan = plan_iteration(self.running, self.runtime.params.n_batch,
                                      decode_rows_per_iteration(decoding, self.max_iterations))
                if plan:
                    await self._launch(plan)
                    continue
            await self._wakeup.wait()

    async def _admit(self, seq: Sequence) -> None:
        seq.admitted_at = time.perf_counter()
        self.running.append(seq)
        if self.runtime.is_final:
            await self._in_runtime(self.runtime.configure_session, seq.session_id, seq.sampling)
        else:
            assert self.downstream is not None
            self.downstream.enqueue(ConfigureSession(seq.session_id, seq.sampling.to_dict()))

    async def _flush_releases(self) -> None:
        if not self.pending_releases:
            return
        ids, self.pending_releases = tuple(self.pending_releases), []
        await self._in_runtime(lambda: [self.runtime.release_session(s) for s in ids])
        self.op_log.append(("release", ids))
        if self.downstream is not None:
            self.downstream.enqueue(ReleaseSessions(ids))

    async def _in_runtime(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _compute(self, windows: list[SessionWindow]) -> tuple[np.ndarray | None, tuple[SessionPrediction, ...]]:
        result = self.runtime.decode(windows)
        if not self.runtime.is_final:
            return result.hidden, ()
        return None, predict(self.runtime, windows, result)

    async def _launch(self, plan: list[PlannedWindow]) -> None:
        batch_id = next(self._batch_ids)
        for pw in plan:
            pw.seq.in_flight = True
            if pw.is_prefill:
                pw.seq.prefilled = pw.pos_start + len(pw.tokens)
        windows = [SessionWindow(pw.seq.session_id, pw.pos_start, len(pw.tokens), pw.outputs, pw.tokens) for pw in plan]
        token_ids = [tuple(w.tokens.tolist()) for w in windows]
        self.op_log.append(("batch", [(w.session_id, w.pos_start, t, w.outputs) for w, t in zip(windows, token_ids)]))
        started_at, start = time.time(), time.perf_counter()
        try:
            hidden, predictions = await self._in_runtime(self._compute, windows)
        except (RuntimeUsageError, RuntimeError) as exc:
            for pw in plan:
                pw.seq.in_flight = False
                self._finish(pw.seq, "error", f"stage {self.identity.stage_id}: {exc}")
            return
        compute_ms = (time.perf_counter() - start) * 1e3
        self._count(plan)
        if self.downstream is None:
            self.inflight[batch_id] = InFlight(plan, compute_ms, 0.0)
            timing = StageTiming(self.identity.stage_id, started_at, compute_ms, 0.0, 0.0, time.time())
            self._on_predictions(Predictions(batch_id, predictions, (timing,)))
            return
        wait_ms = await self.credits.acquire()
        timing = StageTiming(self.identity.stage_id, started_at, compute_ms, 0.0, wait_ms, time.time())
        wire = tuple(Window(w.session_id, w.pos_start, w.n_tokens, w.outputs, t) for w, t in zip(windows, token_ids))
        entry = self.inflight[batch_id] = InFlight(plan, compute_ms, wait_ms)
        entry.sent = self.downstream.enqueue(Batch(batch_id, wire, hidden, (timing,)))
        self.stats.max_in_flight = max(self.stats.max_in_flight, len(self.inflight))

    def _count(self, plan: list[PlannedWindow]) -> None:
        self.stats.iterations += 1
        self.stats.max_rows = max(self.stats.max_rows, sum(len(pw.tokens) for pw in plan))
        self.stats.max_sessions = max(self.stats.max_sessions, len(plan))

    # -- results -----------------------------------------------------------------------------
    def _on_predictions(self, msg: Predictions) -> None:
        entry = self.inflight.pop(msg.batch_id, None)
        if entry is None:
            self.log.warning("unknown_batch", batch_id=msg.batch_id)
            return
        tokens = {r.session_id: r.tokens for r in msg.results}
        logprobs = {r.session_id: r.logprobs for r in msg.results}
        hops = [b.recv_at - a.sent_at for a, b in zip(msg.timings, msg.timings[1:])]
        self.stats.hop_ms.append([h * 1e3 for h in hops])
        for t in msg.timings:
            self.stats.compute_ms[t.stage_id] = self.stats.compute_ms.get(t.stage_id, 0.0) + t.compute_ms
        slowest = max((t.compute_ms / max(1, sum(len(pw.tokens) for pw in entry.plan)) for t in msg.timings), default=None)
        write_ms = entry.sent.result() if entry.sent is not None and entry.sent.done() and not entry.sent.exception() else 0.0
        for pw in entry.plan:
            seq = pw.seq
            seq.in_flight = False
            for t in msg.timings:
                acc = seq.stage_ms.setdefault(t.stage_id, {"compute_ms": 0.0, "send_ms": 0.0, "credit_wait_ms": 0.0})
                acc["compute_ms"] += t.compute_ms
                acc["send_ms"] += t.send_ms
                acc["credit_wait_ms"] += t.credit_wait_ms
            if pw.is_prefill:
                seq.planner.observe(ChunkObservation(entry.compute_ms, write_ms, entry.credit_wait_ms, slowest))
            if seq.cancelled:
                self._finish(seq, "cancelled")
            elif pw.outputs:
                got = tokens.get(seq.session_id)
                if not got:
                    self._finish(seq, "error", f"final stage returned no prediction for session {seq.session_id}")
                else:
                    lp = logprobs.get(seq.session_id) or (None,)
                    self._emit(seq, got[0], lp[0])
        self.log.debug("iteration_done", batch_id=msg.batch_id, rows=sum(len(pw.tokens) for pw in entry.plan),
                       sessions=len(entry.plan), hop_ms=[round(h * 1e3, 3) for h in hops],
                       stage_compute_ms={t.stage_id: round(t.compute_ms, 3) for t in msg.timings})
        self._wakeup.set()

    def _emit(self, seq: Sequence, token: int, logprob: TokenLogprob | None = None) -> None:
        now = time.perf_counter()
        if seq.first_token_at is None:
            seq.first_token_at = now
        seq.generated.append(token)
        handle = self.by_request[seq.request_id][1]
        if token in seq.stop_tokens:
            self._finish(seq, "stop")
            return
        handle.put(TokenEvent(token=token, logprob=logprob))
        full = len(seq.prompt) + len(seq.generated) >= self.runtime.spec.ctx_size
        if len(seq.generated) >= seq.max_tokens or full:
            self._finish(seq, "length")

    def _finish(self, seq: Sequence, reason: str, error: str | None = None, *, released: bool = True) -> None:
        entry = self.by_request.pop(seq.request_id, None)
        if entry is None:
            return
        if seq in self.running:
            self.running.remove(seq)
        if released:
            self.pending_releases.append(seq.session_id)
        entry[1].put(TokenEvent(finish_reason=reason, error=error))
        now = time.perf_counter()
        first = seq.first_token_at or now
        self.log.info(
            "request_done", request_id=seq.request_id, session_id=seq.session_id, finish_reason=reason, error=error,
            prompt_tokens=len(seq.prompt), generated_tokens=len(seq.generated),
            ttft_ms=round((first - seq.submitted_at) * 1e3, 3),
            prefill_ms=round((first - (seq.admitted_at or seq.submitted_at)) * 1e3, 3),
            decode_ms=round((now - first) * 1e3, 3),
            stages={k: {m: round(v, 3) for m, v in d.items()} for k, d in seq.stage_ms.items()},
        )
        self._wakeup.set()

    def _fail_all(self, error: str) -> None:
        for seq, _ in list(self.by_request.values()):
            self._finish(seq, "error", error, released=seq not in self.waiting)
        self.waiting.clear()
        self.inflight.clear()

    # -- inbound -----------------------------------------------------------------------------
    async def _recv_loop(self, early: list[Message]) -> None:
        assert self.inbound is not None
        for msg in early:
            await self._dispatch(msg)
        while True:
            await self._dispatch(await self.inbound.recv())

    async def _dispatch(self, msg: Message | ProtocolError) -> None:
        if isinstance(msg, Predictions):
            self._on_predictions(msg)
        elif isinstance(msg, Credit):
            await self.credits.release()
        elif isinstance(msg, SetWire):
            apply_wire(self.downstream, msg, self.log)
        elif isinstance(msg, Heartbeat):
            if msg.stage_id == self.dead:
                await self._revive(msg.stage_id)
            self.last_seen[msg.stage_id] = time.monotonic()
        elif isinstance(msg, ErrorReport):
            await self._on_error(msg)
        elif isinstance(msg, ProtocolError):
            self.log.warning("bad_message", code=msg.code, error=msg.message)
        elif isinstance(msg, Ready):
            self.log.info("downstream_ready", downstream=msg.sender.stage_id)
        else:
            self.log.warning("unexpected_message", kind=type(msg).__name__)

    async def _on_error(self, msg: ErrorReport) -> None:
        self.log.error("stage_error", from_stage=msg.stage_id, code=msg.code, error=msg.message, batch_id=msg.batch_id)
        error = f"stage {msg.stage_id}: {msg.message}"
        if msg.code == "stage_stopped":
            self._mark_dead(msg.stage_id, error)
            return
        entry = self.inflight.pop(msg.batch_id, None) if msg.batch_id is not None else None
        seqs = [pw.seq for pw in entry.plan] if entry else []
        seqs += [s for s, _ in self.by_request.values() if s.session_id in msg.session_ids]
        for seq in seqs:
            seq.in_flight = False
            self._finish(seq, "error", error)

    def _mark_dead(self, stage_id: str, error: str) -> None:
        if self.dead is None:
            self.dead = stage_id
            self.log.error("stage_dead", dead_stage=stage_id, error=error)
        self._fail_all(error)

    async def _revive(self, stage_id: str) -> None:
        assert self.downstream is not None and self.inbound is not None
        await self.credits.reset()
        self.dead = None
        await self.downstream.send(Hello(self.identity, connectable(self.inbound.endpoint)))
        self.log.info("stage_back", stage=stage_id)

    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(DEAD_AFTER_S / 6)
            now = time.monotonic()
            for stage, seen in self.last_seen.items():
                if now - seen > DEAD_AFTER_S and self.dead is None:
                    self._mark_dead(stage, f"stage {stage} stopped responding (no heartbeat for {DEAD_AFTER_S:g} s)")
