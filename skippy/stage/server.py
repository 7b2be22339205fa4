"""A stage process after stage 0: run this stage's layers on every batch and pass the result on.

Sockets: one PULL bound at `bind_addr` receives everything addressed to this stage (hello, batches,
session control from upstream; credits from downstream). A PUSH to the downstream carries batches
and session control onward; a PUSH back to the upstream's announced endpoint carries ready, credits
and errors; the final stage sends predictions **directly to stage 0**, and every stage sends
heartbeats there so stage 0 can tell a dead stage from a slow one.

If any of its loops fails (or a send downstream fails) the process logs `process_failed` with the
cause, tells stage 0 which sessions it held, and exits with code 1.

Credits: a batch is credited upstream once it has left this stage (forwarded downstream, which
itself needs a downstream credit, so backpressure propagates), except that up to
`reply_credit_limit` prefill batches (no outputs wanted) are credited early, on receipt. Stage 1
answering stage 0 itself puts the credit in its Predictions (`Predictions.credit`). Toward
the downstream at most `max_inflight` batches are un-credited. All runtime calls run in one worker
thread, in arrival order, so the event loop keeps moving frames while llama.cpp computes.
"""

from __future__ import annotations

import asyncio
import time

import zmq.asyncio

from skippy.config import ServingOptions
from skippy.faults import fault_point
from skippy.log import announce_ready, get_logger
from skippy.protocol import (
    Batch,
    ConfigureSession,
    Credit,
    ErrorCode,
    ErrorReport,
    Heartbeat,
    Hello,
    Message,
    Predictions,
    ProtocolError,
    Ready,
    ReleaseSessions,
    StageIdentity,
    StageTiming,
    decode,
)
from skippy.runtime.errors import RuntimeUsageError
from skippy.runtime.prefix_cache import chain_caps
from skippy.runtime.sampling import SamplingParams
from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.windows import SessionWindow
from skippy.stage.final_sampling import VerifySpec, input_tokens
from skippy.stage.handshake import PROCESS_INCARNATION, check_upstream, greet_again, open_downstream, stage0_endpoint
from skippy.stage.links import DownstreamLink, handle_link_control
from skippy.stage.telemetry import StageTelemetry
from skippy.stage.worker import RuntimeWorker
from skippy.supervise import Supervisor, ignore_signals, stop_on_signals
from skippy.transport.curve_guard import guard_of
from skippy.transport.queues import PullQueue, PushQueue

HEARTBEAT_INTERVAL_S = 0.5

STOP_REPORT_TIMEOUT_S = 2.0


