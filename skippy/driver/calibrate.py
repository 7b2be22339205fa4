"""Calibrating the pipeline's cost of a decode with r rows (for the cost-model verify window).

Before stage 0 serves requests, it sends windows of 1..max_rows rows (logits on every row, as a
verify window has) through the real pipeline on a reserved session, and reads each stage's compute
ms from the timings the batch collects on its way. C(rows) is the median over `repeats` sweeps of
the summed compute; the wire's share (hops x delay) is measured live, not here, so a changed wire
condition does not make the table stale. The reserved session is released on every stage after.
Calibration is given the parts it drives, not the driver: the `BatchLauncher` (whose `round_trip`
hands each sweep's predictions back here rather than to the driver), the serving options, the
vocabulary size and a callable that releases sessions on every stage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np

from skippy.config import PrefillChunkOptions, ServingOptions
from skippy.driver.batches import BatchLauncher
from skippy.driver.prefill import ChunkPlanner
from skippy.driver.scheduler import PlannedWindow
from skippy.driver.sequence import Sequence
from skippy.driver.speculative.engine import Speculation
from skippy.driver.speculative.window import calibrate_cost
from skippy.log import get_logger
from skippy.request_events import RequestHandle
from skippy.runtime.sampling import SamplingParams

CALIBRATION_SESSION = 2**62  # a session id no request gets (request sessions count up from 1)

Release = Callable[[tuple[int, ...]], Awaitable[None]]  # forget these sessions on every stage


def calibration_sequence(prefill: PrefillChunkOptions) -> Sequence:
    """The reserved session's sequence, for windows that `BatchLauncher.round_trip` sends (never scheduled)."""
    return Sequence("calibration", CALIBRATION_SESSION, np.zeros(0, np.int32), SamplingParams(), 1, frozenset(),
                    ChunkPlanner(prefill), RequestHandle("calibration"))


async def calibrate_speculation(speculation: Speculation, launcher: BatchLauncher, options: ServingOptions,
                                n_vocab: int, release: Release) -> None:
    """Give the cost-model verify window its decode cost table and the pipeline's hops."""
    cost = await calibrate_rows(launcher, options.prefill, n_vocab, release, speculation.max_k + 1)
    topology = options.topology
    n_stages = len(topology.stages) if topology else 1 + (launcher.downstream is not None)
    hops = n_stages if n_stages > 1 else 0  # forward hops + the predictions' return hop
    speculation.use_cost_model(cost, hops, options.wire.delay_ms)
    get_logger().info("window_cost_calibrated", cost_ms=[round(c, 2) for c in cost[1:]], hops=hops,
                      hop_ms=options.wire.delay_ms)


async def calibrate_rows(launcher: BatchLauncher, prefill: PrefillChunkOptions, n_vocab: int, release: Release,
                         max_rows: int, repeats: int = 3, timeout_s: float = 60.0) -> list[float]:
    """[0.0, C(1), .., C(max_rows)]: ms the stages spend computing one decode of that many rows."""
    seq = calibration_sequence(prefill)
    measured: list[float] = []
    try:
        for _ in range(repeats):  # the sweep order calibrate_cost uses, measured ahead (the pipeline is async)
            for rows in range(1, max_rows + 1):
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
    return calibrate_cost(lambda _rows: next(samples), max_rows, repeats)
