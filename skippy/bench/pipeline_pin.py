"""`skippy bench pipeline --pin`: micro-batches against one batch in flight, with the two stages sharing every
core and with each stage pinned to its own cores, side by side in one run.

Two pipelines run at once, each stage 1 a real `skippy stage` process and each stage 0 a driver in this
process: *shared* (stage 1 and stage 0 each use every core, as `skippy up` does by default) and *pinned*
(stage 1 started with `--cpu-affinity` on the upper half of the CPUs; this process, stage 0 and its driver,
pinned to the lower half with `skippy.cpu_pinning.pin_process` while the pinned pipeline runs). Each stage's
llama.cpp thread count is its default, one per CPU it may use. Rounds alternate shared and pinned, one
batch and two micro-batches (the driver's `max_iterations`), 16 streams each, with the wire delay on the
stage 0 -> stage 1 hop, so machine noise hits all four alike; the table reports medians over rounds.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from skippy.bench.streams import Row, pipeline_rate, random_prompts
from skippy.config import parse_serving_args
from skippy.config.cpu_sets import format_cpu_list
from skippy.cpu_pinning import pin_process
from skippy.driver.driver import Driver
from skippy.launcher import StageProcesses, write_local_topology
from skippy.protocol import SetWire
from skippy.runtime.slices import read_model_info
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime
from skippy.stage.links import apply_wire

__all__ = ["pin_rows"]


@asynccontextmanager
async def _driver(topology: Path, config: Path, delay_ms: float) -> AsyncIterator[Driver]:
    """Stage 0 of `topology` in this process (its thread count follows this process's CPUs now)."""
    options = parse_serving_args(["--config", str(config), "--topology", str(topology), "--max-inflight", "4"])
    runtime = StageRuntime(RuntimeSpec.from_stage_config(options.config))
    driver = Driver(options, runtime)
    await driver.start()
    try:
        apply_wire(driver.downstream, SetWire(delay_ms), driver.log)
        yield driver
    finally:
        await driver.close()
        runtime.close()


async def pin_rows(model: Path, split: int, tokens: int, delay_ms: float, rounds: int) -> tuple[str, list[Row]]:
    """(a line naming the CPU split, the rows): 16 streams, 1 batch vs micro-batches, shared vs pinned."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("bench pipeline --pin: needs at least 2 CPUs this process may use")
    driver_cpus, stage1_cpus = cpus[: len(cpus) // 2], cpus[len(cpus) // 2 :]
    n_layer, load_before = read_model_info(model).n_layer, os.getloadavg()[0]
    rates: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="skippy-bench-pin-") as tmp:
        d = Path(tmp)
        shared_t, shared_c = write_local_topology(d / "shared", model, n_layer, [split], lane_count=16, ctx_size=512)
        pinned_t, pinned_c = write_local_topology(d / "pinned", model, n_layer, [split], lane_count=16, ctx_size=512)
        stage_flags = ["--cpu-affinity", format_cpu_list(stage1_cpus)]
        with StageProcesses(shared_t, shared_c, d / "run-shared"), \
                StageProcesses(pinned_t, pinned_c, d / "run-pinned", stage_flags):
            async with _driver(shared_t, shared_c[0], delay_ms) as shared:
                pin_process(driver_cpus)
                try:
                    async with _driver(pinned_t, pinned_c[0], delay_ms) as pinned:
                        for _ in range(rounds):
                            for name, driver, mask in (("shared", shared, cpus), ("pinned", pinned, driver_cpus)):
                                pin_process(mask)
                                for depth in (1, 2):
                                    driver.max_iterations = depth
                                    rate, _, _ = await pipeline_rate(driver, random_prompts(16), max(8, tokens // 2))
                                    rates.setdefault((name, depth), []).append(rate)
                finally:
                    pin_process(cpus)
    med = {key: statistics.median(values) for key, values in rates.items()}
    at = f"16 concurrent tok/s, {delay_ms:g} ms"
    rows = [(f"{at}, shared cores: 1 batch vs micro-batches", med["shared", 1], med["shared", 2], "(was 0.885)"),
            (f"{at}, pinned: 1 batch vs micro-batches", med["pinned", 1], med["pinned", 2], ">= 1.15"),
            (f"{at}: shared 1 batch vs pinned micro-batches", med["shared", 1], med["pinned", 2], "> 1"),
            ]
    spread = "; ".join(f"{name} {'1 batch' if depth == 1 else 'micro'} " + "/".join(f"{r:.0f}" for r in values)
                       for (name, depth), values in rates.items())
    where = (f"pinned: stage 0 + driver on CPUs {format_cpu_list(driver_cpus)}, stage 1 on CPUs"
             f" {format_cpu_list(stage1_cpus)}; shared: both on {format_cpu_list(cpus)}; medians of {rounds} rounds"
             f"\nper round, tok/s: {spread}\nmachine shared with other work: 1-min load average"
             f" {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    return where, rows
