"""Calibrating the pipeline's cost of a decode with r rows (for the cost-model verify window).

Before stage 0 serves requests, it sends windows of 1..max_rows rows (logits on every row, as a verify window has)
through the real pipeline on a reserved session, and reads each stage's compute ms from the timings the batch
collects on its way. C(rows) is the median over up to `repeats` sweeps of the summed compute (a sweep after the
first only while they fit in SWEEPS_BUDGET_S: one sweep of a 1.5B model on a 2-vCPU host took 5 s, three held its
stage 0 16 s from ready; served batches refine the table afterwards); the wire's share (hops x delay) is measured
live, not here, so a changed wire condition does not make the table stale. The reserved session is released on every
stage after. Calibration is given the parts it drives, not the driver: the `BatchLauncher` (whose `round_trip` hands
each sweep's predictions back here rather than to the driver), the serving options, the vocabulary size and a
callable that releases sessions on every stage.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np

from skippy.config import PrefillChunkOptions, ServingOptions
from skippy.driver.batches import BatchLauncher
from skippy.driver.prefill import ChunkPlanner
from skippy.driver.scheduler import PlannedWindow
from skippy.driver.sequence import Sequence
from skippy.driver.speculative.engine import Speculation
from skippy.driver.speculative.policy import SpeculationPolicy, window_rows
from skippy.driver.speculative.window import calibrate_cost, calibration_rows, sweep_rows
from skippy.log import get_logger
from skippy.request_events import RequestHandle
from skippy.runtime.sampling import SamplingParams

CALIBRATION_SESSION = 2**62  # a session id no request gets (request sessions count up from 1)

SWEEPS_BUDGET_S = 6.0  # startup time the sweeps may take: the first always runs, the others while they fit
BATCH_ROWS_MAX = 32  # 8 sessions' windows of 4 rows: beyond it extra rows cost about what they may win (on CPU)
Release = Callable[[tuple[int, ...]], Awaitable[None]]  # forget these sessions on every stage


def calibration_sequence(prefill: PrefillChunkOptions) -> Sequence:
    """The reserved session's sequence, for windows that `BatchLauncher.round_trip` sends (never scheduled)."""
    return Sequence("calibration", CALIBRATION_SESSION, np.zeros(0, np.int32), SamplingParams(), 1, frozenset(),
                    ChunkPlanner(prefill), RequestHandle("calibration"))


async def calibrate_speculation(speculation: Speculation, launcher: BatchLauncher, options: ServingOptions,
                                n_vocab: int, release: Release, *, lanes: int, micro_batches: int, n_batch: int) -> None:
    """Give the cost-model verify window its decode cost table, the pipeline's hops and its micro-batches in
    flight. Rows are measured 1..max_k + 1 (one session's windows), then every 8 up to what a micro-batch of
    its share of the `lanes` could hold (under the policy, SHARED_MAX_K + 1 rows a session when it holds several),
    at most BATCH_ROWS_MAX and `n_batch`."""
    sessions = -(-lanes // max(micro_batches, 1))
    # the final stage keeps the logits of the largest batch it computed resident: measure no more rows than served
    served = (window_rows(speculation.max_k, sessions) if isinstance(speculation.policy, SpeculationPolicy)
              else sessions * (speculation.max_k + 1))
    batch_rows = min(served, BATCH_ROWS_MAX, n_batch)
    cost = await calibrate_rows(launcher, options.prefill, n_vocab, release, speculation.max_k + 1,
                                extra_rows=calibration_rows(speculation.max_k + 1, batch_rows)[speculation.max_k + 1:])
    topology = options.topology
    n_stages = len(topology.stages) if topology else 1 + (launcher.downstream is not None)
    hops = n_stages if n_stages > 1 else 0  # forward hops + the predictions' return hop
    speculation.use_cost_model(cost, hops, options.wire.delay_ms, micro_batches)
    measured = [(r, round(c, 2)) for r, c in enumerate(cost) if r and c == c]  # c != c: NaN, a row count not measured
    get_logger().info("window_cost_calibrated", rows=[r for r, _ in measured], cost_ms=[c for _, c in measured],
                      hops=hops, hop_ms=options.wire.delay_ms, micro_batches=micro_batches)


async def calibrate_rows(launcher: BatchLauncher, prefill: PrefillChunkOptions, n_vocab: int, release: Release,
                         max_rows: int, repeats: int = 3, timeout_s: float = 60.0,
                         extra_rows: tuple[int, ...] | list[int] = (), budget_s: float = SWEEPS_BUDGET_S) -> list[float]:
    """[0.0, C(1), .., C(max_rows)] and C at `extra_rows` (NaN between): ms the stages spend computing one decode
    of that many rows. Up to `repeats` sweeps, a later one only while it fits in `budget_s` with those before it
    (a large model's sweep on a slow host takes seconds; the table then follows the served batches)."""
    seq = calibration_sequence(prefill)
    measured: list[float] = []
    started, done = time.monotonic(), 0
    try:
        while done < repeats and (done == 0 or (time.monotonic() - started) * (done + 1) / done <= budget_s):
            done += 1  # the sweep order calibrate_cost uses
            for rows in sweep_rows(max_rows, extra_rows):
                tokens = np.arange(rows, dtype=np.int32) % max(n_vocab, 1)
                window = PlannedWindow(seq, 0, tokens, tuple(range(rows)))
                try:
                    msg = await asyncio.wait_for(launcher.round_trip([window]), timeout_s)
                finally:
                    seq.in_flight = 0
                measured.append(sum(t.compute_ms for t in msg.timings))
    finally:
        await release((CALIBRATION_SESSION,))
    samples = iter(measured)
    return calibrate_cost(lambda _rows: next(samples), max_rows, done, extra_rows)