class StageServer:
    def __init__(self, options: ServingOptions, runtime: StageRuntime) -> None:
        cfg = options.config
        self.options = options
        self.runtime = runtime
        self.identity = StageIdentity(
            cfg.stage_id, cfg.stage_index, cfg.layer_start, cfg.layer_end, runtime.model_digest, runtime.n_embd
        )
        self.log = get_logger()
        self.stopped = asyncio.Event()
        self.supervisor = Supervisor(self.log, self.stopped)
        self.ctx = zmq.asyncio.Context()
        self.worker = RuntimeWorker(runtime, f"runtime-{cfg.stage_id}")
        self.work: asyncio.Queue[Message] = asyncio.Queue()
        self.working = False  # the work loop is handling a message
        self.early: set[int] = set()  # prefill batches credited on receipt, not yet forwarded
        self.counters: dict[str, int] = {"batches": 0, "rows": 0, "max_rows": 0, "max_sessions": 0, "errors": 0}
        self.inbound: PullQueue | None = None
        self.downstream: DownstreamLink | None = None
        self.upstream: PushQueue | None = None
        self.stage0: PushQueue | None = None
        self.telemetry = StageTelemetry(self.identity, options, final=runtime.is_final, queue_depth=self.work.qsize,
                                        downstream=lambda: self.downstream,
                                        link_guard=lambda: guard_of(self.ctx))  # metrics and spans (skippy.stage.telemetry)

    # -- lifecycle ---------------------------------------------------------------------------
    async def run(self) -> int:
        stop_on_signals(self.stopped)
        try:
            await self._start()
            await self.stopped.wait()
        finally:
            ignore_signals()
            await self._shutdown()
        credits = self.downstream.credits.stats if self.downstream is not None else None
        prefix = self.runtime.prefix
        self.log.info("stopped", exit_code=self.supervisor.exit_code, **self.counters,
                      credits=vars(credits) if credits else None, prefix_cache=prefix.summary() if prefix else None)
        return self.supervisor.exit_code

    async def _start(self) -> None:
        first_stage = self.identity.stage_index == 0
        n_embd = None if first_stage else self.identity.n_embd
        self.inbound = PullQueue(self.ctx, self.options.bind_addr, decoder=lambda f: decode(f, n_embd=n_embd))
        early: list[Message] = []
        if self.options.config.downstream is not None:
            self.downstream, early = await open_downstream(self.ctx, self.options, self.identity, self.inbound,
                                                           self.supervisor.fail)
        self.stage0 = PushQueue(self.ctx, stage0_endpoint(self.options))
        for msg in early:
            await self._dispatch(msg)
        cfg = self.options.config
        announce_ready(
            self.log, layer_start=cfg.layer_start, layer_end=cfg.layer_end, endpoint=self.inbound.endpoint,
            n_embd=self.identity.n_embd, final=self.runtime.is_final, max_inflight=self.options.max_inflight,
            reply_credit_limit=self.options.reply_credit_limit, async_prefill_forward=self.options.async_prefill_forward,
            wire_delay_ms=self.options.wire.delay_ms, wire_mbps=self.options.wire.mbps,
            weight_buffers_mib=self.runtime.model.buffers, amx_avoided=self.runtime.model.amx_avoided,
            eval_callback=self.runtime.eval_callback,
        )
        self.supervisor.spawn("receive loop", self._recv_loop())
        self.supervisor.spawn("work loop", self._work_loop())
        self.supervisor.spawn("heartbeats", self._heartbeats())

    async def _shutdown(self) -> None:
        """Close everything this stage owns, whichever step fails."""
        try:
            await self.supervisor.close()
            sessions = self.runtime.active_sessions
            if sessions and self.stage0 is not None:
                why = self.supervisor.failure or "stopped"
                report = ErrorReport(ErrorCode.STAGE_STOPPED, f"stage {self.identity.stage_id} {why}",
                                     self.identity.stage_id, None, tuple(sessions))
                await asyncio.wait([asyncio.ensure_future(self.stage0.send(report))], timeout=STOP_REPORT_TIMEOUT_S)
        finally:
            if self.stage0 is not None:
                self.stage0.close(linger_ms=1000)  # let the stage_stopped report leave
            for link in (self.downstream, self.upstream, self.inbound):
                if link is not None:
                    link.close()
            self.worker.close()
            self.runtime.close()
            self.ctx.term()

    async def _heartbeats(self) -> None:
        assert self.stage0 is not None
        while True:
            await self.stage0.send(Heartbeat(self.identity.stage_id, PROCESS_INCARNATION))
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)

    # -- inbound -----------------------------------------------------------------------------
    async def _recv_loop(self) -> None:
        assert self.inbound is not None
        while True:
            await self._dispatch(await self.inbound.recv())

    async def _dispatch(self, msg: Message | ProtocolError) -> None:
        if isinstance(msg, ProtocolError):
            self.counters["errors"] += 1
            self.log.warning("bad_message", code=msg.code, error=msg.message)
            await self._reply_upstream(ErrorReport(msg.code, msg.message, self.identity.stage_id))
        elif isinstance(msg, Hello):
            await self._on_hello(msg)
        elif isinstance(msg, Batch | ConfigureSession | ReleaseSessions):
            if self.upstream is None:
                self.log.warning("no_handshake", kind=type(msg).__name__, error="message before any accepted hello")
                return
            if isinstance(msg, Batch) and not any(w.outputs for w in msg.windows):
                if len(self.early) < self.options.reply_credit_limit:  # early credit for prefill, bounded
                    self.early.add(msg.batch_id)
                    await self.upstream.send(Credit(msg.batch_id, self.identity.stage_id))
            if isinstance(msg, Batch) and self._runs_now(msg):
                await self._on_batch(msg)  # saves the work loop's turn (docs/measurements.md, 'Runtime-thread hand-off')
            else:
                self.work.put_nowait(msg)
        elif not await handle_link_control(msg, self.downstream, self.log):
            self.log.warning("unexpected_message", kind=type(msg).__name__, detail=str(msg)[:200])

    async def _on_hello(self, hello: Hello) -> None:
        reply = PushQueue(self.ctx, hello.reply_endpoint)
        problem = check_upstream(hello.sender, self.identity)
        early: list[Message] = []
        if not problem and self.downstream is not None and self.inbound is not None:  # the chain below starts afresh
            problem = await greet_again(self.downstream, self.identity, self.inbound, self.options, early)
        if problem:
            self.log.error("handshake_refused", upstream=hello.sender.stage_id, error=problem)
            await reply.send(ErrorReport(ErrorCode.HANDSHAKE, problem, self.identity.stage_id))
            reply.close(linger_ms=1000)
            return
        if self.upstream is not None:
            self.upstream.close(linger_ms=1000)
        self.upstream = reply
        released = await self.worker.call(self.worker.release, self.runtime.active_sessions)
        prefix = self.runtime.prefix
        dropped = await self.worker.call(prefix.clear) if prefix is not None else 0  # a new upstream's index is empty
        self.log.info("upstream_accepted", upstream=hello.sender.stage_id, reply_endpoint=hello.reply_endpoint,
                      released_sessions=released, dropped_prefix_entries=dropped)
        ready = self.downstream.ready if self.downstream is not None else None
        caps = chain_caps(prefix.caps if prefix is not None else None, ready.cache if ready is not None else None,
                          self.downstream is not None)
        await reply.send(Ready(self.identity, caps))
        for msg in early:
            await self._dispatch(msg)

    async def _reply_upstream(self, msg: Message) -> None:
        if self.upstream is not None:
            await self.upstream.send(msg)

    # -- work --------------------------------------------------------------------------------
    def _runs_now(self, batch: Batch) -> bool:
        """A decode-sized batch with nothing ahead of it runs in the receive loop itself, as it would next in
        the work loop: it computes inline and its forward cannot wait for a credit (which this loop must
        be free to receive)."""
        credits = self.downstream.credits.stats if self.downstream is not None else None
        return (not self.working and self.work.empty() and self.worker.runs_inline(batch.n_rows)
                and (credits is None or credits.outstanding < credits.limit))

    async def _work_loop(self) -> None:
        while True:
            msg = await self.work.get()
            self.working = True
            try:
                if isinstance(msg, Batch):
                    await self._on_batch(msg)
                    continue
                if isinstance(msg, ConfigureSession):
                    if self.runtime.is_final:
                        params = SamplingParams.from_dict(msg.sampling)
                        await self.worker.call(self.runtime.configure_session, msg.session_id, params, msg.history, msg.draws)
                elif isinstance(msg, ReleaseSessions):
                    await self.worker.call(self.worker.release, msg.session_ids, msg.keep, msg.evict)
                    self.telemetry.released(msg.session_ids)
                if self.downstream is not None:
                    self.downstream.enqueue(msg)
            except RuntimeUsageError as exc:
                await self._report_failure(ErrorCode.SESSION_CONTROL, str(exc), None, _sessions_of(msg))
            finally:
                self.working = False

    async def _report_failure(self, code: ErrorCode, message: str, batch_id: int | None,
                              sessions: tuple[int, ...]) -> None:
        self.counters["errors"] += 1
        self.log.error("request_failed", code=code, error=message, batch_id=batch_id, session_ids=list(sessions))
        assert self.stage0 is not None
        await self.stage0.send(ErrorReport(code, message, self.identity.stage_id, batch_id, sessions))

    async def _on_batch(self, batch: Batch) -> None:
        recv_at = time.time()
        sessions = tuple(w.session_id for w in batch.windows)
        fault_point("stage.batch")
        windows = [SessionWindow(w.session_id, w.pos_start, w.n_tokens, w.outputs, input_tokens(w), w.restore, w.record,
                                 w.evict) for w in batch.windows]
        try:
            verify = [VerifySpec(w.draft, w.head, w.mtp_draft_max) for w in batch.windows]
            computed = await self.worker.compute(windows, batch.hidden, verify)
        except (RuntimeUsageError, RuntimeError) as exc:
            await self._report_failure(ErrorCode.BATCH_FAILED, str(exc), batch.batch_id, sessions)
            await self._credit_deferred(batch.batch_id)
            return
        wait_ms = send_ms = 0.0
        credit = False
        missed = (*batch.missed, *computed.missed)
        kept = tuple(w for w in batch.windows if w.session_id not in computed.missed)
        if computed.missed:
            self.log.info("prefix_miss", batch_id=batch.batch_id, session_ids=list(computed.missed))
        if self.downstream is None or not kept:  # the end of this batch's way: answer stage 0
            assert self.stage0 is not None
            timing = StageTiming(self.identity.stage_id, recv_at, computed.compute_ms, 0.0, time.time())
            # stage 0 is our upstream: the answer carries the credit too (one message less each way per token)
            credit = self.identity.stage_index == 1 and batch.batch_id not in self.early
            await self.stage0.send(Predictions(batch.batch_id, computed.predictions, (*batch.timings, timing), missed,
                                               credit))
        else:
            sent, wait_ms = await self.downstream.forward(batch.batch_id, kept, computed.hidden, batch.timings,
                                                          self.identity.stage_id, recv_at, computed.compute_ms,
                                                          missed=missed)
            if not self.options.async_prefill_forward:
                send_ms = await sent
        if not credit:
            await self._credit_deferred(batch.batch_id)
        self._count(batch)
        self.telemetry.batch(batch, computed, recv_at, wait_ms, send_ms)
        credits = self.downstream.credits.stats if self.downstream is not None else None
        self.log.debug(
            "batch", batch_id=batch.batch_id, rows=batch.n_rows, sessions=len(sessions),
            compute_ms=round(computed.compute_ms, 3), send_ms=round(send_ms, 3), credit_wait_ms=round(wait_ms, 3),
            credits_outstanding=credits.outstanding if credits else 0, early_credits=len(self.early),
        )

    async def _credit_deferred(self, batch_id: int) -> None:
        """Credit a batch once it has left this stage (forwarded, or answered at the final stage)."""
        if batch_id in self.early:
            self.early.discard(batch_id)
        else:
            await self._reply_upstream(Credit(batch_id, self.identity.stage_id))

    def _count(self, batch: Batch) -> None:
        c = self.counters
        c["batches"] += 1
        c["rows"] += batch.n_rows
        c["max_rows"] = max(c["max_rows"], batch.n_rows)
        c["max_sessions"] = max(c["max_sessions"], len(batch.windows))


def _sessions_of(msg: Message) -> tuple[int, ...]:
    if isinstance(msg, ReleaseSessions):
        return msg.session_ids
    if isinstance(msg, ConfigureSession):
        return (msg.session_id,)
    return ()

