"""Generation admission: execution permits and a bounded FIFO wait queue (pure asyncio, no ZeroMQ).

`AdmissionQueue.acquire` returns a `Permit` at once when one is free and nobody is waiting;
otherwise the caller joins a FIFO queue of at most `capacity` waiters (`QueueFull` when it is
full) and waits up to `timeout_s` (`AdmissionTimeout`; 0 = until cancelled).  A freed permit is
handed straight to the oldest waiter, so a later arrival can never overtake a queued one, even
when a permit frees up in the same instant.  Cancelling a waiter frees its slot (and gives back a
permit it was handed but had not yet taken).  `concurrency` may be changed at any time (adaptive
control, pipelines coming and going): raising it admits waiters at once, lowering it retires
permits as their holders release them.  `AdaptiveConcurrency` (re-exported here) drives it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from brokers.adaptive import AdaptiveConcurrency

__all__ = ["AdaptiveConcurrency", "AdmissionError", "AdmissionQueue", "AdmissionTimeout", "Permit", "QueueFull"]


class AdmissionError(Exception):
    """A request was not admitted; ``code`` is the TokenEvents error code, ``str()`` a one-line reason."""

    code = "unavailable"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class QueueFull(AdmissionError):
    code = "queue_full"

    def __init__(self, capacity: int) -> None:
        super().__init__(f"generation queue full (capacity {capacity}); retry later")
        self.capacity = capacity


class AdmissionTimeout(AdmissionError):
    code = "admission_timeout"

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"waited {timeout_s:g} s for a generation slot")
        self.timeout_s = timeout_s


class Permit:
    """One execution slot; `release()` gives it back (idempotent)."""

    def __init__(self, queue: AdmissionQueue, request_id: str) -> None:
        self._queue = queue
        self.request_id = request_id
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._queue._on_release()

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(eq=False)
class _Waiter:
    request_id: str
    future: asyncio.Future[Permit] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class AdmissionQueue:
    """`concurrency` permits (0 pauses admission), `capacity` waiters, FIFO, `timeout_s` wait limit."""

    def __init__(self, concurrency: int, capacity: int, timeout_s: float = 0.0) -> None:
        if concurrency < 0:
            raise ValueError(f"concurrency must be >= 0, got {concurrency}")
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
        self._concurrency = concurrency
        self.capacity = capacity
        self.timeout_s = timeout_s
        self._running = 0
        self._waiters: deque[_Waiter] = deque()

    @property
    def running(self) -> int:
        """Permits held (may exceed `concurrency` right after it was lowered)."""
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def concurrency(self) -> int:
        return self._concurrency

    @concurrency.setter
    def concurrency(self, value: int) -> None:
        if value < 0:
            raise ValueError(f"concurrency must be >= 0, got {value}")
        self._concurrency = value
        self._grant()

    async def acquire(self, request_id: str) -> Permit:
        """A permit for `request_id`, now or after waiting its turn; see the module docstring."""
        if not self._waiters and self._running < self._concurrency:
            self._running += 1
            return Permit(self, request_id)
        if len(self._waiters) >= self.capacity:
            raise QueueFull(self.capacity)
        waiter = _Waiter(request_id)
        self._waiters.append(waiter)
        try:
            if self.timeout_s > 0:
                async with asyncio.timeout(self.timeout_s):
                    return await waiter.future
            return await waiter.future
        except TimeoutError:
            if self._granted(waiter):  # handed a permit in the same instant the deadline passed: keep it
                return waiter.future.result()
            raise AdmissionTimeout(self.timeout_s) from None
        except asyncio.CancelledError:
            if self._granted(waiter):
                waiter.future.result().release()
            raise
        finally:
            if waiter in self._waiters:  # timed out, cancelled or rejected: free the slot
                self._waiters.remove(waiter)

    def reject_waiters(self, error: AdmissionError) -> int:
        """Fail every queued request with `error` (e.g. no pipeline left); returns how many."""
        waiters, self._waiters = list(self._waiters), deque()
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_exception(error)
        return len(waiters)

    @staticmethod
    def _granted(waiter: _Waiter) -> bool:
        future = waiter.future
        return future.done() and not future.cancelled() and future.exception() is None

    def _on_release(self) -> None:
        self._running -= 1
        self._grant()

    def _grant(self) -> None:
        """Hand free permits to the oldest waiters (counted as running from this moment)."""
        while self._waiters and self._running < self._concurrency:
            waiter = self._waiters.popleft()
            if waiter.future.done():  # its task was cancelled and has not run its cleanup yet
                continue
            self._running += 1
            waiter.future.set_result(Permit(self, waiter.request_id))
