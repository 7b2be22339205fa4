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
- dtype (`skippy.bench.netns_dtype`): TTFT of a long prompt per `--activation-wire-dtype`.

The host set, the stages' placement and the timed request they share are in `skippy.bench.netns_pipeline`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Sequence

from skippy.bench import netns_dtype
from skippy.bench.netns_pipeline import PREFIX, SPLITS, SUBNET, delay_emulator, netns_pipeline, prompt, timed_request
from skippy.client import PipelineClient
from skippy.config.serving_args import flag_owner
from skippy.launcher import StageProcesses
from skippy.netns import HostSet, LinkConditions, down, set_conditions, up
from skippy.transport.endpoints import request_endpoint


def tpot_ms(arrivals: Sequence[float]) -> float:
    return (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1) * 1e3


async def _latency(procs: StageProcesses, hosts: HostSet, delays: Sequence[float], rounds: int, tokens: int
                   ) -> dict[float, list[float]]:
    client = PipelineClient(request_endpoint(procs.topology.first().endpoint))
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
    client = PipelineClient(request_endpoint(procs.topology.first().endpoint))
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
    netns_dtype.add_to(sub)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    from skippy.log import configure_logging

    configure_logging("off")
    args = parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
