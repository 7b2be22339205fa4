"""The sending side of a link to the next stage: credits, the wire condition, ordered sends, failures.

`DownstreamLink` owns the PUSH to the next stage and its `ReplyCredits`. Every message goes out in
FIFO order through one task; a message waits until `enqueued_at + delay` (so frames in flight
overlap like a pipe) and then `bytes / (mbps x 125000)` seconds (serialisation). `forward()` is
the one way a batch leaves a stage: take a credit, stamp this stage's timing, pack the activations
as the link's `activation_dtype` (--activation-wire-dtype), enqueue. A send that
fails is reported once through `on_failure` (the process's supervisor stops the process with that
cause); later sends raise `LinkFailed` instead of queueing toward a socket that is gone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq.asyncio

from skippy.config import ConfigError, WireCondition
from skippy.faults import fault_point
from skippy.protocol import Batch, Credit, Message, Ready, SetWire, StageTiming, Window, encode
from skippy.stage.credits import ReplyCredits
from skippy.transport.queues import PushQueue


class LinkFailed(RuntimeError):
    """A send to the downstream failed; the link takes no more messages."""


class DownstreamLink:
    """Ordered, credited, wire-conditioned sends to one peer; owns its PushQueue."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, wire: WireCondition | None = None, *,
                 max_inflight: int = 1, on_failure: Callable[[str], None] | None = None) -> None:
        self.endpoint = endpoint
        self.wire = wire or WireCondition()
        self.credits = ReplyCredits(max_inflight)
        self.queue = PushQueue(ctx, endpoint)
        self._on_failure = on_failure
        self._jobs: asyncio.Queue[tuple[float, Message, asyncio.Future[float]]] = asyncio.Queue()
        self._busy = False  # the pump is sending a message
        self._task = asyncio.get_running_loop().create_task(self._pump(), name=f"link to {endpoint}")
        self._failure: str | None = None
        self._last: asyncio.Future[float] | None = None
        self.bytes_sent = 0
        self.ready: Ready | None = None  # the peer's answer to our Hello (its prefix cache bounds)

    def enqueue(self, msg: Message) -> asyncio.Future[float]:
        """Queue a message; the future resolves to the send time in ms once it is on the socket.
        With no emulated delay or bandwidth and nothing ahead of it, it goes to the socket at once:
        the pump's turn of the event loop sat on a decode step's critical path (measured:
        docs/measurements.md, 'Link send pump')."""
        if self._failure is not None:
            raise LinkFailed(self._failure)
        done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        if not self._busy and self._jobs.empty() and self.wire.delay_ms == 0 and self.wire.mbps is None:
            self._send_now(msg, done)
        else:
            self._jobs.put_nowait((time.monotonic(), msg, done))
        self._last = done
        return done

    def _send_now(self, msg: Message, done: asyncio.Future[float]) -> None:
        start = time.perf_counter()
        try:
            sending, nbytes = self.queue.send_frames_nowait(_frames(msg))
        except Exception as exc:  # noqa: BLE001 - reported once, then every later send refuses
            self._failed_send(msg, exc, done)
            return
        if sending is None:  # on the socket already
            self.bytes_sent += nbytes
            done.set_result((time.perf_counter() - start) * 1e3)
            return

        def sent(future: asyncio.Future[Any]) -> None:
            if future.cancelled() or future.exception() is not None:
                self._failed_send(msg, future.exception() or asyncio.CancelledError(), done)
            elif not done.done():
                self.bytes_sent += nbytes
                done.set_result((time.perf_counter() - start) * 1e3)

        sending.add_done_callback(sent)

    async def send(self, msg: Message) -> float:
        return await self.enqueue(msg)

    async def forward(self, batch_id: int, windows: tuple[Window, ...], hidden: np.ndarray | None,
                      timings: tuple[StageTiming, ...], stage_id: str, recv_at: float,
                      compute_ms: float, *, missed: tuple[int, ...] = ()) -> tuple[asyncio.Future[float], float]:
        """Send a computed batch on (waiting for a credit first); returns (send future, credit wait ms).
        `missed`: sessions whose windows were dropped on the way (Batch.missed)."""
        wait_ms = await self.credits.acquire()
        return self.enqueue(self._batch(batch_id, windows, hidden, timings, stage_id, recv_at, compute_ms, wait_ms,
                                        missed)), wait_ms

    async def forward_while(self, still: Callable[[], bool], batch_id: int, windows: tuple[Window, ...],
                            hidden: np.ndarray | None, stage_id: str, recv_at: float, compute_ms: float, *,
                            missed: tuple[int, ...] = ()) -> tuple[asyncio.Future[float] | None, float]:
        """`forward` stage 0's batch unless `still()` is false once a credit is free (its sessions paused while it
        waited): then the credit goes back and nothing is sent (None)."""
        wait_ms = await self.credits.acquire()
        if not still():
            self.credits.give_back()
            return None, wait_ms
        return self.enqueue(self._batch(batch_id, windows, hidden, (), stage_id, recv_at, compute_ms, wait_ms,
                                        missed)), wait_ms

    def _batch(self, batch_id: int, windows: tuple[Window, ...], hidden: np.ndarray | None,
               timings: tuple[StageTiming, ...], stage_id: str, recv_at: float, compute_ms: float, wait_ms: float,
               missed: tuple[int, ...]) -> Batch:
        timing = StageTiming(stage_id, recv_at, compute_ms, wait_ms, time.time())
        return Batch(batch_id, windows, hidden, (*timings, timing), self.wire.activation_dtype, missed)

    async def _pump(self) -> None:
        while True:
            self._busy = False
            enqueued_at, msg, done = await self._jobs.get()
            self._busy = True
            try:
                frames = _frames(msg)
                delay = enqueued_at + self.wire.propagation_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                serialise = self.wire.serialization_s(sum(len(f) for f in frames))
                if serialise > 0:
                    await asyncio.sleep(serialise)
                start = time.perf_counter()
                self.bytes_sent += await self.queue.send_frames(frames)
                if not done.done():
                    done.set_result((time.perf_counter() - start) * 1e3)
            except Exception as exc:  # noqa: BLE001 - reported once, then every later send refuses
                self._failed_send(msg, exc, done)

    def _failed_send(self, msg: Message, exc: BaseException, done: asyncio.Future[float]) -> None:
        self._fail(f"sending {type(msg).__name__} to {self.endpoint} failed: {exc!r}")
        if not done.done():
            done.set_exception(LinkFailed(self._failure))
            done.exception()  # retrieved: the failure is reported through on_failure

    def _fail(self, cause: str) -> None:
        if self._failure is None:
            self._failure = cause
            if self._on_failure is not None:
                self._on_failure(cause)

    async def drain(self, timeout_s: float = 2.0) -> None:
        """Wait (bounded) until everything queued so far is on the socket."""
        if self._last is not None and self._failure is None:
            await asyncio.wait([asyncio.shield(self._last)], timeout=timeout_s)

    def close(self) -> None:
        self._task.cancel()
        self.queue.close()


