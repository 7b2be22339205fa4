"""The driver at stage 0: admits requests, schedules iterations, keeps micro-batches in flight.

One step of the loop is nano-vllm's: `plan_iteration` (which rows go next) -> `BatchLauncher.launch`
(stage 0's layers, then the wire) -> later, when the final stage's predictions arrive,
`postprocess` (committed tokens, finishes) and delivery (`Delivery`, which also ends requests). Requests live
in a `SequenceTable`; finished sessions are released on every stage by `SessionReleases`; downstream liveness
is `Liveness`; stage 0's PULL is read by `Inbound`, built from those parts, which calls back the driver
(`DriverCallbacks`); metrics and spans are `DriverTelemetry`'s, built from its parts. Python API:
`submit(...)` returns a handle whose async iterator yields `TokenEvents`, one per step, ending with a final one;
`cancel(request_id)`. When a later stage dies the requests in flight pause and replay once it is back
(`Replays`, skippy.driver.replay); new requests wait at stage 0 meanwhile (nobody is admitted), within the
same deadline. A request is admitted once a lane and the KV cells it needs are free (`CellPool`, which preempts
the youngest sessions when decoding ones outgrow the pool). `submit` checks a request with
skippy.driver.submission: at most `max_waiting` requests wait for a lane (default: `default_max_waiting`, the
admission queue's capacity, at least lane_count so that one broker's requests always fit); past it `submit`
raises `QueueFull` (ErrorCode.QUEUE_FULL, HTTP 429), counted in `skippy_driver_waiting_refused_total`. Every
loop runs under a `Supervisor`: if one raises, the live requests fail with the cause and the owning process
exits nonzero.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid

import numpy as np
import zmq.asyncio

from skippy.config import ServingOptions
from skippy.config.cpu_sets import stage_groups
from skippy.driver.batches import BatchLauncher, DriverStats, OpRecorder
from skippy.driver.cell_pool import CellPool
from skippy.driver.delivery import Delivery
from skippy.driver.inbound import Inbound
from skippy.driver.liveness import DEAD_AFTER_S, Liveness
from skippy.driver.prefill import ChunkPlanner, unpipelined
from skippy.driver.prefix_index import PrefixIndex
from skippy.driver.releases import SessionReleases
from skippy.driver.replay import Replays
from skippy.driver.scheduler import Drafter, decode_rows_per_iteration, plan_iteration, prefill_chunks
from skippy.driver.sequence import Sequence, SequenceTable
from skippy.driver.speculative.engine import Speculation
from skippy.driver.submission import WaitingRoom, check_submission, default_max_waiting
from skippy.driver.telemetry import DriverTelemetry
from skippy.driver.verify_costs import calibrate_speculation
from skippy.driver.wire_certify import calibration_prompt, certify_wire, set_chain_wire, verdict_fields
from skippy.faults import fault_point
from skippy.log import get_logger
from skippy.protocol import (
    CacheCaps,
    ConfigureSession,
    ErrorCode,
    FinishReason,
    Message,
    Predictions,
    ResumePoint,
    StageIdentity,
    Status,
    WireVerdict,
    decode,
)
from skippy.request_events import PipelineUnavailable, RequestHandle
from skippy.runtime.errors import RuntimeUsageError
from skippy.runtime.sampling import SamplingParams
from skippy.runtime.stage_runtime import StageRuntime
from skippy.stage.handshake import open_downstream
from skippy.stage.links import DownstreamLink
from skippy.stage.worker import RuntimeWorker
from skippy.supervise import Supervisor
from skippy.transport.curve_guard import guard_of
from skippy.transport.queues import PullQueue


class Driver:
    def __init__(self, options: ServingOptions, runtime: StageRuntime, *, max_iterations_in_flight: int | None = None,
                 supervisor: Supervisor | None = None, dead_after_s: float = DEAD_AFTER_S,
                 speculation: Speculation | None = None, max_waiting: int | None = None) -> None:
        cfg = options.config
        self.options = options
        self.runtime = runtime
        self.identity = StageIdentity(cfg.stage_id, 0, cfg.layer_start, cfg.layer_end, runtime.model_digest, runtime.n_embd)
        # micro-batches in flight: one per group of stages computing without sharing a core (a host, or
        # disjoint --stage-cpus). Sharing cores, overlap only shrinks batches (measured: docs/measurements.md,
        # 'Micro-batches on shared cores').
        self.max_iterations = max_iterations_in_flight or stage_groups(options.topology, options.stage_cpus)
        # one micro-batch in flight: a prompt's chunks cannot overlap on the stages (skippy.driver.prefill)
        self.prefill = unpipelined(options.prefill) if self.max_iterations == 1 else options.prefill
        self.dead_after_s = dead_after_s
        self.log = get_logger()
        self.supervisor = supervisor or Supervisor(self.log, asyncio.Event())
        self.supervisor.on_failure(self._on_process_failure)
        self.ctx = zmq.asyncio.Context()
        self.worker = RuntimeWorker(runtime, "runtime-stage0")
        self.table = SequenceTable()
        self.launcher = BatchLauncher(self.worker, None, cfg.stage_id)
        self.prefix = PrefixIndex.for_stage0(options, runtime)
        self.liveness = Liveness(())
        self.speculation = speculation
        self.launcher.mtp_draft_max = speculation.mtp_draft_max if speculation is not None else 0
        self.failed: str | None = None  # set when this process failed: no new requests
        self.wire_verdict: WireVerdict | None = None  # the activation wire's startup certification (start)
        self._ids = itertools.count(1)
        self._wakeup = asyncio.Event()
        self.inbound: PullQueue | None = None
        self.downstream: DownstreamLink | None = None
        self.inbound_handler: Inbound | None = None  # reads stage 0's PULL (start)
        self.telemetry = DriverTelemetry(self.identity, self.table, self.launcher, lambda: self.max_iterations,
                                         lanes=runtime.spec.lane_count, n_batch=runtime.params.n_batch,
                                         link_guard=lambda: guard_of(self.ctx))
        self.waiting_room = WaitingRoom(max_waiting or default_max_waiting(options, runtime.spec.lane_count), self.log,
                                        self.telemetry.waiting_refused.inc)
        self.delivery = Delivery(self.table, self.launcher, self.prefix, speculation, self.telemetry, self.log,
                                 runtime.spec.ctx_size, self._wakeup.set)
        self.cells = CellPool(runtime.spec.kv_pool_cells, runtime.spec.ctx_size, shared=runtime.lanes is None,
                              table=self.table, prefix=self.prefix, log=self.log, on_preempt=self.telemetry.preemptions.inc)
        self.telemetry.watch_pool(self.cells.cells, self.cells.used)
        self.releases = SessionReleases(self.worker, self.table, self.prefix, self.launcher, speculation,
                                        self.cells.forget)
        self.replays = Replays(self.table, self.launcher, self.telemetry, self.log, self.delivery.finish, self._enqueue,
                               options.resume_timeout_s)

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
            self.launcher.downstream = self.releases.downstream = self.downstream
            self.prefix.set_downstream(self.downstream.ready.cache if self.downstream.ready is not None else None)
            topology = self.options.topology
            watched = [s.stage_id for s in topology.stages[1:]] if topology else [self.options.config.downstream.stage_id]
            self.liveness = Liveness(watched, self.dead_after_s)
        self.inbound_handler = Inbound(self, self.identity, self.log, liveness=self.liveness, replays=self.replays,
                                       downstream=self.downstream)
        self.supervisor.spawn("receive loop", self.inbound_handler.run(self.inbound, early))
        self.wire_verdict = await certify_wire(self.launcher, self.options, calibration_prompt(
            self.runtime.model, self.runtime.spec.ctx_size), self.releases.now)
        if self.speculation is not None and self.speculation.calibrate:
            await calibrate_speculation(self.speculation, self.launcher, self.options, self.runtime.n_vocab, self.releases.now,
                                        lanes=self.runtime.spec.lane_count, micro_batches=self.max_iterations,
                                        n_batch=self.runtime.params.n_batch)
        self.supervisor.spawn("schedule loop", self._schedule_loop())
        self.supervisor.spawn("liveness monitor", self.inbound_handler.monitor())
        self.log.info("pipeline_ready", stages=len(self.liveness.last_seen) + 1, max_iterations_in_flight=self.max_iterations,
                      wire=verdict_fields(self.wire_verdict))

    def use_speculation(self, speculation: Speculation | None) -> None:
        """Draft with `speculation` from now on (between requests: a benchmark's modes); delivery and releases too."""
        self.speculation = self.delivery.speculation = self.releases.speculation = speculation
        self.launcher.mtp_draft_max = speculation.mtp_draft_max if speculation is not None else 0

    async def close(self) -> None:
        """Cancel what is live, release sessions downstream, and close sockets, thread and context,
        whichever of these steps fails."""
        try:
            for seq in self.table.live():
                self.delivery.finish(seq, FinishReason.CANCELLED, "driver shutting down")
            await self.releases.flush()
            if self.downstream is not None:
                await self.downstream.drain()
        finally:
            await self.supervisor.close()
            for link in (self.downstream, self.inbound):
                if link is not None:
                    link.close()
            self.worker.close()
            if self.speculation is not None:
                self.speculation.close()
            self.ctx.term()

    # -- API ---------------------------------------------------------------------------------
    def submit(self, prompt: list[int] | np.ndarray, sampling: SamplingParams | None = None, max_tokens: int = 16,
               stop_tokens: frozenset[int] = frozenset(), request_id: str | None = None,
               resume_from: ResumePoint | None = None, progress: bool = False) -> RequestHandle:
        """A new request; `resume_from`: where a lost one resumes (skippy.protocol.Submit.resume_from):
        it is prefilled again as a replay is and continues from the next token. `progress`: the handle also gets
        PromptProgress events as prefill chunks come back."""
        if self.failed is not None:
            raise PipelineUnavailable(f"pipeline unavailable: stage {self.identity.stage_id} failed: {self.failed}")
        tokens = np.asarray(prompt, np.int32)
        request_id = request_id or uuid.uuid4().hex
        check_submission(self.table, self.runtime.spec.ctx_size, len(tokens), max_tokens, resume_from, request_id)
        self.waiting_room.enter(len(self.table.waiting), request_id)
        handle = RequestHandle(request_id)
        seq = Sequence(request_id, next(self._ids), tokens, sampling or SamplingParams(), max_tokens, stop_tokens,
                       ChunkPlanner(self.prefill), handle, progress=progress)
        if resume_from is not None:
            self.replays.replay_submitted(seq, resume_from)
        self.table.add(seq)
        self._wakeup.set()
        return handle

    def status(self, nonce: int = 0) -> Status:
        """Stage 0's answer to a StatusQuery: whether it serves (else the stage that is down), its load."""
        dead = self.liveness.dead or (self.identity.stage_id if self.failed else None)
        return Status(nonce, dead is None, dead, len(self.table.running), len(self.table.waiting),
                      self.runtime.spec.lane_count, self.runtime.spec.ctx_size, self.wire_verdict)

    def cancel(self, request_id: str, abandoned: bool = False) -> None:
        """End a request (once its windows in flight are back); `abandoned`: its client went away (counted)."""
        seq = self.table.get(request_id)
        if seq is None:
            return
        if abandoned and not seq.cancelled:
            self.telemetry.abandoned(seq)
        seq.cancelled = True
        if not seq.in_flight:  # else it finishes when its batch comes back
            self.delivery.finish(seq, FinishReason.CANCELLED)
        self._wakeup.set()

    # -- the step: schedule -> launch; predictions -> postprocess -> deliver -------------------
    async def _schedule_loop(self) -> None:
        while True:
            self._wakeup.clear()
            await self.releases.flush()
            # while a later stage is down nobody is admitted (a configuration would be lost with it)
            lanes = self.runtime.spec.lane_count if self.liveness.dead is None else 0
            for seq in self.table.admit(lanes, self.cells.admits):  # FIFO, when its KV cells are free
                self.cells.admitted(seq)  # its prefix looked up (a preempted one replays as it ran)
                await self._configure(seq)
            room = len(self.launcher.inflight) < self.max_iterations  # micro-batches: one per host
            streaming = any(s.prefilling and s.in_flight and not s.cancelled for s in self.table.running)
            if self.liveness.dead is None and (room or streaming):  # a prompt's chunks follow each other
                self.cells.make_room()  # a cell for every session's next token: entries evicted, sessions preempted
                await self.releases.flush()  # those reach every stage before the windows that use their cells
                decoding = sum(1 for s in self.table.running if s.generated and not s.prefilling)
                max_decode = decode_rows_per_iteration(decoding, self.max_iterations)
                chainer = self.speculation.chained if self.speculation is not None else None
                plan = plan_iteration(self.table.running, self.runtime.params.n_batch, max_decode,
                                      await self._drafter(max_decode, decoding) if room else None, chainer,
                                      only_pipelined_prefill=not room, cells=self.cells)
                if plan:
                    fault_point("driver.launch")
                    try:
                        done = await self.launcher.launch(plan, self.prefix.window_ops(plan))
                    except (RuntimeUsageError, RuntimeError) as exc:
                        self.delivery.fail([pw.seq for pw in plan], f"stage {self.identity.stage_id}: {exc}")
                        continue
                    if done is not None:
                        self.on_predictions(done)
                    continue
            await self._wakeup.wait()

    async def _drafter(self, max_decode: int, decoding: int) -> Drafter | None:
        if self.speculation is None:
            return None
        ready = [s for s in self.table.running
                 if not (s.in_flight or s.cancelled or s.prefilling or not s.generated)][:max_decode]
        room = {s.session_id: s.max_tokens - len(s.generated) - 1 for s in ready}  # drafts the request can still commit
        # prompt rows that will ride in the same batch: drafts are priced on top of them, not of the decode rows alone
        riders = sum(n for _, n in prefill_chunks(self.table.running, max(self.runtime.params.n_batch - len(ready), 0))) \
            if ready else 0
        return await self.speculation.drafter([s.session_id for s in ready], self.runtime.params.n_batch, decoding,
                                              self.worker.call, room, riders)

    async def _configure(self, seq: Sequence) -> None:
        if self.speculation is not None:
            self.speculation.start(seq.session_id, seq.prompt.tolist())
        history = tuple(seq.generated)  # a resume point's (empty for a new request)
        if self.runtime.is_final:
            await self.worker.call(self.runtime.configure_session, seq.session_id, seq.sampling, history, seq.draws)
        else:
            assert self.downstream is not None
            self._enqueue(ConfigureSession(seq.session_id, seq.sampling.to_dict(), history, seq.draws))

    def _enqueue(self, msg: ConfigureSession) -> None:
        assert self.downstream is not None
        self.downstream.enqueue(msg)

    # -- Inbound's callbacks (skippy.driver.inbound.DriverCallbacks) ---------------------------
    def on_predictions(self, msg: Predictions) -> None:
        self.delivery.predictions(msg)

    def fail_batch(self, batch_id: int | None, session_ids: tuple[int, ...], error: str) -> None:
        self.delivery.fail_batch(batch_id, session_ids, error)

    def downstream_ready(self, cache: CacheCaps | None) -> None:
        self.prefix.set_downstream(cache)

    def pause_live(self, stage_id: str, error: str) -> None:
        self.replays.pause(stage_id, error)
        self._wakeup.set()

    def chain_back(self) -> None:
        if self.downstream is not None and self.wire_verdict is not None and self.wire_verdict.certified:
            set_chain_wire(self.downstream, self.wire_verdict.used, self.log)  # a restarted stage starts afresh
        self.replays.replay_paused()
        self._wakeup.set()

    async def forget_prefixes(self) -> None:
        self.prefix.clear()
        if self.runtime.prefix is not None:
            await self.worker.call(self.runtime.prefix.clear)

    def _on_process_failure(self, cause: str) -> None:
        self.failed = cause
        self.delivery.fail_live(f"stage {self.identity.stage_id} failed: {cause}", ErrorCode.PIPELINE_FAILED)
