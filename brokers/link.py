"""One pipeline replica as the broker sees it: a DEALER to its stage 0 request endpoint.

`PipelineLink` sends Submit / Cancel / StatusQuery and hands every TokenEvents message (the
protocol message itself, all fields) and every Status answer to the broker's callbacks.  It
remembers the latest Status and when stage 0 last answered: the pipeline is *ready* when its
Status says ready and stage 0 answered within `status_timeout_s`.  Sends are bounded, so a dead
stage 0 can never stall the broker; `reconnect()` replaces the socket, dropping whatever was
queued toward a stage 0 that stopped answering. When the connection to stage 0 drops (its process
exited: a restarted stage 0 knows nothing of the requests the old one held) `on_lost` is told at once,
however soon a new stage 0 answers again.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import zmq.asyncio

from skippy.log import get_logger
from skippy.protocol import (
    Cancel,
    EventBatch,
    Message,
    ProtocolError,
    Status,
    StatusQuery,
    Submit,
    TokenEvents,
    events_of,
)
from skippy.transport.queues import DealerQueue

__all__ = ["PipelineLink"]

SEND_TIMEOUT_S = 0.5
CLOSE_LINGER_MS = 500

OnEvents = Callable[["PipelineLink", tuple[TokenEvents, ...]], Awaitable[None]]
OnStatus = Callable[["PipelineLink"], None]
OnLost = Callable[["PipelineLink", str], None]


class PipelineLink:
    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, *, stage0_id: str | None = None,
                 on_events: OnEvents, on_status: OnStatus, status_timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, on_lost: OnLost | None = None) -> None:
        self.ctx = ctx
        self.endpoint = endpoint
        self.stage0_id = stage0_id  # named in Status.dead_stage when stage 0 itself is silent
        self.status_timeout_s = status_timeout_s
        self.clock = clock
        self.status: Status | None = None
        self.answered_at: float | None = None
        self.inflight: dict[str, Any] = {}  # request_id -> the broker's record of a request routed here
        self.log = get_logger(pipeline=endpoint)
        self._on_events = on_events
        self._on_status = on_status
        self._nonces = itertools.count(1)
        self._last_nonce = 0
        self._on_lost = on_lost
        self._queue = DealerQueue(ctx, endpoint)
        self._reader = asyncio.get_running_loop().create_task(self._read(self._queue))
        self._watcher = asyncio.get_running_loop().create_task(self._watch_lost(self._queue))

    # -- state ---------------------------------------------------------------------------------
    def answering(self) -> bool:
        return self.answered_at is not None and self.clock() - self.answered_at <= self.status_timeout_s

    def ready(self) -> bool:
        return self.answering() and self.status is not None and self.status.ready

    def dead_stage(self) -> str | None:
        """The stage that keeps this pipeline from serving (None when ready or unknown)."""
        if not self.answering():
            return self.stage0_id or f"stage 0 at {self.endpoint}"
        return None if self.status is None or self.status.ready else self.status.dead_stage

    def unavailable_reason(self) -> str:
        if not self.answering():
            return f"stage 0 at {self.endpoint} not answering"
        dead = self.status.dead_stage if self.status is not None else None
        return f"pipeline unavailable: stage {dead} is down" if dead else f"pipeline at {self.endpoint} not ready"

    # -- sending -------------------------------------------------------------------------------
    async def _send(self, msg: Message) -> bool:
        """False when stage 0 would not take the message within SEND_TIMEOUT_S."""
        try:
            await asyncio.wait_for(self._queue.send(msg), SEND_TIMEOUT_S)
        except TimeoutError:
            self.log.warning("send_timeout", kind=type(msg).__name__)
            return False
        return True

    async def poll(self) -> None:
        """Ask for a Status; the answer arrives through `on_status`."""
        self._last_nonce = next(self._nonces)
        await self._send(StatusQuery(self._last_nonce))

    async def submit(self, msg: Submit) -> bool:
        return await self._send(msg)

    async def cancel(self, request_id: str, abandoned: bool = False) -> bool:
        return await self._send(Cancel(request_id, abandoned=abandoned))

    def reconnect(self) -> None:
        """A fresh socket: messages queued toward a silent stage 0 are dropped, not delivered late."""
        self._reader.cancel()
        self._watcher.cancel()
        self._queue.close()
        self._queue = DealerQueue(self.ctx, self.endpoint)
        self._reader = asyncio.get_running_loop().create_task(self._read(self._queue))
        self._watcher = asyncio.get_running_loop().create_task(self._watch_lost(self._queue))

    def close(self, linger_ms: int = CLOSE_LINGER_MS) -> None:
        """Close; messages still queued (a last Cancel) get `linger_ms` to reach stage 0."""
        self._reader.cancel()
        self._watcher.cancel()
        self._queue.close(linger_ms)

    async def _watch_lost(self, queue: DealerQueue) -> None:
        while True:
            await queue.disconnected()
            if self.inflight:
                self.log.warning("pipeline_connection_lost", inflight=len(self.inflight))
            if self._on_lost is not None:
                self._on_lost(self, f"stage 0 at {self.endpoint} lost its connection (it stopped or restarted)")

    # -- receiving -----------------------------------------------------------------------------
    async def _read(self, queue: DealerQueue) -> None:
        while True:
            msg = await queue.recv()
            try:
                if isinstance(msg, TokenEvents | EventBatch):
                    await self._on_events(self, events_of(msg))
                else:
                    self._on_other(msg)
            except Exception:  # a bug in a callback must not silence the pipeline
                self.log.exception("dispatch_failed", kind=type(msg).__name__)

    def _on_other(self, msg: Message | ProtocolError) -> None:
        if isinstance(msg, Status):
            if 0 < msg.nonce <= self._last_nonce:  # one of ours (answers to older polls still prove life)
                self.status, self.answered_at = msg, self.clock()
                self._on_status(self)
        elif isinstance(msg, ProtocolError):
            self.log.warning("bad_message", code=msg.code, error=msg.message)
        else:
            self.log.warning("unexpected_message", kind=type(msg).__name__)
