"""`skippy bench speculative`: running a workload's rounds and timing them (the workloads:
skippy.bench.speculative_workloads).

A round runs 2c requests on the in-process driver, c in flight at a time (each next one submitted as one
finishes, as a pool of c clients does), and times every token event; a mode's result in one cell sums its
rounds: decode tok/s = tokens after each request's first / the summed round spans (first token of the
round's earliest request to the last token of its latest), TTFT per
request from submit to its first token, TPOT per request ((last - first) / (tokens - 1)), ITL every gap
between two tokens of a request (a verify window's tokens arrive together: gaps of ~0), end-to-end
latency from submit to the last token, and the speculation totals' change over the waves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from skippy.bench.speculative_workloads import Prompt
from skippy.driver.driver import Driver
from skippy.driver.speculative.engine import SpeculationTotals
from skippy.runtime.chain import LocalChain
from skippy.runtime.windows import SessionWindow

__all__ = ["ModeResult", "divergence_margin", "run_wave"]


@dataclass
class Timed:
    """One request of a round: its tokens and when they came."""

    tokens: list[int] = field(default_factory=list)
    submitted: float = 0.0
    first: float = 0.0
    last: float = 0.0
    times: list[float] = field(default_factory=list)  # perf_counter of every token


@dataclass
class ModeResult:
    """One mode (plain or a speculation) over the waves of one cell."""

    decode_tokens: int = 0  # tokens after each request's first
    decode_s: float = 0.0  # summed wave spans
    ttft_ms: list[float] = field(default_factory=list)
    tpot_ms: list[float] = field(default_factory=list)  # per request with >= 2 tokens
    itl_ms: list[float] = field(default_factory=list)  # every gap between two tokens of a request
    e2e_ms: list[float] = field(default_factory=list)  # per request, submit to last token
    output_tokens: int = 0
    wall_s: float = 0.0  # summed wave wall times, first submit to last token
    outputs: list[list[int]] = field(default_factory=list)  # per request, in prompt order
    totals: SpeculationTotals = field(default_factory=SpeculationTotals)  # windows etc. during this cell

    @property
    def tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def mean_ttft_ms(self) -> float:
        return sum(self.ttft_ms) / len(self.ttft_ms) if self.ttft_ms else 0.0

    def add_wave(self, wave: list[Timed], before: SpeculationTotals | None, after: SpeculationTotals | None) -> None:
        self.decode_tokens += sum(max(0, len(r.tokens) - 1) for r in wave)
        self.decode_s += max(r.last for r in wave) - min(r.first for r in wave)
        self.ttft_ms.extend((r.first - r.submitted) * 1e3 for r in wave)
        self.tpot_ms.extend((r.last - r.first) * 1e3 / (len(r.tokens) - 1) for r in wave if len(r.tokens) > 1)
        self.itl_ms.extend((b - a) * 1e3 for r in wave for a, b in zip(r.times, r.times[1:]))
        self.e2e_ms.extend((r.last - r.submitted) * 1e3 for r in wave)
        self.output_tokens += sum(len(r.tokens) for r in wave)
        self.wall_s += max(r.last for r in wave) - min(r.submitted for r in wave)
        self.outputs.extend(r.tokens for r in wave)
        if before is not None and after is not None:
            for name in ("windows", "proposed", "accepted", "full_accepts", "early_rejects", "tail_rejects"):
                setattr(self.totals, name, getattr(self.totals, name) + getattr(after, name) - getattr(before, name))


async def _consume(driver: Driver, prompt: Prompt, max_tokens: int, stop: frozenset[int]) -> Timed:
    timed = Timed(submitted=time.perf_counter())
    handle = driver.submit(prompt.tokens, max_tokens=max_tokens, stop_tokens=stop)
    async for event in handle:
        now = time.perf_counter()
        if event.final:
            if event.error is not None:
                raise RuntimeError(f"bench: {prompt.name} failed: {event.error}")
            break
        if not timed.tokens:
            timed.first = now
        timed.tokens += event.tokens
        timed.times += [now] * len(event.tokens)  # a step's tokens arrive together
        timed.last = now
    if not timed.tokens:
        raise RuntimeError(f"bench: {prompt.name} produced no token")
    return timed


async def closed_loop(request: Callable[[Prompt], Awaitable[Timed]], prompts: list[Prompt],
                      concurrency: int | None = None) -> list[Timed]:
    """`request` for every prompt, at most `concurrency` in flight (all at once when None), each next prompt
    submitted as soon as one finishes (a client pool of that size); results in prompt order."""
    gate = asyncio.Semaphore(concurrency or max(1, len(prompts)))

    async def one(prompt: Prompt) -> Timed:
        async with gate:
            return await request(prompt)
    return list(await asyncio.wait_for(asyncio.gather(*(one(p) for p in prompts)), 600))


async def run_wave(driver: Driver, prompts: list[Prompt], max_tokens: int, stop: frozenset[int],
                   concurrency: int | None = None) -> list[Timed]:
    """The prompts, `concurrency` in flight at a time (`closed_loop`); returns when every request has finished
    and its session is released."""
    wave = await closed_loop(lambda p: _consume(driver, p, max_tokens, stop), prompts, concurrency)
    for _ in range(100):  # the driver releases finished sessions on its next step; let it, before a mode switch
        if not driver.table.live():
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.01)
    return list(wave)


def divergence_margin(chain: LocalChain, prompt: list[int], plain: list[int], other: list[int]) -> float:
    """The unsplit model's top-2 logit margin where `other` first leaves `plain` (after the common prefix)."""
    i = next((j for j, (a, b) in enumerate(zip(plain, other)) if a != b), min(len(plain), len(other)))
    prefix = np.asarray([*prompt, *plain[:i]], np.int32)
    rows = chain.decode([SessionWindow(0, 0, len(prefix), (len(prefix) - 1,), prefix)])
    logits = chain.final.logits(rows[0][0])
    chain.release(0)
    low, high = np.partition(logits, -2)[-2:]
    return float(high - low)
