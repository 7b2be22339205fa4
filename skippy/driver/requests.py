"""Stage 0's request endpoint: the ROUTER where clients (broker, `skippy generate`) submit.

Clients send Submit / Cancel / StatusQuery; each request's token events go back as TokenEvents to the
client that asked, or, when its Submit names an `events_to` endpoint, straight there with a copy of
the final event to the submitter (skippy.driver.direct_events). A refused Submit is answered with an
error event: queue_full when stage 0's waiting queue is full (the driver logs that once per episode),
unavailable while a stage is down, bad_request otherwise (logged `request_refused`).

Direct events never queue in stage 0 past the sink's bound: one the client's socket refuses (it does
not read) fails its request: the request is cancelled, the submitter gets an error event (slow_client)
in place of the final copy (the broker relays it to the client; a direct client gets it itself), and
later events are dropped. Counted in `skippy_driver_events_to_overflow_total`; logged
`events_to_overflow` once per episode of an endpoint, `events_to_overflow_ended` when it reads again.

`RequestEndpoint` holds no driver: it answers to `Stage0` (submit, cancel, status), which the driver
implements, so a test can drive it with scripted request handles.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from skippy.driver.direct_events import EventSinks, SinkRefused, submitter_copy, usable
from skippy.protocol import (
    Cancel,
    ErrorCode,
    FinishReason,
    Message,
    ProtocolError,
    ResumePoint,
    Status,
    StatusQuery,
    Submit,
    TokenEvents,
)
from skippy.request_events import PipelineUnavailable, QueueFull, RequestHandle
from skippy.runtime.errors import RuntimeUsageError
from skippy.runtime.sampling import SamplingParams
from skippy.transport.overflow import Overflows
from skippy.transport.queues import RouterQueue

__all__ = ["RequestEndpoint", "Stage0"]


class Stage0(Protocol):
    """What the request endpoint needs of stage 0's driver."""

    def submit(self, prompt: list[int], sampling: SamplingParams | None, max_tokens: int, stop_tokens: frozenset[int],
               request_id: str | None, resume_from: ResumePoint | None, progress: bool = False) -> RequestHandle:
        """Take a request (raises QueueFull, PipelineUnavailable, RuntimeUsageError when it cannot)."""

    def cancel(self, request_id: str) -> None:
        """End a request early (its final event says cancelled)."""

    def status(self, nonce: int) -> Status:
        """The answer to a StatusQuery."""


class RequestEndpoint:
    def __init__(self, stage0: Stage0, sinks: EventSinks, log: Any, *,
                 events_to_overflow: Callable[[], None] | None = None) -> None:
        """`events_to_overflow`: counts each direct event refused (the driver's observer's counter)."""
        self.stage0 = stage0
        self.sinks = sinks
        self.log = log
        self.forwarders: set[asyncio.Task[None]] = set()
        self.overflows = Overflows("events_to_overflow", log, events_to_overflow)

    async def serve(self, router: RouterQueue) -> None:
        while True:
            client, msg = await router.recv()
            await self.on_request(router, client, msg)

    async def on_request(self, router: RouterQueue, client: bytes, msg: Message | ProtocolError) -> None:
        if isinstance(msg, Submit):
            try:
                sampling = SamplingParams.from_dict(msg.sampling)
                handle = self.stage0.submit(list(msg.prompt), sampling, msg.max_tokens, frozenset(msg.stop_tokens),
                                            msg.request_id, msg.resume_from, msg.progress)
            except (QueueFull, RuntimeUsageError, PipelineUnavailable, TypeError, ValueError) as exc:
                code = (ErrorCode.QUEUE_FULL if isinstance(exc, QueueFull) else
                        ErrorCode.UNAVAILABLE if isinstance(exc, PipelineUnavailable) else ErrorCode.BAD_REQUEST)
                if code is not ErrorCode.QUEUE_FULL:  # a flood of those is logged once, by the driver
                    self.log.warning("request_refused", request_id=msg.request_id, error=str(exc))
                await router.send(client, TokenEvents(msg.request_id, (), FinishReason.ERROR, str(exc), code))
                return
            events_to = msg.events_to if usable(msg.events_to) else None
            task = asyncio.get_running_loop().create_task(self._forward(router, client, handle, events_to))
            self.forwarders.add(task)
            task.add_done_callback(self.forwarders.discard)
        elif isinstance(msg, Cancel):
            self.stage0.cancel(msg.request_id)
        elif isinstance(msg, StatusQuery):
            await router.send(client, self.stage0.status(msg.nonce))
        else:
            self.log.warning("bad_request", detail=str(msg)[:200])

    async def _forward(self, router: RouterQueue, client: bytes, handle: RequestHandle, events_to: str | None) -> None:
        rid = handle.request_id
        if events_to is not None:
            try:
                self.sinks.attach(events_to)
            except SinkRefused as exc:  # no socket there: everything goes to the submitter instead
                self.log.warning("events_to_refused", request_id=rid, events_to=events_to, error=str(exc))
                events_to = None
        attached, failed = events_to, False
        sent = 0  # tokens pushed to `events_to`
        try:
            async for event in handle:
                if failed:
                    continue  # the request overflowed: the rest of its events (the cancel's final) go nowhere
                tokens = () if event.token is None else (event.token,)
                logprobs = () if event.logprob is None else (event.logprob,)
                msg = TokenEvents(rid, tokens, event.finish_reason, event.error, event.code, logprobs, event.stats,
                                  draws=event.draws, chunk_ends=event.chunk_ends, progress=event.progress)
                if events_to is None:
                    await router.send(client, msg)
                elif await self.sinks.send(events_to, msg):
                    self.overflows.ok(events_to, events_to=events_to)
                    sent += len(tokens)
                    if msg.finish_reason is not None:
                        await router.send(client, submitter_copy(msg, sent))
                else:
                    failed = True
                    await self._overflowed(router, client, rid, events_to, msg)
        finally:
            if attached is not None:
                self.sinks.detach(attached)

    async def _overflowed(self, router: RouterQueue, client: bytes, rid: str, events_to: str, msg: TokenEvents) -> None:
        """The client's event socket refused `msg`: fail the request through its submitter."""
        queued = self.sinks.max_queued
        self.overflows.refused(events_to, events_to=events_to, request_id=rid, max_queued=queued)
        if msg.finish_reason is None:
            self.stage0.cancel(rid)
        error = (f"token events overflowed: the client at {events_to} is not reading them ({queued} queued at stage 0 "
                 f"for {self.sinks.patience_s:g} s)")
        await router.send(client, TokenEvents(rid, (), FinishReason.ERROR, error, ErrorCode.SLOW_CLIENT, stats=msg.stats))
