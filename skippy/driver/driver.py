"""The driver at stage 0: admits requests, schedules iterations, keeps micro-batches in flight.

One step of the loop is nano-vllm's: `plan_iteration` (which rows go next) -> `BatchLauncher.launch`
(stage 0's layers, then the wire) -> later, when the final stage's predictions arrive,
`postprocess` (committed tokens, finishes) and delivery. Requests live in a `SequenceTable`;
downstream liveness is `Liveness`. Python API: `submit(...)` returns a handle whose async iterator
yields `TokenEvent`s ending with a finish reason; `cancel(request_id)`. A finished request's session
is released on every stage. A silent stage fails the requests in flight with an error naming it,
and new requests are refused until it is back. Every loop runs under a `Supervisor`: if one
raises, the live requests fail with the cause and the owning process exits nonzero.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid

import numpy as np
import zmq.asyncio

from skippy.config import ServingOptions
from skippy.driver.batches import BatchLauncher, DriverStats, OpRecorder
from skippy.driver.events import DriverUnavailable, RequestHandle, TokenEvent
from skippy.driver.liveness import DEAD_AFTER_S, Liveness
from skippy.driver.postprocess import Outcome, postprocess
from skippy.driver.prefill import ChunkPlanner
from skippy.driver.scheduler import decode_rows_per_iteration, plan_iteration
from skippy.driver.sequence import Sequence, SequenceTable
from skippy.faults import fault_point
from skippy.log import get_logger
from skippy.protocol import (
    ConfigureSession, ErrorCode, ErrorReport, FinishReason, Heartbeat, Hello, Message, Predictions, ProtocolError,
    Ready, ReleaseSessions, StageIdentity, decode,
)
from skippy.runtime.errors import RuntimeUsageError
from skippy.runtime.sampling import SamplingParams
from skippy.runtime.stage_runtime import StageRuntime
from skippy.stage.handshake import connectable, open_downstream
from skippy.stage.links import DownstreamLink, handle_link_control
from skippy.stage.worker import RuntimeWorker
from skippy.supervise import Supervisor
from skippy.transport import PullQueue


def micro_batches(options: ServingOptions) -> int:
    """Iterations kept in flight by default: one per host. Stages sharing a host share its cores, so
    overlapping their compute only shrinks batches (measured on 2 cores, Gemma 3, 8 streams over 2
    stages: 182 tok/s with one batch in flight vs 96 tok/s with two)."""
    if options.topology is None:
        return 1
    return len({stage.host or stage.stage_id for stage in options.topology.stages})


class Driver:
    def __init__(self, options: ServingOptions, runtime: StageRuntime, *, max_iterations_in_flight: int | None = None,
                 supervisor: Supervisor | None = None, dead_after_s: float = DEAD_AFTER_S) -> None:
        cfg = options.config
        self.options = options
        self.runtime = runtime
        self.identity = StageIdentity(cfg.stage_id, 0, cfg.layer_start, cfg.layer_end, runtime.model_digest, runtime.n_embd)
        self.max_iterations = max_iterations_in_flight or micro_batches(options)
        self.prefill = options.prefill
        self.dead_after_s = dead_after_s
        self.log = get_logger()
        self.supervisor = supervisor or Supervisor(self.log, asyncio.Event())
        self.supervisor.on_failure(self._on_process_failure)
        self.ctx = zmq.asyncio.Context()
        self.worker = RuntimeWorker(runtime, "runtime-stage0")
        self.table = SequenceTable()
        self.launcher = BatchLauncher(self.worker, None, cfg.stage_id)
        self.liveness = Liveness(())
        self.failed: str | None = None  # set when this process failed: no new requests
        self._ids = itertools.count(1)
        self._wakeup = asyncio.Event()
        self.inbound: PullQueue | None = None
        self.downstream: DownstreamLink | None = None

    @property
    def stats(self) -> DriverStats:
        return self.launcher.stats

    @property
    def recorder(self) -> OpRecorder | None:
        return self.launcher.recorder

    @recorder.setter
    def recorder(self, recorder: OpRecorder | None) -> None:
        self.launcher.recorder = recorder

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self.inbound = PullQueue(self.ctx, self.options.bind_addr, decoder=lambda f: decode(f, n_embd=None))
        early: list[Message] = []
        if self.options.config.downstream is not None:
            self.downstream, early = await open_downstream(self.ctx, self.options, self.identity, self.inbound,
                                                           self.supervisor.fail)
            self.launcher.downstream = self.downstream
            topology = self.options.topology
            watched = [s.stage_id for s in topology.stages[1:]] if topology else [self.options.config.downstream.stage_id]
            self.liveness = Liveness(watched, self.dead_after_s)
        self.supervisor.spawn("receive loop", self._recv_loop(early))
        self.supervisor.spawn("schedule loop", self._schedule_loop())
        self.supervisor.spawn("liveness monitor", self._monitor())
        self.log.info("pipeline_ready", stages=len(self.liveness.last_seen) + 1, max_iterations_in_flight=self.max_iterations)

    async def close(self) -> None:
        """Cancel what is live, release sessions downstream, and close sockets, thread and context,
        whichever of these steps fails."""
        try:
            for seq in self.table.live():
                self._finish(seq, FinishReason.CANCELLED, "driver shutting down")
            await self._flush_releases()
            if self.downstream is not None:
                await self.downstream.drain()
        finally:
            await self.supervisor.close()
            for link in (self.downstream, self.inbound):
                if link is not None:
                    link.close()
            self.worker.close()
            self.ctx.term()

    # -- API ---------------------------------------------------------------------------------
    def submit(self, prompt: list[int] | np.ndarray, sampling: SamplingParams | None = None, max_tokens: int = 16,
               stop_tokens: frozenset[int] = frozenset(), request_id: str | None = None) -> RequestHandle:
        if self.failed is not None:
            raise DriverUnavailable(f"pipeline unavailable: stage {self.identity.stage_id} failed: {self.failed}")
        if self.liveness.dead is not None:
            raise DriverUnavailable(f"pipeline unavailable: stage {self.liveness.dead} is down")
        tokens = np.asarray(prompt, np.int32)
        ctx_size = self.runtime.spec.ctx_size
        if len(tokens) == 0 or len(tokens) >= ctx_size:
            raise RuntimeUsageError(f"prompt of {len(tokens)} tokens must have 1..{ctx_size - 1} tokens (ctx_size {ctx_size})")
        if max_tokens < 1:
            raise RuntimeUsageError(f"max_tokens must be >= 1, got {max_tokens}")
        request_id = request_id or uuid.uuid4().hex
        if self.table.get(request_id) is not None:
            raise RuntimeUsageError(f"request id {request_id!r} is already in flight")
        handle = RequestHandle(request_id)
        self.table.add(Sequence(request_id, next(self._ids), tokens, sampling or SamplingParams(), max_tokens,
                                stop_tokens, ChunkPlanner(self.prefill), handle))
        self._wakeup.set()
        return handle

    def cancel(self, request_id: str) -> None:
        seq = self.table.get(request_id)
        if seq is None:
            return
        seq.cancelled = True
        if not seq.in_flight:  # else it finishes when its batch comes back
            self._finish(seq, FinishReason.CANCELLED)
        self._wakeup.set()

    # -- the step: schedule -> launch; predictions -> postprocess -> deliver -------------------
    async def _schedule_loop(self) -> None:
        while True:
            self._wakeup.clear()
            await self._flush_releases()
            for seq in self.table.admit(self.runtime.spec.lane_count):
                await self._configure(seq)
            if self.liveness.dead is None and len(self.launcher.inflight) < self.max_iterations:
                decoding = sum(1 for s in self.table.running if s.generated and not s.prefilling)
                plan = plan_iteration(self.table.running, self.runtime.params.n_batch,
                                      decode_rows_per_iteration(decoding, self.max_iterations))
                if plan:
                    fault_point("driver.launch")
                    try:
                        done = await self.launcher.launch(plan)
                    except (RuntimeUsageError, RuntimeError) as exc:
                        for pw in plan:
                            pw.seq.in_flight = False
                            self._finish(pw.seq, FinishReason.ERROR, f"stage {self.identity.stage_id}: {exc}")
                        continue
                    if done is not None:
                        self._on_predictions(done)
                    continue
            await self._wakeup.wait()

    async def _configure(self, seq: Sequence) -> None:
        if self.runtime.is_final:
            await self.worker.call(self.runtime.configure_session, seq.session_id, seq.sampling)
        else:
            assert self.downstream is not None
            self.downstream.enqueue(ConfigureSession(seq.session_id, seq.sampling.to_dict()))

    async def _flush_releases(self) -> None:
        ids = self.table.take_releases()
        if not ids:
            return
        await self.worker.call(self.worker.release, ids)
        self.launcher.record_release(ids)
        if self.downstream is not None:
            self.downstream.enqueue(ReleaseSessions(ids))

    def _on_predictions(self, msg: Predictions) -> None:
        entry = self.launcher.complete(msg.batch_id)
        if entry is None:
            self.log.warning("unknown_batch", batch_id=msg.batch_id)
            return
        self.launcher.stats.observe(msg)
        for outcome in postprocess(entry, msg, self.runtime.spec.ctx_size):
            self._deliver(outcome)
        self.log.debug("iteration_done", batch_id=msg.batch_id, rows=entry.rows, sessions=len(entry.plan),
                       hop_ms=[round(h, 3) for h in self.launcher.stats.hop_ms[-1]],
                       stage_compute_ms={t.stage_id: round(t.compute_ms, 3) for t in msg.timings})
        self._wakeup.set()

    def _deliver(self, outcome: Outcome) -> None:
        for event in outcome.events:
            outcome.seq.handle.put(event)
        if outcome.finish is not None:
            self._finish(outcome.seq, outcome.finish, outcome.error)

    def _finish(self, seq: Sequence, reason: FinishReason, error: str | None = None,
                code: ErrorCode | None = None) -> None:
        if self.table.finish(seq, reason, error, code):
            self.log.info("request_done", **seq.summary(reason, error))
            self._wakeup.set()

    def _fail_live(self, error: str, code: ErrorCode | None = None) -> None:
        for seq in self.table.live():
            seq.in_flight = False
            self._finish(seq, FinishReason.ERROR, error, code)
        self.launcher.inflight.clear()

    def _on_process_failure(self, cause: str) -> None:
        self.failed = cause
        self._fail_live(f"stage {self.identity.stage_id} failed: {cause}", ErrorCode.PIPELINE_FAILED)

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
        elif isinstance(msg, Heartbeat):
            if self.liveness.heard(msg.stage_id):
                await self._revive(msg.stage_id)
        elif isinstance(msg, ErrorReport):
            self._on_error(msg)
        elif isinstance(msg, ProtocolError):
            self.log.warning("bad_message", code=msg.code, error=msg.message)
        elif isinstance(msg, Ready):
            self.log.info("downstream_ready", downstream=msg.sender.stage_id)
        elif not await handle_link_control(msg, self.downstream, self.log):
            self.log.warning("unexpected_message", kind=type(msg).__name__)

    def _on_error(self, msg: ErrorReport) -> None:
        self.log.error("stage_error", from_stage=msg.stage_id, code=msg.code, error=msg.message, batch_id=msg.batch_id)
        error = f"stage {msg.stage_id}: {msg.message}"
        if msg.code is ErrorCode.STAGE_STOPPED:
            self._mark_dead(msg.stage_id, error)
            return
        entry = self.launcher.complete(msg.batch_id) if msg.batch_id is not None else None
        seqs = [pw.seq for pw in entry.plan] if entry else []
        seqs += [s for s in self.table.live() if s.session_id in msg.session_ids]
        for seq in seqs:
            seq.in_flight = False
            self._finish(seq, FinishReason.ERROR, error)

    def _mark_dead(self, stage_id: str, error: str) -> None:
        if self.liveness.mark_dead(stage_id):
            self.log.error("stage_dead", dead_stage=stage_id, error=error)
        self._fail_live(error, ErrorCode.PIPELINE_FAILED)

    async def _revive(self, stage_id: str) -> None:
        assert self.downstream is not None and self.inbound is not None
        await self.downstream.credits.reset()
        await self.downstream.send(Hello(self.identity, connectable(self.inbound.endpoint)))
        self.log.info("stage_back", stage=stage_id)

    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(self.liveness.dead_after_s / 6)
            stage = self.liveness.silent()
            if stage is not None:
                self._mark_dead(stage, f"stage {stage} stopped responding (no heartbeat for {self.liveness.dead_after_s:g} s)")