def _frames(msg: Message) -> list[bytes | memoryview]:
    if isinstance(msg, Batch):
        fault_point("link.batch")
    return encode(msg)


async def handle_link_control(msg: Message, link: DownstreamLink | None, log: Any) -> bool:
    """Credit and SetWire are handled the same by every stage; True when `msg` was one of them."""
    if isinstance(msg, Credit):
        if link is not None:
            link.credits.release()
        return True
    if isinstance(msg, SetWire):
        apply_wire(link, msg, log)
        return True
    return False


def apply_wire(link: DownstreamLink | None, msg: SetWire, log: Any) -> None:
    """Change a running link's wire condition (scripts/wire-delay); bad values are logged, not applied.
    A `whole_chain` SetWire sets only the activation dtype and goes on down the chain, ahead of any batch
    this stage forwards after it (the final stage, with no link, is its end)."""
    if msg.whole_chain:
        if link is not None and msg.activation_dtype is not None:
            link.wire = dataclasses.replace(link.wire, activation_dtype=msg.activation_dtype)
            link.enqueue(msg)
            log.info("wire_changed", downstream=link.endpoint, activation_dtype=str(msg.activation_dtype),
                     whole_chain=True)
        return
    if link is None:
        log.warning("wire_ignored", error="this stage has no downstream link")
        return
    try:
        dtype = msg.activation_dtype or link.wire.activation_dtype
        link.wire = dataclasses.replace(link.wire, delay_ms=msg.delay_ms, mbps=msg.mbps, activation_dtype=dtype)
    except (ConfigError, ValueError) as exc:
        log.warning("wire_refused", error=str(exc))
        return
    log.info("wire_changed", downstream=link.endpoint, delay_ms=msg.delay_ms, mbps=msg.mbps,
             activation_dtype=str(link.wire.activation_dtype))
