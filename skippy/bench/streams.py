"""What `skippy bench pipeline` and its `--pin` run share: the table's row, the prompts, a driver's decode rate.

Both pipeline.py and pipeline_pin.py (and telemetry.py) import this; neither imports the other's callers.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import numpy as np

from skippy.driver.driver import Driver

Row = tuple[str, float, float, str]  # (measure, reference, pipeline, target)


def random_prompts(n: int, length: int = 32) -> list[list[int]]:
    """`n` prompts of `length` random token ids, the same ones on every call (seed 7)."""
    rng = np.random.default_rng(7)
    return [rng.integers(100, 5000, length).tolist() for _ in range(n)]


def _compute_total(driver: Driver) -> float:
    return sum(driver.stats.compute_ms.values())


async def pipeline_rate(driver: Driver, prompts: list[list[int]], max_tokens: int) -> tuple[float, float, float]:
    """(aggregate decode tok/s after the first token, mean ms per token per stream,
    stages' compute ms per decode step between the first and the last token — for one stream)."""
    handles = [driver.submit(p, max_tokens=max_tokens) for p in prompts]
    firsts: list[float] = []
    ends: list[float] = []
    counts: list[int] = []
    compute: list[float] = []

    async def consume(h):  # type: ignore[no-untyped-def]
        n, first = 0, None
        async for event in h:
            if event.tokens:
                n += len(event.tokens)
                if first is None:
                    first = time.perf_counter()
                    compute.append(_compute_total(driver))
        firsts.append(first or time.perf_counter())
        ends.append(time.perf_counter())
        counts.append(n)
        compute.append(_compute_total(driver))

    await asyncio.gather(*(consume(h) for h in handles))
    tokens = sum(c - 1 for c in counts)
    rate = tokens / (max(ends) - min(firsts))
    tpot = statistics.mean((e - f) * 1e3 / max(1, c - 1) for f, e, c in zip(firsts, ends, counts))
    return rate, tpot, (compute[-1] - compute[0]) / max(1, counts[0] - 1)
