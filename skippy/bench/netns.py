"""`scripts/bench-netns`: benchmarks over namespace hosts (not tests), side by side in one run.

    scripts/bench-netns latency [--stages 2] [--delays 0,10,20,50] [--rounds 5] [--tokens 32]
    scripts/bench-netns pipelining [--delay-ms 20] [--streams 8] [--rounds 2]
    scripts/bench-netns dtype [--rate-mbit 10] [--prompt-tokens 2000] [--rounds 3]

Each makes its own host set (prefix ``skbench``, subnet 10.77.200), puts the default model's stages
on its hosts (one stage per host, stage 0 included, each in its namespace through the launcher),
talks to stage 0's request endpoint from this namespace, and removes everything at the end.

- latency: single-stream TPOT at each one-way delay, changed live between requests, in rounds that
  cycle through the delays; the model is TPOT(d) = TPOT(0) + hops x d with hops = number of stages
  (stage 0 -> ... -> final stage -> stage 0 per token).
- pipelining: `--streams` concurrent streams, aggregate tok/s: one batch in flight (the same stages
  announced on one host), micro-batches (one per host), and micro-batches with each stage pinned
  to its own CPU (--stage-cpus 0,1); restarts the stages for each, rounds cycle through them.
- dtype (`skippy.cli.bench_netns_dtype`): TTFT of a long prompt per `--activation-wire-dtype`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from skippy.config.serving_args import flag_owner
from skippy.driver.client import DriverClient
from skippy.launcher import StageProcesses, write_local_topology
from skippy.netns import HostSet, LinkConditions, down, netem_available, set_conditions, up
from skippy.netns.topology import place_on_hosts
from skippy.runtime.models import resolve_model_path
from skippy.runtime.slices import read_model_info
from skippy.transport import request_endpoint

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
            model = resolve_model_path("default")
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


async def timed_request(client: DriverClient, tokens: Sequence[int], max_tokens: int) -> list[float]:
    """Seconds from submit to each token's arrival (a request that takes REQUEST_TIMEOUT_S fails the bench)."""
    start = time.perf_counter()
    handle = await client.submit(tokens, max_tokens=max_tokens)
    arrivals = []
    async with asyncio.timeout(REQUEST_TIMEOUT_S):  # a stage that died leaves the request waiting
        async for event in handle:
            if event.token is not None:
                arrivals.append(time.perf_counter() - start)
            elif event.finish_reason == "error":
                raise RuntimeError(f"request failed: {event.error}")
    return arrivals


def tpot_ms(arrivals: Sequence[float]) -> float:
    return (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1) * 1e3


async def _latency(procs: StageProcesses, hosts: HostSet, delays: Sequence[float], rounds: int, tokens: int
                   ) -> dict[float, list[float]]:
    client = DriverClient(request_endpoint(procs.topology.first().endpoint))
    try:
        await client.status(timeout_s=30.0)
        await timed_request(client, prompt(32, 0), 8)  # warm up
        measured: dict[float, list[float]] = {d: [] for d in delays}
        for r in range(rounds):
            for i, delay in enumerate(delays):
                set_conditions(LinkConditions(delay_ms=delay), hosts.prefix)
                measured[delay].append(tpot_ms(await timed_request(client, prompt(32, 1 + r * 100 + i), tokens)))
        return measured
    finally:
        client.close()


