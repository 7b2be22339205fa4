"""Stage 0's request endpoint: the ROUTER where clients (broker, `skippy generate`) submit.

Clients send Submit / Cancel / StatusQuery. A request's events go back to the client that asked, or, when its
Submit names an `events_to` endpoint, straight there with a copy of the final event to the submitter
(skippy.driver.direct_events). They leave per step, not per token: every destination (a client on the ROUTER, or
an events endpoint) has an `Outbox` whose task sends, each time it wakes, one message holding one TokenEvents per
request (its tokens of the step merged: skippy.request_events.merge_events), an EventBatch when several requests
share it. A destination that does not read delays only its own requests. A refused Submit is answered with an
error event: queue_full when stage 0's waiting queue is full (the driver logs that once per episode), unavailable
while a stage is down, bad_request otherwise (logged `request_refused`).

Direct events never queue in stage 0 past the sink's bound: a message the client's socket refuses (it does not
read) fails its requests: each is cancelled, its submitter gets an error event (slow_client) in place of the final
copy (the broker relays it to the client; a direct client gets it itself), and its later events are dropped.
Counted in `skippy_driver_events_to_overflow_total`; logged `events_to_overflow` once per episode of an endpoint,
`events_to_overflow_ended` when it reads again.

`RequestEndpoint` holds no driver: it answers to `Stage0` (submit, cancel, status), which the driver
implements, so a test can drive it with scripted request handles.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
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
    event_message,
)
from skippy.request_events import PipelineUnavailable, QueueFull, RequestHandle, merge_events
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

    def cancel(self, request_id: str, abandoned: bool = False) -> None:
        """End a request early (its final event says cancelled); `abandoned`: its client went away."""

    def status(self, nonce: int) -> Status:
        """The answer to a StatusQuery."""


@dataclass
class Outbox:
    """One destination's events not yet sent: a client on the ROUTER (`events_to` None) or an events endpoint."""

    client: bytes | None  # the ROUTER client events go to, when not direct
    events_to: str | None
    submitters: dict[str, bytes] = field(default_factory=dict)  # request id -> its submitter, while it is open
    pending: dict[str, list[TokenEvents]] = field(default_factory=dict)  # request id -> events since the last send
    sent: dict[str, int] = field(default_factory=dict)  # request id -> tokens pushed to events_to
    failed: set[str] = field(default_factory=set)  # requests whose events overflowed: the rest are dropped
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def put(self, request_id: str, event: TokenEvents) -> None:
        if request_id in self.failed:
            if event.final:
                self.failed.discard(request_id)
                self.submitters.pop(request_id, None)
                self.wake.set()  # its sender may have nothing else to wait for
            return
        self.pending.setdefault(request_id, []).append(event)
        self.wake.set()

    def take(self) -> list[TokenEvents]:
        """One event per request with events waiting (merged), and forget requests that end with them."""
        pending, self.pending = self.pending, {}
        self.wake.clear()
        return [merge_events(events) for events in pending.values()]


class RequestEndpoint:
    def __init__(self, stage0: Stage0, sinks: EventSinks, log: Any, *,
                 events_to_overflow: Callable[[], None] | None = None) -> None:
        """`events_to_overflow`: counts each direct event message refused (the driver's observer's counter)."""
        self.stage0 = stage0
        self.sinks = sinks
        self.log = log
        self.outboxes: dict[bytes | str, Outbox] = {}
        self.senders: set[asyncio.Task[None]] = set()  # one per outbox with open requests
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
            self._route(router, client, handle, msg.events_to if usable(msg.events_to) else None)
        elif isinstance(msg, Cancel):
            self.stage0.cancel(msg.request_id, msg.abandoned)
        elif isinstance(msg, StatusQuery):
            await router.send(client, self.stage0.status(msg.nonce))
        else:
            self.log.warning("bad_request", detail=str(msg)[:200])

    def _route(self, router: RouterQueue, client: bytes, handle: RequestHandle, events_to: str | None) -> None:
        """Hand the request's events to its destination's outbox (started when it has no sender yet)."""
        rid = handle.request_id
        if events_to is not None:
            try:
                self.sinks.attach(events_to)
            except SinkRefused as exc:  # no socket there: everything goes to the submitter instead
                self.log.warning("events_to_refused", request_id=rid, events_to=events_to, error=str(exc))
                events_to = None
        key: bytes | str = events_to if events_to is not None else client
        box = self.outboxes.get(key)
        if box is None:
            box = self.outboxes[key] = Outbox(None if events_to else client, events_to)
            task = asyncio.get_running_loop().create_task(self._send_loop(router, key, box))
            self.senders.add(task)
            task.add_done_callback(self._sender_done)
        box.submitters[rid] = client
        handle.forward(lambda event: box.put(rid, event))

    def _sender_done(self, task: asyncio.Task[None]) -> None:
        self.senders.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.log.error("event_sender_failed", error=repr(task.exception()))

    async def _send_loop(self, router: RouterQueue, key: bytes | str, box: Outbox) -> None:
        """Send the box's events each time it wakes, until no request is open there."""
        try:
            while box.submitters:
                await box.wake.wait()
                events = box.take()
                if not events:
                    continue
                if box.client is not None:
                    await router.send(box.client, event_message(events))
                else:
                    await self._send_direct(router, box, events)
                for event in events:
                    if event.final:
                        box.submitters.pop(event.request_id, None)
        finally:
            self.outboxes.pop(key, None)
            for rid in box.submitters:  # a stop cut them short
                self._detach(box, rid)

    async def _send_direct(self, router: RouterQueue, box: Outbox, events: list[TokenEvents]) -> None:
        assert box.events_to is not None
        if await self.sinks.send(box.events_to, event_message(events)):
            self.overflows.ok(box.events_to, events_to=box.events_to)
            copies: dict[bytes, list[TokenEvents]] = {}
            for event in events:
                sent = box.sent[event.request_id] = box.sent.get(event.request_id, 0) + len(event.tokens)
                if event.final:
                    copies.setdefault(box.submitters[event.request_id], []).append(submitter_copy(event, sent))
                    self._detach(box, event.request_id)
            for client, finals in copies.items():
                await router.send(client, event_message(finals))
            return
        for event in events:
            await self._overflowed(router, box, event)

    def _detach(self, box: Outbox, rid: str) -> None:
        box.sent.pop(rid, None)
        if box.events_to is not None:
            self.sinks.detach(box.events_to)

    async def _overflowed(self, router: RouterQueue, box: Outbox, msg: TokenEvents) -> None:
        """The client's event socket refused `msg`: fail its request through its submitter."""
        assert box.events_to is not None
        rid, events_to, queued = msg.request_id, box.events_to, self.sinks.max_queued
        self.overflows.refused(events_to, events_to=events_to, request_id=rid, max_queued=queued)
        client = box.submitters[rid]
        if msg.finish_reason is None:
            box.failed.add(rid)  # its cancel's final event ends it here
            self.stage0.cancel(rid)
        self._detach(box, rid)
        error = (f"token events overflowed: the client at {events_to} is not reading them ({queued} queued at stage 0 "
                 f"for {self.sinks.patience_s:g} s)")
        await router.send(client, TokenEvents(rid, (), FinishReason.ERROR, error, ErrorCode.SLOW_CLIENT, stats=msg.stats))
