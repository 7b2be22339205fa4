"""The bounded, non-blocking telemetry event queue and the thread that drains it to a sink.

The hot path only ever calls `EventQueue.emit`, which puts the event on a bounded queue without
waiting: when the queue is full (`--telemetry-queue-capacity`, default 1024) the event is dropped
and counted. One background thread takes up to `batch_size` (128) events at a time and hands them
to the sink (the OTLP exporter). A failed export keeps its events in a retry buffer of at most
`retry_limit` (8192; overflow is dropped and counted), and the thread backs off `backoff_s`
(100 ms) before trying again; a stalled collector therefore holds up only this thread, the queue
fills, and later events are dropped, never waited for. Counters (queued, sent, dropped,
export_errors) each have a single writer, so reading them from any thread is safe.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["AttrValue", "EventQueue", "Sink", "SpanEvent"]

AttrValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]


@dataclass(frozen=True)
class SpanEvent:
    """One finished span: wall-clock start and end in ns since the epoch, attributes, and the request
    it belongs to (spans of one request share a trace in every process)."""

    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, AttrValue] = field(default_factory=dict)
    request_id: str | None = None


class Sink(Protocol):
    def export(self, events: Sequence[SpanEvent], counters: Mapping[str, int]) -> bool:
        """Send a batch (`counters`: the queue's counters so far); False when it failed."""

    def shutdown(self) -> None:
        """Stop any export in progress as soon as possible."""


class EventQueue:
    def __init__(self, capacity: int, sink: Sink, *, batch_size: int = 128, retry_limit: int = 8192,
                 backoff_s: float = 0.1) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.sink = sink
        self.batch_size = batch_size
        self.retry_limit = max(retry_limit, batch_size)
        self.backoff_s = backoff_s
        self._queue: queue.Queue[SpanEvent | None] = queue.Queue(capacity)
        self._stop = threading.Event()
        self.queued = 0  # accepted by emit (writer: the emitting thread)
        self._dropped_full = 0  # refused by emit, queue full (writer: the emitting thread)
        self._dropped_retry = 0  # retry buffer overflow (writer: the drain thread)
        self.sent = 0  # exported (writer: the drain thread)
        self.export_errors = 0  # failed exports (writer: the drain thread)
        self._thread = threading.Thread(target=self._drain, name="telemetry-export", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        return self._dropped_full + self._dropped_retry

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def counters(self) -> dict[str, int]:
        return {"queued": self.queued, "sent": self.sent, "dropped": self.dropped, "export_errors": self.export_errors}

    def emit(self, event: SpanEvent) -> bool:
        """Queue `event` without blocking; False (and counted as dropped) when the queue is full."""
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self._dropped_full += 1
            return False
        self.queued += 1
        return True

    def _take(self, pending: deque[SpanEvent], wait: bool) -> None:
        """Move queued events into `pending` (waiting for the first one when `wait`), bounded by the retry limit."""
        try:
            event = self._queue.get(timeout=0.2) if wait else self._queue.get_nowait()
            while True:
                if event is not None:
                    if len(pending) >= self.retry_limit:
                        self._dropped_retry += 1
                    else:
                        pending.append(event)
                if len(pending) >= self.batch_size and not self._stop.is_set():
                    return
                event = self._queue.get_nowait()
        except queue.Empty:
            return

    def _drain(self) -> None:
        pending: deque[SpanEvent] = deque()
        while True:
            stopping = self._stop.is_set()
            self._take(pending, wait=not pending and not stopping)
            if not pending:
                if stopping:
                    return
                continue
            batch = [pending[i] for i in range(min(self.batch_size, len(pending)))]
            if self.sink.export(batch, self.counters()):
                self.sent += len(batch)
                for _ in batch:
                    pending.popleft()
            else:
                self.export_errors += 1
                if stopping:  # closing: what could not be sent is dropped
                    self._dropped_retry += len(pending)
                    return
                self._stop.wait(self.backoff_s)

    def close(self, timeout_s: float = 1.0) -> None:
        """Export what is queued (bounded by `timeout_s`), then stop; a stalled export is abandoned."""
        self._stop.set()
        try:
            self._queue.put_nowait(None)  # wake the drain thread
        except queue.Full:
            pass
        self._thread.join(timeout_s)
        self.sink.shutdown()
