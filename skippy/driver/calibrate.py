"""Calibrating the pipeline's cost of a decode with r rows (for the cost-model verify window).

Before stage 0 serves requests, it sends windows of 1..max_rows rows (logits on every row, as a
verify window has) through the real pipeline on a reserved session, and reads each stage's compute
ms from the timings the batch collects on its way. C(rows) is the median over `repeats` sweeps of
the summed compute; the wire's share (hops x delay) is measured live, not here, so a changed wire
condition does not make the table stale. The reserved session is released on every stage after.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import numpy as np

from skippy.driver.events import RequestHandle
from skippy.driver.prefill import ChunkPlanner
from skippy.driver.scheduler import PlannedWindow
from skippy.driver.sequence import Sequence
from skippy.driver.speculative.window import calibrate_cost
from skippy.protocol import Predictions
from skippy.runtime.sampling import SamplingParams

if TYPE_CHECKING:
    from skippy.driver.driver import Driver
    from skippy.driver.speculative.engine import Speculation

CALIBRATION_SESSION = 2**62  # a session id no request gets (request sessions count up from 1)


def _calibration_sequence(driver: Driver) -> Sequence:
    return Sequence("calibration", CALIBRATION_SESSION, np.zeros(0, np.int32), SamplingParams(), 1, frozenset(),
                    ChunkPlanner(driver.prefill), RequestHandle("calibration"))


async def calibrate_speculation(driver: Driver, speculation: Speculation) -> None:
    """Give the cost-model verify window its decode cost table and the pipeline's hops."""
    cost = await calibrate_rows(driver, speculation.max_k + 1)
    topology = driver.options.topology
    n_stages = len(topology.stages) if topology else 1 + (driver.downstream is not None)
    hops = n_stages if n_stages > 1 else 0  # forward hops + the predictions' return hop
    speculation.use_cost_model(cost, hops, driver.options.wire.delay_ms)
    driver.log.info("window_cost_calibrated", cost_ms=[round(c, 2) for c in cost[1:]], hops=hops,
                    hop_ms=driver.options.wire.delay_ms)


async def calibrate_rows(driver: Driver, max_rows: int, repeats: int = 3, timeout_s: float = 60.0) -> list[float]:
    """[0.0, C(1), .., C(max_rows)]: ms the stages spend computing one decode of that many rows."""
    seq = _calibration_sequence(driver)
    measured: list[float] = []
    try:
        for _ in range(repeats):  # the sweep order calibrate_cost uses, measured ahead (the pipeline is async)
            for rows in range(1, max_rows + 1):
                tokens = np.arange(rows, dtype=np.int32) % max(driver.runtime.n_vocab, 1)
                window = PlannedWindow(seq, 0, tokens, tuple(range(rows)))
                msg = await asyncio.wait_for(_round_trip(driver, window), timeout_s)
                measured.append(sum(t.compute_ms for t in msg.timings))
    finally:
        await driver.release_now((CALIBRATION_SESSION,))
    samples = iter(measured)
    return calibrate_cost(lambda _rows: next(samples), max_rows, repeats)


async def _round_trip(driver: Driver, window: PlannedWindow) -> Predictions:
    waiter: asyncio.Future[Predictions] = asyncio.get_running_loop().create_future()
    driver.calibration_waiter = waiter
    try:
        done = await driver.launcher.launch([window])
        if done is not None:  # a single-stage pipeline answers at once
            driver.launcher.complete(done.batch_id)
            return done
        return await waiter
    finally:
        driver.calibration_waiter = None
        window.seq.in_flight = 0
