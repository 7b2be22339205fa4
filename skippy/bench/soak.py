"""`skippy bench soak`: the driver's memory over many requests (it must stay flat: nothing kept per request).

A 2-stage pipeline of a tiny generated llama (stage 1 a real process, stage 0's driver in this
process) serves `--requests` short requests, `--concurrency` at a time; the driver process's RSS
is sampled every `--every` requests. Prints the samples and the growth from the first sample after
warm-up to the last.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np

from skippy.config import parse_serving_args
from skippy.driver.driver import Driver
from skippy.launcher import StageProcesses, write_local_topology
from skippy.log import configure_logging
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime
from skippy.testing.tiny_models import tiny_model_path


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _soak(d: Path, requests: int, concurrency: int, every: int, max_tokens: int) -> list[tuple[int, float, float]]:
    model = tiny_model_path("llama", d / "models")
    topology, configs = write_local_topology(d, model, 6, [3], lane_count=concurrency, ctx_size=64,
                                             extra={"n_threads": 1})
    samples: list[tuple[int, float, float]] = []
    with StageProcesses(topology, configs, d / "run"):
        options = parse_serving_args(["--config", str(configs[0]), "--topology", str(topology)])
        runtime = StageRuntime(RuntimeSpec.from_stage_config(options.config))
        driver = Driver(options, runtime)
        await driver.start()
        rng = np.random.default_rng(0)
        start = time.perf_counter()
        try:
            done = 0
            while done < requests:
                wave = min(concurrency, requests - done)
                handles = [driver.submit(rng.integers(3, 400, int(rng.integers(4, 24))).tolist(), max_tokens=max_tokens)
                           for _ in range(wave)]
                for handle in handles:
                    _, final = await handle.collect()
                    if final.finish_reason != "length":
                        raise RuntimeError(f"request ended with {final.finish_reason}: {final.error}")
                before, done = done, done + wave
                if done // every != before // every or done == requests:
                    samples.append((done, rss_mib(), time.perf_counter() - start))
                    print(f"  {done:>6} requests  RSS {samples[-1][1]:8.1f} MiB  {samples[-1][2]:7.1f} s", flush=True)
        finally:
            await driver.close()
            runtime.close()
    return samples


def run_soak(args: argparse.Namespace) -> int:
    configure_logging("off")
    print(f"soak: {args.requests} requests, {args.concurrency} at a time, {args.max_tokens} tokens each "
          "(tiny llama, 2 stages, driver in this process)")
    with tempfile.TemporaryDirectory(prefix="skippy-soak-") as tmp:
        samples = asyncio.run(_soak(Path(tmp), args.requests, args.concurrency, args.every, args.max_tokens))
    warm = samples[min(1, len(samples) - 1)]
    last = samples[-1]
    print(f"driver RSS after {warm[0]} requests {warm[1]:.1f} MiB, after {last[0]}: {last[1]:.1f} MiB "
          f"(growth {last[1] - warm[1]:+.1f} MiB over {last[0] - warm[0]} requests)")
    return 0


def add_to(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("soak", help="driver memory over many requests (must stay flat)")
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--every", type=int, default=1000, help="sample RSS every N requests")
    p.add_argument("--max-tokens", type=int, default=4)
    p.set_defaults(run=run_soak)
