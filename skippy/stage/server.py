"""A stage process after stage 0: run this stage's layers on every batch and pass the result on.

Sockets: one PULL bound at `bind_addr` receives everything addressed to this stage (hello, batches,
session control from upstream; credits from downstream). A PUSH to the downstream carries batches
and session control onward; a PUSH back to the upstream's announced endpoint carries ready, credits
and errors; the final stage sends predictions **directly to stage 0**, and every stage sends
heartbeats there so stage 0 can tell a dead stage from a slow one.

Credits: a batch is credited upstream once it has left this stage (forwarded downstream, which
itself needs a downstream credit, so backpressure propagates), except that up to
`reply_credit_limit` prefill batches (no outputs wanted) are credited early, on receipt. Toward
the downstream at most `max_inflight` batches are un-credited. All runtime calls run in one worker
thread, in arrival order, so the event loop keeps moving frames while llama.cpp computes.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import zmq.asyncio

from skippy.config import ServingOptions
from skippy.log import get_logger
from skippy.protocol import (
    Batch,
    ConfigureSession,
    Credit,
    ErrorReport,
    Heartbeat,
    Hello,
    Message,
    Predictions,
    ProtocolError,
    Ready,
    ReleaseSessions,
    SessionPrediction,
    SetWire,
    StageIdentity,
    StageTiming,
    decode,
)
from skippy.runtime.errors import RuntimeUsageError
from skippy.runtime.sampling import SamplingParams
from skippy.runtime.stage_runtime import SessionWindow, StageRuntime
from skippy.stage.predict import predict
from skippy.stage.handshake import await_ready, check_upstream, connectable, stage0_endpoint
from skippy.stage.links import DownstreamLink, ReplyCredits, apply_wire, ignore_signals, stop_on_signals
from skippy.transport import PullQueue, PushQueue

HEARTBEAT_INTERVAL_S = 0.5


class StageServer:
    def __init__(self, options: ServingOptions, runtime: StageRuntime) -> None:
        cfg = options.config
        self.options = options
        self.runtime = runtime
        self.identity = StageIdentity(
            cfg.stage_id, cfg.stage_index, cfg.layer_start, cfg.layer_end, runtime.model_digest, runtime.n_embd
        )
        self.log = get_logger()
        self.ctx = zmq.asyncio.Context()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"runtime-{cfg.stage_id}")
        self.credits = ReplyCredits(options.max_inflight)
        self.work: asyncio.Queue[Message] = asyncio.Queue()
        self.early: set[int] = set()  # prefill batches credited on receipt, not yet forwarded
        self.counters: dict[str, int] = {"batches": 0, "rows": 0, "max_rows": 0, "max_sessions": 0, "errors": 0}
        self.inbound: PullQueue | None = None
        self.downstream: DownstreamLink | None = None
        self.upstream: PushQueue | None = None
        self.stage0: PushQueue | None = None
        self.stopped = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        stop_on_signals(self.stopped)
        first_stage = self.identity.stage_index == 0
        self.inbound = PullQueue(
            self.ctx, self.options.bind_addr, decoder=lambda f: decode(f, n_embd=None if first_stage else self.identity.n_embd)
        )
        early: list[Message] = []
        if self.options.config.downstream is not None:
            self.downstream = DownstreamLink(self.ctx, self.options.config.downstream.endpoint, self.options.wire)
            await self.downstream.send(Hello(self.identity, connectable(self.inbound.endpoint)))
            await await_ready(self.inbound, self.options, early)
        self.stage0 = PushQueue(self.ctx, stage0_endpoint(self.options))
        for msg in early:
            await self._dispatch(msg)
        cfg = self.options.config
        self.log.info(
            "ready",
            layer_start=cfg.layer_start,
            layer_end=cfg.layer_end,
            endpoint=self.inbound.endpoint,
            n_embd=self.identity.n_embd,
            final=self.runtime.is_final,
            max_inflight=self.options.max_inflight,
            reply_credit_limit=self.options.reply_credit_limit,
            async_prefill_forward=self.options.async_prefill_forward,
            wire_delay_ms=self.options.wire.delay_ms,
            wire_mbps=self.options.wire.mbps,
            weight_buffers_mib=self.runtime.model.buffers,
            amx_avoided=self.runtime.model.amx_avoided,
        )
        tasks = [loop.create_task(c) for c in (self._recv_loop(), self._work_loop(), self._heartbeats())]
        stop_wait = loop.create_task(self.stopped.wait())
        done, _ = await asyncio.wait([stop_wait, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stop_wait and task.exception() is not None:
                self.log.error("stage_failed", error=repr(task.exception()))
        await self._shutdown(tasks)
        return 0

    async def _shutdown(self, tasks: list[asyncio.Task[Any]]) -> None:
        ignore_signals()
        for task in tasks:
            task.cancel()
        sessions = self.runtime.active_sessions
        if sessions and self.stage0 is not None:
            report = ErrorReport("stage_stopped", f"stage {self.identity.stage_id} stopped", self.identity.stage_id,
                                 None, tuple(sessions))
            await asyncio.wait_for(self.stage0.send(report), 2.0)
        if self.stage0 is not None:
            self.stage0.close(linger_ms=1000)  # let the stage_stopped report leave
        for link in (self.downstream, self.upstream, self.inbound):
            if link is not None:
                link.close()
        self.executor.shutdown(wait=True)
        self.runtime.close()
        self.ctx.term()
        self.log.info("stopped", **self.counters, credits=vars(self.credits.stats))

    async def _heartbeats(self) -> None:
        assert self.stage0 is not None
        while True:
            await self.stage0.send(Heartbeat(self.identity.stage_id, self.identity.stage_index, time.time()))
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
        elif isinstance(msg, Credit):
            await self.credits.release()
        elif isinstance(msg, SetWire):
            apply_wire(self.downstream, msg, self.log)
        elif isinstance(msg, Batch | ConfigureSession | ReleaseSessions):
            if self.upstream is None:
                self.log.warning("no_handshake", kind=type(msg).__name__, error="message before any accepted hello")
                return
            if isinstance(msg, Batch) and not any(w.outputs for w in msg.windows):
                if len(self.early) < self.options.reply_credit_limit:  # early credit for prefill, bounded
                    self.early.add(msg.batch_id)
                    await self.upstream.send(Credit(msg.batch_id, self.identity.stage_id))
            self.work.put_nowait(msg)
        else:
            self.log.warning("unexpected_message", kind=type(msg).__name__, detail=str(msg)[:200])

    async def _on_hello(self, hello: Hello) -> None:
        reply = PushQueue(self.ctx, hello.reply_endpoint)
        problem = check_upstream(hello.sender, self.identity)
        if problem:
            self.log.error("handshake_refused", upstream=hello.sender.stage_id, error=problem)
            await reply.send(ErrorReport("handshake", problem, self.identity.stage_id))
            reply.close(linger_ms=1000)
            return
        if self.upstream is not None:
            self.upstream.close(linger_ms=1000)
        self.upstream = reply
        released = await self._in_runtime(self._release_all)
        self.log.info("upstream_accepted", upstream=hello.sender.stage_id, reply_endpoint=hello.reply_endpoint,
                      released_sessions=released)
        await reply.send(Ready(self.identity))

    async def _reply_upstream(self, msg: Message) -> None:
        if self.upstream is not None:
            await self.upstream.send(msg)

    # -- work --------------------------------------------------------------------------------
    async def _in_runtime(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _release_all(self) -> int:
        sessions = self.runtime.active_sessions
        for session in sessions:
            self.runtime.release_session(session)
        return len(sessions)

    def _release(self, session_ids: tuple[int, ...]) -> None:
        for session in session_ids:
            self.runtime.release_session(session)

    async def _work_loop(self) -> None:
        while True:
            msg = await self.work.get()
            try:
                if isinstance(msg, Batch):
                    await self._on_batch(msg)
                    continue
                if isinstance(msg, ConfigureSession):
                    if self.runtime.is_final:
                        params = SamplingParams.from_dict(msg.sampling)
                        await self._in_runtime(self.runtime.configure_session, msg.session_id, params)
                elif isinstance(msg, ReleaseSessions):
                    await self._in_runtime(self._release, msg.session_ids)
                if self.downstream is not None:
                    self.downstream.enqueue(msg)
            except RuntimeUsageError as exc:
                await self._report_failure("session_control", str(exc), None, _sessions_of(msg))

    async def _report_failure(self, code: str, message: str, batch_id: int | None, sessions: tuple[int, ...]) -> None:
        self.counters["errors"] += 1
        self.log.error("request_failed", code=code, error=message, batch_id=batch_id, session_ids=list(sessions))
        assert self.stage0 is not None
        await self.stage0.send(ErrorReport(code, message, self.identity.stage_id, batch_id, sessions))

    def _compute(self, batch: Batch) -> tuple[np.ndarray | None, tuple[SessionPrediction, ...]]:
        windows = [SessionWindow(w.session_id, w.pos_start, w.n_tokens, w.outputs) for w in batch.windows]
        result = self.runtime.decode(windows, batch.hidden)
        if not self.runtime.is_final:
            return result.hidden, ()
        return None, predict(self.runtime, windows, result)

    async def _on_batch(self, batch: Batch) -> None:
        recv_at = time.time()
        start = time.perf_counter()
        sessions = tuple(w.session_id for w in batch.windows)
        try:
            hidden, predictions = await self._in_runtime(self._compute, batch)
        except (RuntimeUsageError, RuntimeError) as exc:
            await self._report_failure("batch_failed", str(exc), batch.batch_id, sessions)
            await self._credit_deferred(batch.batch_id)
            return
        compute_ms = (time.perf_counter() - start) * 1e3
        wait_ms = send_ms = 0.0
        if self.runtime.is_final:
            assert self.stage0 is not None
            timing = StageTiming(self.identity.stage_id, recv_at, compute_ms, 0.0, 0.0, time.time())
            await self.stage0.send(Predictions(batch.batch_id, predictions, (*batch.timings, timing)))
        else:
            assert self.downstream is not None
            wait_ms = await self.credits.acquire()
            timing = StageTiming(self.identity.stage_id, recv_at, compute_ms, 0.0, wait_ms, time.time())
            sent = self.downstream.enqueue(Batch(batch.batch_id, batch.windows, hidden, (*batch.timings, timing)))
            if not self.options.async_prefill_forward:
                send_ms = await sent
        await self._credit_deferred(batch.batch_id)
        self._count(batch)
        self.log.debug(
            "batch", batch_id=batch.batch_id, rows=batch.n_rows, sessions=len(sessions), compute_ms=round(compute_ms, 3),
            send_ms=round(send_ms, 3), credit_wait_ms=round(wait_ms, 3), credits_outstanding=self.credits.stats.outstanding,
            credits_max=self.credits.stats.max_outstanding, early_credits=len(self.early),
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
