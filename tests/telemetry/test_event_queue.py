"""The telemetry event queue never blocks its caller: a full queue drops and counts, a stalled or failing
sink holds up only the export thread, failed batches are retried from a bounded buffer."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from skippy.telemetry.events import EventQueue, SpanEvent

WAIT_S = 30.0  # bound on every wait for the export thread


class GateSink:
    """A sink whose exports wait at a gate until the test opens it; records what it was sent."""

    def __init__(self, results: Sequence[bool] = ()) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()  # an export has started (and waits at the gate)
        self.results = list(results)  # what the first exports return (then True)
        self.batches: list[list[SpanEvent]] = []
        self.calls = 0
        self.shut = False
        self._changed = threading.Condition()

    def export(self, events: Sequence[SpanEvent], counters: Mapping[str, int]) -> bool:
        self.entered.set()
        assert self.gate.wait(WAIT_S)
        with self._changed:
            self.calls += 1
            ok = self.results.pop(0) if self.results else True
            if ok:
                self.batches.append(list(events))
            self._changed.notify_all()
        return ok

    def shutdown(self) -> None:
        self.shut = True

    def wait_sent(self, n: int) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: sum(map(len, self.batches)) >= n, WAIT_S)


def event(i: int) -> SpanEvent:
    return SpanEvent(f"e{i}", i, i + 1, {"i": i})


def test_full_queue_drops_and_counts_without_waiting() -> None:
    sink = GateSink()
    events = EventQueue(4, sink, batch_size=2)
    events.emit(event(0))
    assert sink.entered.wait(WAIT_S)  # the export thread holds event 0 and is stuck in the sink
    accepted = [events.emit(event(i)) for i in range(1, 101)]  # returns at once although nothing drains
    assert accepted == [True] * 4 + [False] * 96
    assert (events.queued, events.dropped, events.sent) == (5, 96, 0)
    sink.gate.set()  # the collector answers again: everything queued goes out, in order
    assert sink.wait_sent(5)
    assert [e.name for batch in sink.batches for e in batch] == [f"e{i}" for i in range(5)]
    events.close()
    assert events.sent == 5 and sink.shut


def test_failed_exports_are_retried_and_counted() -> None:
    sink = GateSink(results=[False, False])
    sink.gate.set()
    events = EventQueue(16, sink, backoff_s=0.0)
    for i in range(3):
        events.emit(event(i))
    assert sink.wait_sent(3)
    assert events.export_errors == 2 and events.dropped == 0
    assert [e.name for batch in sink.batches for e in batch] == ["e0", "e1", "e2"]  # nothing lost, order kept
    events.close()
    assert events.sent == 3


def test_retry_buffer_is_bounded() -> None:
    sink = GateSink(results=[False])
    events = EventQueue(64, sink, batch_size=4, retry_limit=4, backoff_s=0.0)
    events.emit(event(0))
    assert sink.entered.wait(WAIT_S)
    for i in range(1, 21):
        assert events.emit(event(i))
    sink.gate.set()  # the first export fails: events 0..3 are kept for retry, later ones beyond the buffer drop
    events.close(timeout_s=WAIT_S)
    assert events.export_errors == 1
    assert events.sent + events.dropped == 21 and events.dropped > 0


def test_close_flushes_what_is_queued() -> None:
    sink = GateSink()
    sink.gate.set()
    events = EventQueue(1024, sink, batch_size=128)
    for i in range(300):
        events.emit(event(i))
    events.close(timeout_s=WAIT_S)
    assert events.sent == 300 and sum(map(len, sink.batches)) == 300
