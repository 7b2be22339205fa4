"""What the namespace-host benchmarks share (`python -m skippy.bench.netns`, netns.py and netns_dtype.py):
the host set's names, the default model's stages placed one per host, prompts and a timed request.

netns.py registers its kinds and netns_dtype's; both import this module, and this module neither.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from skippy.client import PipelineClient
from skippy.config.serving_args import flag_owner
from skippy.launcher import StageProcesses, write_local_topology
from skippy.netns import HostSet, LinkConditions, down, netem_available, up
from skippy.netns.topology import place_on_hosts
from skippy.runtime.models import BENCH_MODEL, resolve_model_path
from skippy.runtime.slices import read_model_info

PREFIX, SUBNET = "skbench", "10.77.200"
SPLITS = {2: [9], 3: [5, 13]}
REQUEST_TIMEOUT_S = 300.0


def delay_emulator() -> str:
    """netem where the kernel has it, else the userspace wire (so the delay can change live)."""
    return "netem" if netem_available() else "wire"


@contextmanager
def netns_pipeline(stages: int, conditions: LinkConditions, *, ctx_size: int = 512, lane_count: int = 4,
                   flags: Sequence[str] = (), one_host: bool = False, hosts: HostSet | None = None,
                   emulator: str | None = None) -> Iterator[tuple[HostSet, StageProcesses]]:
    """The default model over `stages` namespace hosts (made here unless `hosts` is given; `emulator`
    default: `delay_emulator()`), all stages running."""
    made = hosts is None
    if hosts is None:
        down(PREFIX)  # a previous run that was killed
        hosts = up(stages, conditions, prefix=PREFIX, subnet=SUBNET, emulator=emulator or delay_emulator())
    try:
        with tempfile.TemporaryDirectory(prefix="skippy-bench-netns-") as tmp:
            model = resolve_model_path(BENCH_MODEL)
            topology, configs = write_local_topology(Path(tmp) / "topology", model, read_model_info(model).n_layer,
                                                     SPLITS[stages], lane_count=lane_count, ctx_size=ctx_size)
            place_on_hosts(topology, configs, [address for _, address in hosts.hosts])
            if one_host:  # the driver keeps one micro-batch in flight per distinct host
                data = json.loads(topology.read_text())
                for stage in data["stages"]:
                    stage["host"] = "shared-host"
                topology.write_text(json.dumps(data))
            insecure = ["--insecure-links"] if flag_owner("--insecure-links") is not None else []
            with StageProcesses(topology, configs, Path(tmp) / "run", [*flags, *insecure], include_stage0=True) as procs:
                yield hosts, procs
    finally:
        if made:
            down(PREFIX)


def prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(100, 5000, n).tolist()


async def timed_request(client: PipelineClient, tokens: Sequence[int], max_tokens: int) -> list[float]:
    """Seconds from submit to each token's arrival (a request that takes REQUEST_TIMEOUT_S fails the bench)."""
    start = time.perf_counter()
    handle = await client.submit(tokens, max_tokens=max_tokens)
    arrivals = []
    async with asyncio.timeout(REQUEST_TIMEOUT_S):  # a stage that died leaves the request waiting
        async for event in handle:
            if event.tokens:
                arrivals += [time.perf_counter() - start] * len(event.tokens)  # a step's tokens arrive together
            elif event.finish_reason == "error":
                raise RuntimeError(f"request failed: {event.error}")
    return arrivals
