"""Talking to stage 0 (or to a broker, which speaks the same messages) from another process.

Submit, stream token events, cancel, ask for status over a DEALER. Stage 0 serves requests on a
ROUTER next to its pipeline endpoint (`transport.request_endpoint`): for `ipc://PATH` it is
`ipc://PATH.req`, for `tcp://HOST:PORT` it is `tcp://HOST:PORT+1`; a broker serves them at its
`--bind`. The adapter uses it toward the broker, `skippy generate --topology` toward stage 0.
Unlike `Driver.submit`, `submit` here is a coroutine: it sends. With `events_endpoint` (ipc, on stage
0's host) it binds a PULL there and asks stage 0 to push token events to it directly
(skippy.driver.direct_events); stage 0's copy of a final event, sent to the submitter, is ignored.
Events there of a request this client did not submit are its predecessor's on that endpoint (an adapter
killed and restarted): nobody reads them, so the request is cancelled, once, with the endpoint as the
proof the broker asks of a client that is not the submitter (`orphans_cancelled` counts them).

A pending request never hangs on a peer that is gone: every handle still waiting gets a final error
event (code pipeline_lost, naming the peer: its client may resume it, skippy.adapter.resume) when the
DEALER's connection is lost (its monitor reports a
disconnect: the peer exited, e.g. a killed broker; whatever it held for us is lost with it), or when,
with requests pending, the peer leaves a status query unanswered for `dead_after_s` (a hung peer).
`fail_pending` does the same on demand (the adapter stopping). Each loss is one `peer_lost` line.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Sequence
from typing import Any

import zmq.asyncio

from skippy.log import get_logger
from skippy.protocol import (
    Cancel,
    ErrorCode,
    EventBatch,
    FinishReason,
    ResumePoint,
    Status,
    StatusQuery,
    Submit,
    TokenEvents,
    events_of,
)
from skippy.request_events import PipelineUnavailable, RequestHandle, split_final
from skippy.runtime.sampling import SamplingParams
from skippy.transport.queues import DealerQueue, PullQueue

WATCH_EVERY_S = 1.0  # with requests pending, the peer is asked for its status this often...
DEAD_AFTER_S = 5.0  # ...and given this long to answer before every pending request fails
MAX_ORPHANS = 4096  # orphaned requests cancelled and not yet finished that are remembered (not cancelled twice)


class PipelineClient:
    def __init__(self, endpoint: str, ctx: zmq.asyncio.Context | None = None, *,
                 events_endpoint: str | None = None, watch_every_s: float = WATCH_EVERY_S,
                 dead_after_s: float = DEAD_AFTER_S) -> None:
        self.endpoint = endpoint
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.asyncio.Context()
        self.queue = DealerQueue(self.ctx, endpoint)
        self.events = PullQueue(self.ctx, events_endpoint) if events_endpoint is not None else None
        self.handles: dict[str, RequestHandle] = {}
        self.direct_events = 0  # event messages (TokenEvents or EventBatch) that came straight from stage 0
        self.orphans_cancelled = 0  # requests of a client before us on our events endpoint, cancelled
        self._orphans: set[str] = set()  # ...and not yet finished
        self._status: dict[int, asyncio.Future[Status]] = {}
        self._nonces = itertools.count(1)
        self.watch_every_s, self.dead_after_s = watch_every_s, dead_after_s
        self.lost = 0  # times every pending request was failed because the peer was gone
        self.log: Any = get_logger(peer=endpoint)
        loop = asyncio.get_running_loop()
        self._readers = [loop.create_task(self._read()), loop.create_task(self._watch_connection()),
                         loop.create_task(self._watch_answers())]
        if self.events is not None:
            self._readers.append(loop.create_task(self._read_direct(self.events)))

    async def _read(self) -> None:
        while True:
            msg = await self.queue.recv()
            if isinstance(msg, TokenEvents | EventBatch):
                for event in events_of(msg):
                    if event.sent_direct is None:  # else stage 0's copy of a final event we have had directly
                        self._on_events(event)
            elif isinstance(msg, Status):
                future = self._status.pop(msg.nonce, None)
                if future is not None and not future.done():
                    future.set_result(msg)

    async def _read_direct(self, events: PullQueue) -> None:
        while True:
            msg = await events.recv()
            if isinstance(msg, TokenEvents | EventBatch):
                self.direct_events += 1
                for event in events_of(msg):
                    if event.request_id in self.handles:
                        self._on_events(event)
                    else:
                        await self._orphaned(event, events.endpoint)

    async def _orphaned(self, msg: TokenEvents, endpoint: str) -> None:
        rid = msg.request_id
        if msg.finish_reason is not None:
            self._orphans.discard(rid)
        elif rid not in self._orphans and len(self._orphans) < MAX_ORPHANS:
            self._orphans.add(rid)
            self.orphans_cancelled += 1
            self.log.info("orphan_cancelled", request_id=rid, events_to=endpoint)
            await self.queue.send(Cancel(rid, events_to=endpoint))

    def _on_events(self, msg: TokenEvents) -> None:
        handle = self.handles.get(msg.request_id)
        if handle is None:
            return
        for event in split_final(msg):
            handle.put(event)
        if msg.final:
            del self.handles[msg.request_id]

    def fail_pending(self, message: str, code: ErrorCode = ErrorCode.UNAVAILABLE) -> int:
        """Give every pending request its final event now: an error with `code` and `message`; how many."""
        handles, self.handles = list(self.handles.values()), {}
        for handle in handles:
            handle.put(TokenEvents(handle.request_id, (), FinishReason.ERROR, message, code))
        return len(handles)

    def _lost(self, why: str) -> None:
        failed = self.fail_pending(why, ErrorCode.PIPELINE_LOST)
        if failed:
            self.lost += 1
            self.log.warning("peer_lost", error=why, failed_requests=failed)

    async def _watch_connection(self) -> None:
        while True:
            await self.queue.disconnected()
            self._lost(f"lost the connection to {self.endpoint} (it stopped or restarted)")

    async def _watch_answers(self) -> None:
        while True:
            await asyncio.sleep(self.watch_every_s)  # the watch's period, not a synchronisation
            if not self.handles:
                continue
            try:
                await self.status(self.dead_after_s)
            except PipelineUnavailable:
                self._lost(f"{self.endpoint} did not answer a status query within {self.dead_after_s:g} s")

    async def status(self, timeout_s: float = 5.0) -> Status:
        """Ask stage 0 how the pipeline is; PipelineUnavailable if it does not answer in time."""
        nonce = next(self._nonces)
        future = self._status[nonce] = asyncio.get_running_loop().create_future()
        await self.queue.send(StatusQuery(nonce))
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            self._status.pop(nonce, None)
            raise PipelineUnavailable(f"stage 0 at {self.endpoint} did not answer within {timeout_s:g} s") from None

    async def submit(self, prompt: Sequence[int], sampling: SamplingParams | None = None, max_tokens: int = 16,
                     stop_tokens: frozenset[int] = frozenset(), request_id: str | None = None, *,
                     resume_from: ResumePoint | None = None, progress: bool = False) -> RequestHandle:
        """Send a request; `resume_from`: where a lost one resumes (skippy.protocol.Submit); `progress`:
        stage 0 also sends prompt progress reports while the prompt prefills."""
        request_id = request_id or uuid.uuid4().hex
        handle = self.handles[request_id] = RequestHandle(request_id)
        sampling_dict = (sampling or SamplingParams()).to_dict()
        await self.queue.send(Submit(request_id, tuple(int(t) for t in prompt), sampling_dict, max_tokens,
                                     tuple(sorted(stop_tokens)), self.events.endpoint if self.events else None,
                                     resume_from=resume_from, progress=progress))
        return handle

    async def cancel(self, request_id: str, abandoned: bool = False) -> None:
        """Stop a request; `abandoned`: its client went away (Cancel.abandoned)."""
        await self.queue.send(Cancel(request_id, abandoned=abandoned))

    def close(self) -> None:
        for reader in self._readers:
            reader.cancel()
        self.queue.close()
        if self.events is not None:
            self.events.close()
        if self._own_ctx:
            self.ctx.term()
