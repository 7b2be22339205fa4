"""AdaptiveConcurrency with an injected clock: probe, commit, rollback, cooldown, demand, limits, logs.

Windows are 10 s of the fake clock holding 4 completions each; a "saturated" queue stub has every
permit busy and waiters, an idle one has spare permits.
"""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import dataclass

from broker_helpers import Clock

from brokers.adaptive import AdaptiveConcurrency, Decision
from brokers.admission import AdmissionQueue
from skippy.log import configure_logging

WINDOW_S = 10.0


@dataclass
class QueueStub:
    concurrency: int = 0
    running: int = 0
    waiting: int = 3


def controller(queue: QueueStub | AdmissionQueue, clock: Clock, *, lo: int = 1, hi: int = 4,
               cooldown: int = 2) -> AdaptiveConcurrency:
    return AdaptiveConcurrency(queue, lo, hi, window_s=WINDOW_S, min_samples=4, cooldown_windows=cooldown, clock=clock)


def window(ctl: AdaptiveConcurrency, clock: Clock, throughput: float, latency_s: float,
           saturated: bool = True) -> Decision | None:
    """One 10 s window of 4 completions totalling `throughput` tok/s; returns the decision it closed with."""
    queue = ctl.queue
    if isinstance(queue, QueueStub):
        queue.running = queue.concurrency if saturated else 0
        queue.waiting = 3 if saturated else 0
    start, decision = clock.now, None
    for i in range(1, 5):
        clock.now = start + WINDOW_S * i / 4
        decision = ctl.record(round(throughput * WINDOW_S / 4), latency_s)
        assert decision is None or i == 4, "a window closed early"
    return decision


def test_probe_then_commit_when_throughput_rises_five_percent() -> None:
    clock, queue = Clock(), QueueStub()
    ctl = controller(queue, clock)
    assert queue.concurrency == 1
    probe = window(ctl, clock, 100.0, 1.0)
    assert probe is not None and (probe.decision, probe.old, probe.new) == ("probe", 1, 2)
    assert queue.concurrency == 2
    commit = window(ctl, clock, 105.0, 1.05)  # +5 % throughput, p95 +5 %
    assert commit is not None and (commit.decision, commit.new, commit.reason) == ("commit", 2, "throughput-improved")
    assert queue.concurrency == 2
    again = window(ctl, clock, 105.0, 1.05)  # the committed level is the new baseline: probe again
    assert again is not None and (again.decision, again.old, again.new) == ("probe", 2, 3)


def test_rollback_when_p95_rises_twenty_percent() -> None:
    clock, queue = Clock(), QueueStub()
    ctl = controller(queue, clock)
    window(ctl, clock, 100.0, 1.0)
    rollback = window(ctl, clock, 120.0, 1.2)  # more throughput, but p95 +20 %
    assert rollback is not None and (rollback.decision, rollback.old, rollback.new) == ("rollback", 2, 1)
    assert rollback.reason == "p95-latency-regression" and queue.concurrency == 1


def test_rollback_when_throughput_is_flat() -> None:
    clock, queue = Clock(), QueueStub()
    ctl = controller(queue, clock)
    window(ctl, clock, 100.0, 1.0)
    rollback = window(ctl, clock, 102.0, 1.0)  # +2 %: below the 3 % bar
    assert rollback is not None and rollback.decision == "rollback" and rollback.reason == "throughput-not-improved"
    assert queue.concurrency == 1


def test_cooldown_holds_before_the_next_probe() -> None:
    clock, queue = Clock(), QueueStub()
    ctl = controller(queue, clock, cooldown=2)
    window(ctl, clock, 100.0, 1.0)
    window(ctl, clock, 100.0, 1.0)  # rollback
    holds = [window(ctl, clock, 100.0, 1.0) for _ in range(2)]
    assert [(d.decision, d.reason) for d in holds if d] == [("hold", "cooldown")] * 2
    assert queue.concurrency == 1
    probe = window(ctl, clock, 100.0, 1.0)
    assert probe is not None and (probe.decision, probe.new) == ("probe", 2)


def test_no_probe_without_demand_and_a_probe_ends_with_demand() -> None:
    clock, queue = Clock(), QueueStub()
    ctl = controller(queue, clock)
    idle = window(ctl, clock, 100.0, 1.0, saturated=False)
    assert idle is not None and (idle.decision, idle.reason) == ("hold", "idle") and queue.concurrency == 1
    window(ctl, clock, 100.0, 1.0)  # probe
    ended = window(ctl, clock, 150.0, 1.0, saturated=False)
    assert ended is not None and (ended.decision, ended.reason) == ("rollback", "demand-ended")


def test_window_needs_its_minimum_of_completions_and_the_limit_caps_probes() -> None:
    clock, queue = Clock(), QueueStub()
    ctl = controller(queue, clock, hi=2)
    clock.now = 30.0
    assert ctl.record(1000, 1.0) is None  # long enough, but 1 of 4 completions: the window goes on
    assert ctl.record(1000, 1.0) is None and ctl.record(1000, 1.0) is None
    probe = ctl.record(1000, 1.0)
    assert probe is not None and (probe.decision, probe.new, probe.stats.throughput) == ("probe", 2, 4000 / 30)
    commit = window(ctl, clock, 140.0, 1.0)  # +5 % over the 133 tok/s baseline: commit, now at the limit
    assert commit is not None and commit.decision == "commit"
    at_limit = window(ctl, clock, 140.0, 1.0)
    assert at_limit is not None and (at_limit.decision, at_limit.reason) == ("hold", "at-limit")
    ctl.set_limit(1)  # a pipeline went away
    assert queue.concurrency == 1 and ctl.current == 1
    ctl.set_limit(0)  # none left: admission pauses, the learned level is kept for later
    assert queue.concurrency == 0 and ctl.current == 1
    ctl.set_limit(3)
    assert queue.concurrency == 1


def test_drives_a_real_admission_queue_and_logs_each_decision() -> None:
    stream = io.StringIO()
    configure_logging("summary", stream=stream, role="test")

    async def body() -> None:
        clock, queue = Clock(), AdmissionQueue(0, 16)
        ctl = controller(queue, clock)
        held = await queue.acquire("held")  # the one permit is busy at every completion: saturated
        waiter = asyncio.get_running_loop().create_task(queue.acquire("waiter"))
        await asyncio.sleep(0)  # let the waiter join the queue
        assert (queue.concurrency, queue.waiting) == (1, 1)
        for _ in range(4):
            clock.now += WINDOW_S / 4
            ctl.record(250, 1.0)
        assert queue.concurrency == 2  # the probe permit goes straight to the waiter
        (await waiter).release()
        held.release()

    asyncio.run(asyncio.wait_for(body(), 10.0))
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    decisions = [line for line in lines if line["event"] == "adaptive_concurrency"]
    assert [{k: d[k] for k in ("decision", "old", "new", "throughput", "p95")} for d in decisions] == [
        {"decision": "probe", "old": 1, "new": 2, "throughput": 100.0, "p95": 1.0}]
