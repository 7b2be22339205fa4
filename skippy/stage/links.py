"""The sending side of a link to the next stage: reply credits and an ordered, wire-conditioned sender.

`ReplyCredits` bounds how many messages may be un-credited toward a downstream (backpressure you
can count). `DownstreamLink` sends every message in FIFO order through one task; a message waits
until `enqueued_at + delay` (so frames in flight overlap like a pipe) and then `bytes / (mbps x
125000)` seconds (serialisation), then goes out. `send()` returns once the message is on the
socket; `enqueue()` returns at once (async forward) and failures surface on the next call.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass
from typing import Any

import zmq.asyncio

from skippy.config import ConfigError, WireCondition
from skippy.protocol import Message, SetWire, encode
from skippy.transport import PushQueue


@dataclass
class CreditStats:
    limit: int
    outstanding: int = 0
    max_outstanding: int = 0
    waits: int = 0
    wait_ms: float = 0.0
    granted: int = 0


class ReplyCredits:
    """At most `limit` un-credited messages toward one downstream."""

    def __init__(self, limit: int) -> None:
        self.stats = CreditStats(limit=max(1, limit))
        self._changed = asyncio.Condition()

    async def acquire(self) -> float:
        """Take a credit, waiting while none is free; returns the wait in ms."""
        start = time.perf_counter()
        async with self._changed:
            if self.stats.outstanding >= self.stats.limit:
                self.stats.waits += 1
                await self._changed.wait_for(lambda: self.stats.outstanding < self.stats.limit)
            self.stats.outstanding += 1
            self.stats.max_outstanding = max(self.stats.max_outstanding, self.stats.outstanding)
        waited = (time.perf_counter() - start) * 1e3
        self.stats.wait_ms += waited
        return waited

    async def release(self) -> None:
        async with self._changed:
            if self.stats.outstanding > 0:
                self.stats.outstanding -= 1
                self.stats.granted += 1
            self._changed.notify_all()

    async def reset(self) -> None:
        """Forget outstanding credits (the downstream restarted or was re-greeted)."""
        async with self._changed:
            self.stats.outstanding = 0
            self._changed.notify_all()


class DownstreamLink:
    """Ordered sends to one peer with the wire condition applied; owns its PushQueue."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, wire: WireCondition | None = None) -> None:
        self.endpoint = endpoint
        self.wire = wire or WireCondition()
        self.queue = PushQueue(ctx, endpoint)
        self._jobs: asyncio.Queue[tuple[float, Message, asyncio.Future[float]]] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._pump())
        self._failure: BaseException | None = None
        self._last: asyncio.Future[float] | None = None
        self.bytes_sent = 0

    def enqueue(self, msg: Message) -> asyncio.Future[float]:
        """Queue a message; the future resolves to the send time in ms once it is on the socket."""
        if self._failure is not None:
            raise RuntimeError(f"sending to {self.endpoint} failed earlier: {self._failure}")
        done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._jobs.put_nowait((time.monotonic(), msg, done))
        self._last = done
        return done

    async def send(self, msg: Message) -> float:
        return await self.enqueue(msg)

    async def _pump(self) -> None:
        while True:
            enqueued_at, msg, done = await self._jobs.get()
            try:
                frames = encode(msg)
                nbytes = sum(len(f) for f in frames)
                delay = enqueued_at + self.wire.propagation_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                serialise = self.wire.serialization_s(nbytes)
                if serialise > 0:
                    await asyncio.sleep(serialise)
                start = time.perf_counter()
                self.bytes_sent += await self.queue.send_frames(frames)
                if not done.done():
                    done.set_result((time.perf_counter() - start) * 1e3)
            except Exception as exc:  # noqa: BLE001 - surfaced to the caller through the future
                self._failure = exc
                if not done.done():
                    done.set_exception(exc)

    async def drain(self) -> None:
        """Wait until everything queued so far is on the socket."""
        if self._last is not None:
            await asyncio.shield(self._last)

    def close(self) -> None:
        self._task.cancel()
        self.queue.close()


def stop_on_signals(stopped: asyncio.Event) -> None:
    """SIGTERM/SIGINT set `stopped`; call `ignore_signals` when shutdown starts so a second one cannot
    kill the process halfway through closing (the launcher escalates to SIGKILL if it hangs)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)


def ignore_signals() -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
        signal.signal(sig, signal.SIG_IGN)


def apply_wire(link: DownstreamLink | None, msg: SetWire, log: Any) -> None:
    """Change a running link's wire condition (scripts/wire-delay); bad values are logged, not applied."""
    if link is None:
        log.warning("wire_ignored", error="this stage has no downstream link")
        return
    try:
        link.wire = WireCondition(delay_ms=msg.delay_ms, mbps=msg.mbps)
    except (ConfigError, ValueError) as exc:
        log.warning("wire_refused", error=str(exc))
        return
    log.info("wire_changed", downstream=link.endpoint, delay_ms=msg.delay_ms, mbps=msg.mbps)