def run_latency(args: argparse.Namespace) -> int:
    delays = [float(x) for x in args.delays.split(",")]
    with netns_pipeline(args.stages, LinkConditions(delay_ms=max(delays))) as (hosts, procs):
        measured = asyncio.run(_latency(procs, hosts, delays, args.rounds, args.tokens))
    hops = args.stages
    base = statistics.median(measured[delays[0]])
    print(f"{args.stages} stages on {args.stages} namespace hosts, Gemma 3 270M, emulator {hosts.emulator};"
          f" single stream, {args.tokens} tokens per request, {args.rounds} rounds cycling through the delays (medians)")
    print("| one-way delay (ms) | TPOT measured (ms) | compute + hops x delay (ms) | measured / model |"
          " added per hop, paired (ms) |")
    print("|---:|---:|---:|---:|---:|")
    for delay in delays:
        tpot = statistics.median(measured[delay])
        model = base + hops * (delay - delays[0])
        # paired within each round (the same minute of machine noise), then the median over rounds
        per_hop = statistics.median((t - t0) / hops for t, t0 in zip(measured[delay], measured[delays[0]]))
        print(f"| {delay:g} | {tpot:.1f} | {model:.1f} | {tpot / model:.3f} | {per_hop:.1f} |")
    print(f"compute = TPOT at {delays[0]:g} ms = {base:.1f} ms; hops = {hops} (stage 0 -> ... -> final stage -> stage 0)")
    return 0


async def _aggregate_rate(procs: StageProcesses, streams: int, tokens: int, seed: int) -> float:
    client = DriverClient(request_endpoint(procs.topology.first().endpoint))
    try:
        await client.status(timeout_s=30.0)
        await timed_request(client, prompt(32, 0), 4)  # warm up
        start = time.perf_counter()
        results = await asyncio.gather(*(timed_request(client, prompt(32, seed + i), tokens) for i in range(streams)))
        return sum(len(a) for a in results) / (time.perf_counter() - start)
    finally:
        client.close()


def run_pipelining(args: argparse.Namespace) -> int:
    down(PREFIX)
    hosts = up(2, LinkConditions(delay_ms=args.delay_ms), prefix=PREFIX, subnet=SUBNET, emulator=delay_emulator())
    pinned = ["--stage-cpus", "0,1"] if flag_owner("--stage-cpus") is not None and (os.cpu_count() or 1) > 1 else []
    variants: dict[str, tuple[list[str], bool]] = {  # name: (stage flags, stages announced on one host)
        "one batch in flight (stages announced on one host)": ([], True), "micro-batches, one per host": ([], False)}
    if pinned:
        variants[f"micro-batches, one per host, stages pinned to CPUs {pinned[1]}"] = (pinned, False)
    rates: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for r in range(args.rounds):
            for name, (flags, one_host) in variants.items():
                with netns_pipeline(2, hosts.conditions, lane_count=args.streams, flags=flags, one_host=one_host,
                                    hosts=hosts) as (_, procs):
                    rates[name].append(asyncio.run(_aggregate_rate(procs, args.streams, args.tokens, 1000 * r)))
    finally:
        down(PREFIX)
    print(f"2 stages on 2 namespace hosts, {args.delay_ms:g} ms one-way, emulator {hosts.emulator}; {args.streams} streams"
          f" x {args.tokens} tokens; {args.rounds} rounds alternating (medians)")
    print("| in flight | aggregate tok/s | ratio |\n|---|---:|---:|")
    first = statistics.median(next(iter(rates.values())))
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):.1f} | {statistics.median(values) / first:.2f} |")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="bench-netns", description="benchmarks over namespace hosts")
    sub = top.add_subparsers(dest="bench", required=True)
    lat = sub.add_parser("latency", help="TPOT vs compute + hops x delay at several one-way delays")
    lat.add_argument("--stages", type=int, choices=sorted(SPLITS), default=2)
    lat.add_argument("--delays", default="0,10,20,50")
    lat.add_argument("--rounds", type=int, default=5)
    lat.add_argument("--tokens", type=int, default=32)
    lat.set_defaults(run=run_latency)
    pipe = sub.add_parser("pipelining", help="micro-batches (stages pinned) vs one batch in flight")
    pipe.add_argument("--delay-ms", type=float, default=20.0)
    pipe.add_argument("--streams", type=int, default=8)
    pipe.add_argument("--tokens", type=int, default=32)
    pipe.add_argument("--rounds", type=int, default=2)
    pipe.set_defaults(run=run_pipelining)
    from skippy.cli import bench_netns_dtype

    bench_netns_dtype.add_to(sub)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    from skippy.log import configure_logging

    configure_logging("off")
    args = parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
