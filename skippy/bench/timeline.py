"""One decode token's time through a 2-stage pipeline, segment by segment (`skippy bench pipeline`).

Every batch carries each stage's timing back to stage 0 (`StageTiming`: when its compute began,
compute ms, when it handed the batch to its link); with one stream, one batch is in flight at a time,
so consecutive batches give the whole cycle of a token: stage 0's compute, its hand-off to the link,
the hop to stage 1 (ZeroMQ, decoding the message, dispatch), stage 1's compute and sampling, its
hand-off, and the return hop with stage 0's post-processing and scheduling up to the next compute.
Clocks are one machine's wall clock (time.time()), so cross-process differences are meaningful here.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from contextlib import contextmanager

from skippy.driver.driver import Driver
from skippy.protocol import Predictions

SEGMENTS = ("stage 0 compute (its layers)", "stage 0: compute end -> handed to the link",
            "hop to stage 1 (send, ZeroMQ, decode, dispatch)", "stage 1 compute + sampling",
            "stage 1: compute end -> handed to the socket", "return hop + stage 0 postprocess and schedule")


@contextmanager
def recorded(driver: Driver) -> Iterator[list[Predictions]]:
    """The Predictions stage 0 receives while inside the block."""
    seen: list[Predictions] = []
    original = driver.on_predictions

    def record(msg: Predictions) -> None:
        seen.append(msg)
        original(msg)

    driver.on_predictions = record  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        driver.on_predictions = original  # type: ignore[method-assign]


def token_segments(messages: list[Predictions]) -> list[tuple[float, ...]]:
    """Per decode step of one stream (single-row batches), each segment in ms (see SEGMENTS)."""
    steps = [m for m in messages if len(m.timings) == 2]
    out: list[tuple[float, ...]] = []
    for m, n in zip(steps, steps[1:]):
        s0, s1, following = m.timings[0], m.timings[1], n.timings[0]
        out.append((s0.compute_ms, (s0.sent_at - s0.recv_at) * 1e3 - s0.compute_ms, (s1.recv_at - s0.sent_at) * 1e3,
                    s1.compute_ms, (s1.sent_at - s1.recv_at) * 1e3 - s1.compute_ms, (following.recv_at - s1.sent_at) * 1e3))
    return out


def timeline_table(steps: list[tuple[float, ...]], unsplit_ms: float) -> str:
    """Median of each segment over `steps`, their sum, and the unsplit model's ms per token."""
    medians = [statistics.median(s[i] for s in steps) for i in range(len(SEGMENTS))]
    lines = [f"one token, median over {len(steps)} decode steps (ms):"]
    lines += [f"  {name:<52}{value:>8.3f}" for name, value in zip(SEGMENTS, medians)]
    compute = medians[0] + medians[3]
    lines.append(f"  {'sum: compute ' + f'{compute:.2f}' + ' + the rest ' + f'{sum(medians) - compute:.2f}':<52}"
                 f"{sum(medians):>8.3f}")
    lines.append(f"  {'unsplit model, one process (compute + sampling)':<52}{unsplit_ms:>8.3f}")
    return "\n".join(lines)
