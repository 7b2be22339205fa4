"""The admission broker: HTTP adapters on one side, pipeline replicas (stage 0 request endpoints) on the other.

Adapters connect DEALERs to the broker's ROUTER and speak the same protocol as stage 0 (Submit,
Cancel, StatusQuery -> TokenEvents, Status), so a `PipelineClient` works against either.  Every
`poll_interval_s` the broker asks each pipeline for its Status; a pipeline is ready when it says
so and answered within `status_timeout_s`.  Admission is one FIFO `AdmissionQueue` for the whole
broker: total concurrency = sum over ready pipelines of their per-pipeline concurrency.  An
admitted request goes to the ready pipeline with the fewest requests in flight (preferring one
with a spare permit; or, among replicas, to the one sent its prompt's beginning before: brokers.pool)
and its TokenEvents are relayed back unchanged (an error without a code becomes `pipeline_failed`); the final
event releases the permit.  A Submit naming `events_to` (an adapter's own endpoint) has stage 0 send the adapter
its events itself; the broker gets a copy of the final one (`TokenEvents.sent_direct` set) and passes on only
finals it makes (skippy.driver.direct_events). Unless adapters, broker and pipeline share a host (both broker
endpoints ipc) it clears `events_to`: events take the relay.  Refusals are error TokenEvents with a code:
queue_full, admission_timeout, unavailable (no ready pipeline; queued requests too when the last one goes),
bad_request / context_length_exceeded, pipeline_failed (stage 0 reported a failure or did not take the Submit);
pipeline_lost (stage 0 stopped answering with it in flight; cancelled there): skippy.adapter.resume resumes it.

Every send to an adapter goes through `AdapterRelay` (brokers.relay): bounded, and never dropped in silence.
Metrics and spans are `BrokerTelemetry`'s (brokers.telemetry), built from the queue, pool and tally. The
requests held, their cancels and how each ends, are the `RequestLedger`'s (brokers.held_requests).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import zmq.asyncio
from msgspec.structs import replace

from brokers.adaptive import AdaptiveConcurrency
from brokers.admission import AdmissionError, AdmissionQueue
from brokers.held_requests import HeldRequest, RequestLedger, error_event
from brokers.link import PipelineLink
from brokers.pool import PipelinePool
from brokers.relay import RELAY_HWM, AdapterRelay
from brokers.telemetry import BrokerTelemetry
from skippy.config import AdmissionOptions, prompt_length_error
from skippy.log import announce_ready, get_logger
from skippy.protocol import (
    Cancel,
    ErrorCode,
    FinishReason,
    Message,
    ProtocolError,
    Status,
    StatusQuery,
    Submit,
    TokenEvents,
    event_message,
)
from skippy.transport.curve_guard import guard_of
from skippy.transport.queues import Offer, RouterQueue

__all__ = ["Broker"]


class Broker:
    def __init__(self, bind_endpoint: str, pipelines: Sequence[str],
                 admission: AdmissionOptions | None = None, *,
                 stage0_ids: Sequence[str | None] | None = None, ctx: zmq.asyncio.Context | None = None,
                 link_ctx: zmq.asyncio.Context | None = None, poll_interval_s: float = 0.5,
                 status_timeout_s: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 relay_hwm: int = RELAY_HWM) -> None:
        """`link_ctx` (default: `ctx`) carries the sockets toward the pipelines: a CURVE-secured context
        when their topologies have link keys (skippy.transport.curve_guard), while adapters reach the broker in the clear."""
        self.bind_endpoint = bind_endpoint
        self.relay_hwm = relay_hwm
        self.admission = admission or AdmissionOptions()
        self.clock = clock
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.asyncio.Context()
        self.pool = PipelinePool(link_ctx or self.ctx, pipelines, self.admission, stage0_ids=stage0_ids,
                                 on_events=self._on_pipeline_events, on_change=self._on_pool_change,
                                 on_silent=self._on_silent, poll_interval_s=poll_interval_s,
                                 status_timeout_s=status_timeout_s, clock=clock)
        self.queue = AdmissionQueue(0, self.admission.capacity_for(0), self.admission.admission_timeout_secs)
        self.adaptive: AdaptiveConcurrency | None = None
        self.total_concurrency = 0
        self.outcomes: Counter[str] = Counter()
        self.log = get_logger()
        self.router: RouterQueue | None = None
        self._server: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()  # request tasks and fire-and-forget sends
        self._closed = False
        self.telemetry = BrokerTelemetry(lambda: self.queue, lambda: len(self.pool.ready_links()), self.outcomes,
                                         clock, link_guard=lambda: guard_of(link_ctx or self.ctx))  # (brokers.telemetry)
        self.relay = AdapterRelay(lambda: self.router, self.telemetry.relay_overflow, self.log, self._spawn,
                                  lambda: self._closed, relay_hwm)
        self.relay_overflow = self.relay.overflow
        self.ledger = RequestLedger(self.outcomes, self.telemetry, self.relay, self.log, clock, lambda: self.adaptive)

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        """The bound endpoint (tcp port 0 resolved); valid after `start()`."""
        assert self.router is not None, "broker not started"
        return self.router.endpoint

    async def start(self) -> Broker:
        if self.admission.adaptive:
            self.adaptive = AdaptiveConcurrency(self.queue, self.admission.start_concurrency, 0)
        self.router = RouterQueue(self.ctx, self.bind_endpoint, sndhwm=self.relay_hwm, mandatory=True)
        self.pool.start()
        self._server = asyncio.get_running_loop().create_task(self._serve(self.router))
        announce_ready(self.log, endpoint=self.router.endpoint, pipelines=self.pool.endpoints,
                      concurrency=self.admission.generation_concurrency, queue_capacity=self.admission.queue_capacity,
                      admission_timeout_s=self.admission.admission_timeout_secs, adaptive=self.admission.adaptive)
        return self

    async def close(self, reason: str = "broker stopping") -> None:
        """Fail queued and running requests with `unavailable` (`reason`), cancel them at their pipelines,
        close every socket and log `stopped`.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.cancel()
        failed = len(self.requests)
        for req in list(self.requests.values()):
            if req.link is not None:
                await req.link.cancel(req.submit.request_id)
            await self.ledger.finish(req, error_event(req.submit.request_id, "unavailable", reason))
        for task in self._background:
            task.cancel()  # queued requests leave the queue; their final event is already sent
        await asyncio.gather(*(t for t in (self._server, *self._background) if t), return_exceptions=True)
        await self.pool.close()
        if self.router is not None:
            self.router.close()
        if self._own_ctx:
            self.ctx.term()
        self.log.info("stopped", reason=reason, failed_in_flight=failed, outcomes=dict(self.outcomes))

    async def __aenter__(self) -> Broker:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- state ---------------------------------------------------------------------------------
    @property
    def requests(self) -> dict[str, HeldRequest]:
        """The requests held, by id, until each one's final event."""
        return self.ledger.requests

    @property
    def ready(self) -> bool:
        """Some pipeline is ready to take requests."""
        return self.pool.ready

    def status(self, nonce: int = 0) -> Status:
        """The broker as one pipeline: what adapters' /readyz and /metrics read."""
        return Status(nonce, self.pool.ready, self.pool.dead_stage(), self.queue.running, self.queue.waiting,
                      self.total_concurrency, self.pool.ctx_size, self.pool.wire())

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Wait (bounded) until `predicate()` holds; re-checked whenever pipeline state is refreshed."""
        await self.pool.wait_until(predicate, timeout_s)

    def _on_pool_change(self) -> None:
        """Admission follows the ready pipelines; with none left, queued requests are refused."""
        total = self.pool.total_concurrency
        if total != self.total_concurrency:
            self.total_concurrency = total
            self.queue.capacity = self.admission.capacity_for(total)
            if self.adaptive is not None:
                self.adaptive.set_limit(total)
            else:
                self.queue.concurrency = total
            self.log.info("admission_capacity", total_concurrency=total, concurrency=self.queue.concurrency,
                          queue_capacity=self.queue.capacity,
                          ready_pipelines=[link.endpoint for link in self.pool.ready_links()])
        if not self.pool.ready and self.queue.waiting:
            self.queue.reject_waiters(AdmissionError(self.pool.unavailable_reason(), "unavailable"))

    def _on_silent(self, link: PipelineLink, reason: str) -> None:
        """Stage 0 stopped answering or lost its connection: the requests it held are lost (cancelled there, in case
        it is only slow, so their lanes come free); each ends with pipeline_lost, so that its client may resume it
        from the tokens it has (skippy.adapter.resume)."""
        for req in list(link.inflight.values()):
            self._spawn(link.cancel(req.submit.request_id))
            self._spawn(self.ledger.finish(req, error_event(req.submit.request_id, ErrorCode.PIPELINE_LOST, reason)))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # -- adapters ------------------------------------------------------------------------------
    async def _serve(self, router: RouterQueue) -> None:
        while True:
            client, msg = await router.recv()
            try:
                await self._on_request(client, msg)
            except Exception:  # one bad request must not stop the broker
                self.log.exception("request_handling_failed", kind=type(msg).__name__)

    async def _on_request(self, client: bytes, msg: Message | ProtocolError) -> None:
        assert self.router is not None
        if isinstance(msg, Submit):
            await self._on_submit(client, msg)
        elif isinstance(msg, Cancel):
            await self.ledger.cancel(client, msg, self.pool.links)
        elif isinstance(msg, StatusQuery):
            self.relay.tell(client, self.status(msg.nonce))
        elif isinstance(msg, ProtocolError):
            self.log.warning("bad_message", code=msg.code, error=msg.message, request_id=msg.request_id)
            if msg.request_id is not None:  # a request it could not read still gets its answer: no client waits forever
                self.outcomes["bad_request"] += 1
                self.relay.tell_final(client, error_event(msg.request_id, ErrorCode.BAD_REQUEST, msg.message))
        else:
            self.log.warning("unexpected_message", kind=type(msg).__name__)

    def _refusal(self, msg: Submit) -> tuple[str, str] | None:
        """(code, message) when the request cannot be taken at all, before it may queue."""
        if msg.request_id in self.requests:
            return "bad_request", f"request id {msg.request_id} is already in flight"
        if not self.pool.ready:
            return "unavailable", self.pool.unavailable_reason()
        unfit = prompt_length_error(len(msg.prompt), self.pool.ctx_size)
        return None if unfit is None else (unfit.code, unfit.message)

    async def _on_submit(self, client: bytes, msg: Submit) -> None:
        assert self.router is not None
        refusal = self._refusal(msg)
        if refusal is not None:
            self.outcomes[refusal[0]] += 1
            self.log.info("request_refused", request_id=msg.request_id, code=refusal[0], error=refusal[1])
            self.relay.tell_final(client, error_event(msg.request_id, *refusal))
            return
        req = self.ledger.hold(client, msg)
        req.task = self._spawn(self._admit(req))

    # -- requests ------------------------------------------------------------------------------
    async def _admit(self, req: HeldRequest) -> None:
        rid = req.submit.request_id
        try:
            permit = await self.queue.acquire(rid)
        except AdmissionError as exc:
            await self.ledger.finish(req, error_event(rid, exc.code, str(exc)))
            return
        except asyncio.CancelledError:
            await self.ledger.finish(req, TokenEvents(rid, (), FinishReason.CANCELLED))
            return
        req.permit, req.admitted_at = permit, self.clock()
        self.telemetry.admitted(req.admitted_at - req.received_at)
        if req.done:  # finished (broker closing) in the instant it was admitted
            permit.release()
            return
        link = self.pool.route(req.submit.prompt)
        if link is None:
            await self.ledger.finish(req, error_event(rid, "unavailable", self.pool.unavailable_reason()))
            return
        req.link = link
        link.inflight[rid] = req
        self.log.debug("admitted", request_id=rid, pipeline=link.endpoint,
                       queue_ms=round((req.admitted_at - req.received_at) * 1e3, 3))
        if not await link.submit(self._routed(req.submit, link)):
            refused = f"stage 0 at {link.endpoint} not accepting requests"
            await self.ledger.finish(req, error_event(rid, "pipeline_failed", refused))

    def _routed(self, submit: Submit, link: PipelineLink) -> Submit:
        """`submit` as it goes to `link`: `events_to` kept only when adapter, broker and stage 0 share a host
        (both our endpoints ipc), else the events take the relay."""
        local = self.bind_endpoint.startswith("ipc://") and link.endpoint.startswith("ipc://")
        return submit if local or submit.events_to is None else replace(submit, events_to=None)

    async def _on_pipeline_events(self, link: PipelineLink, events: tuple[TokenEvents, ...]) -> None:
        """A step's events from stage 0: finals end their requests; the rest go on as one message per adapter."""
        relayed: dict[bytes, list[tuple[HeldRequest, TokenEvents]]] = {}
        for msg in events:
            req = link.inflight.get(msg.request_id)
            if req is None or req.done:
                continue  # a request already failed here (stage 0 went silent, broker closing)
            direct = msg.sent_direct  # stage 0 sent the client every event itself: this is our copy of the last
            req.tokens = direct if direct is not None else req.tokens + len(msg.tokens)
            if msg.finish_reason is None:
                relayed.setdefault(req.client, []).append((req, msg))
                continue
            if msg.finish_reason == "error" and msg.code is None:
                msg = replace(msg, code=ErrorCode.PIPELINE_FAILED)
            await self.ledger.finish(req, msg, tell_client=direct is None)
        for client, held in relayed.items():
            offer = self.relay.tell(client, event_message([msg for _, msg in held]), held[0][1].request_id)
            if offer is Offer.SENT:
                continue
            why = f"{self.relay_hwm} events queued toward it" if offer is Offer.FULL else "it is gone"
            overflowed = f"token events overflowed at the broker: the client is not reading them ({why})"
            for req, msg in held:  # the adapter does not read, or is gone: its requests cannot go on
                self._spawn(link.cancel(msg.request_id))
                await self.ledger.finish(req, error_event(msg.request_id, ErrorCode.SLOW_CLIENT, overflowed))
