"""The requests the broker holds, each from its Submit to its final event: who may cancel one, and the one way one ends.

`HeldRequest` is the broker's record of one request: its adapter, its permit, the replica it went to and
the tokens relayed. `RequestLedger` keeps them by request id (`hold`), takes their adapters' cancels
(`cancel`) and ends each exactly once (`finish`): its final event to the adapter (unless the adapter has it
from stage 0), its permit freed (a request that completed gives `AdaptiveConcurrency` its throughput), its
outcome counted in the broker's tally, its span and its `request_done` line. Built from the broker's parts,
never from the broker.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from brokers.adaptive import AdaptiveConcurrency
from brokers.admission import Permit
from brokers.link import PipelineLink
from brokers.relay import AdapterRelay
from brokers.telemetry import BrokerTelemetry, FinishedRequest
from skippy.protocol import Cancel, ErrorCode, FinishReason, Submit, TokenEvents

__all__ = ["HeldRequest", "RequestLedger", "error_event"]


@dataclass(eq=False)
class HeldRequest:
    client: bytes
    submit: Submit
    received_at: float
    task: asyncio.Task[Any] | None = None
    permit: Permit | None = None
    link: PipelineLink | None = None
    admitted_at: float | None = None
    tokens: int = 0
    done: bool = False


def error_event(request_id: str, code: ErrorCode | str, message: str) -> TokenEvents:
    """The final event of a request refused or failed with `code`."""
    return TokenEvents(request_id, (), FinishReason.ERROR, message, ErrorCode(code))


class RequestLedger:
    def __init__(self, outcomes: Counter[str], telemetry: BrokerTelemetry, relay: AdapterRelay, log: Any,
                 clock: Callable[[], float], adaptive: Callable[[], AdaptiveConcurrency | None]) -> None:
        """`outcomes`: the broker's tally of ended requests by outcome (its telemetry reads it); `adaptive`: the
        broker's adaptive concurrency once started (None: a fixed one); `clock`: the broker's."""
        self.requests: dict[str, HeldRequest] = {}
        self.outcomes = outcomes
        self.telemetry = telemetry
        self.relay = relay
        self.log = log
        self.clock = clock
        self.adaptive = adaptive

    def hold(self, client: bytes, submit: Submit) -> HeldRequest:
        """A request taken from adapter `client`, held until its final event."""
        req = self.requests[submit.request_id] = HeldRequest(client, submit, self.clock())
        return req

    async def cancel(self, client: bytes, cancel: Cancel, links: Sequence[PipelineLink]) -> None:
        """Adapter `client` cancels a request: honoured for its submitter, or an adapter bound where its events go
        (`events_to`: one that took over a dead one's endpoint); one not held here is cancelled at every stage 0
        (`links`). One still queued leaves the queue; an abandoned one (its client went away) is logged and
        counted here while queued, else by its stage 0, which is told."""
        request_id, events_to = cancel.request_id, cancel.events_to
        req = self.requests.get(request_id)
        if req is None:  # held by a broker before this one (it died; its adapter resumes the request): every stage 0 is told
            for link in links:
                await link.cancel(request_id, cancel.abandoned)
            return
        if req.done:
            return
        if req.client != client:
            if events_to is None or events_to != req.submit.events_to:
                self.log.warning("cancel_ignored", request_id=request_id, client=client.hex(),
                                 error="not the request's submitter, nor bound where its events go")
                return
            self.log.info("orphan_cancel", request_id=request_id, client=client.hex(), events_to=events_to)
        if req.link is None:  # still queued: leave the queue (the task answers "cancelled")
            assert req.task is not None
            req.task.cancel()
            if cancel.abandoned:
                self.telemetry.abandoned.labels("queued").inc()
                self.log.info("request_abandoned", request_id=request_id, phase="queued",
                              prompt_tokens=len(req.submit.prompt), prefilled_tokens=0, generated_tokens=0,
                              queue_ms=round((self.clock() - req.received_at) * 1e3, 3))
        else:
            await req.link.cancel(request_id, cancel.abandoned)  # stage 0 answers with the final "cancelled" event

    async def finish(self, req: HeldRequest, final: TokenEvents, tell_client: bool = True) -> None:
        """Send the request's final event (once, unless the client has it from stage 0), free its permit and log it."""
        if req.done:
            return
        req.done = True
        rid = req.submit.request_id
        self.requests.pop(rid, None)
        if req.link is not None:
            req.link.inflight.pop(rid, None)
        now = self.clock()
        if req.permit is not None:
            adaptive = self.adaptive()
            if adaptive is not None and final.finish_reason in ("stop", "length") and req.admitted_at is not None:
                adaptive.record(req.tokens, now - req.admitted_at)
            req.permit.release()
        outcome = final.code if final.finish_reason == "error" and final.code else str(final.finish_reason)
        self.outcomes[outcome] += 1
        done = FinishedRequest(rid, req.received_at, req.admitted_at, now, req.tokens, req.link.endpoint if req.link else None)
        self.telemetry.finished(done, final, outcome)
        self.log.info("request_done", request_id=rid, finish_reason=final.finish_reason, code=final.code,
                      error=final.error, tokens=req.tokens, pipeline=done.pipeline, queue_ms=round(done.queue_s * 1e3, 3),
                      total_ms=round((now - req.received_at) * 1e3, 3))
        if tell_client:
            self.relay.tell_final(req.client, final)
