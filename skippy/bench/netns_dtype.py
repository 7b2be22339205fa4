"""`scripts/bench-netns dtype`: TTFT of a long prompt over a rate-limited link, per activation wire dtype.

Two namespace hosts with every host's egress limited (tbf), Gemma 3 270M split at
layer 9 (stage 0 on host 1, stage 1 on host 2). Stage 0's downstream link changes dtype live
(SetWire with `activation_dtype`, confirmed by its `wire_changed` log line before the request goes).
Rounds cycle f32, f16, q8 at each `--rate-mbit` (a comma-separated list) and then f32 with no
limit (the compute-only reference), a fresh random prompt each time (no request shares a prefix);
TTFT is from submit to the first token, the bytes are what host 1 put on the wire (its egress
qdisc's counter). The table gives medians and the ratio to f32 at the same rate.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from skippy.bench.netns_pipeline import PREFIX, netns_pipeline, prompt, timed_request
from skippy.client import PipelineClient
from skippy.launcher import StageProcesses, read_events
from skippy.netns import HostSet, LinkConditions, set_conditions
from skippy.netns.commands import run
from skippy.protocol import SetWire, WireDtype
from skippy.protocol.activations import row_bytes
from skippy.runtime.models import BENCH_MODEL, resolve_model_path
from skippy.runtime.slices import read_model_info
from skippy.stage.set_wire import send_wire
from skippy.transport.endpoints import request_endpoint


def _egress_bytes(hosts: HostSet) -> int:
    """Bytes host 1 has sent through its rate limiter so far."""
    dev = "wire0" if hosts.emulator == "wire" else "eth0"
    out = run("tc", "-s", "-n", hosts.namespace(1), "qdisc", "show", "dev", dev).stdout
    return max(int(line.split()[1]) for line in out.splitlines() if line.strip().startswith("Sent "))


async def _switch(procs: StageProcesses, dtype: WireDtype) -> None:
    """Set stage 0's activation dtype and wait until its log says so."""
    stage0 = procs.topology.first()
    seen = len([e for e in read_events(procs.log_path(stage0.stage_id)) if e.get("event") == "wire_changed"])
    await send_wire([stage0.endpoint], SetWire(0.0, None, dtype))
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        changes = [e for e in read_events(procs.log_path(stage0.stage_id)) if e.get("event") == "wire_changed"]
        if len(changes) > seen and changes[-1].get("activation_dtype") == str(dtype):
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"stage 0 did not confirm activation dtype {dtype} within 10 s")


Case = tuple[float | None, WireDtype]  # (rate limit in Mbit/s, None: none; dtype)


def _cases(rates: list[float]) -> list[Case]:
    """Every dtype at every rate, then f32 without a limit: the compute-only reference."""
    return [*((rate, dtype) for rate in rates for dtype in WireDtype), (None, WireDtype.F32)]


async def _measure(procs: StageProcesses, hosts: HostSet, cases: list[Case], prompt_tokens: int, rounds: int
                   ) -> dict[Case, list[tuple[float, int]]]:
    """Per case: (TTFT s, bytes host 1 sent) of each round."""
    client = PipelineClient(request_endpoint(procs.topology.first().endpoint))
    try:
        await client.status(timeout_s=30.0)
        await timed_request(client, prompt(64, 0), 1)  # warm up
        results: dict[Case, list[tuple[float, int]]] = {case: [] for case in cases}
        for r in range(rounds):
            for i, (rate, dtype) in enumerate(cases):
                set_conditions(LinkConditions(rate_mbit=rate), hosts.prefix)
                await _switch(procs, dtype)
                sent = _egress_bytes(hosts)
                arrivals = await timed_request(client, prompt(prompt_tokens, 1 + 100 * r + i), 1)
                results[(rate, dtype)].append((arrivals[0], _egress_bytes(hosts) - sent))
        return results
    finally:
        client.close()


def run_dtype(args: argparse.Namespace) -> int:
    rates = [float(x) for x in str(args.rate_mbit).split(",")]
    cases = _cases(rates)
    with netns_pipeline(2, LinkConditions(rate_mbit=rates[0]), ctx_size=args.prompt_tokens + 64, lane_count=2,
                        emulator="auto") as (hosts, procs):
        results = asyncio.run(_measure(procs, hosts, cases, args.prompt_tokens, args.rounds))
    n_embd = read_model_info(resolve_model_path(BENCH_MODEL)).n_embd
    print(f"2 stages on 2 namespace hosts ({PREFIX}), host egress rate-limited by tbf, emulator {hosts.emulator};"
          f" TTFT of a {args.prompt_tokens}-token prompt, {args.rounds} rounds cycling every row (medians)")
    print("| rate (Mbit/s) | --activation-wire-dtype | bytes/row | MB sent by host 1 | wire time at the rate (s) | TTFT (s) |"
          " TTFT / f32 at that rate |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for rate, dtype in cases:
        ttft = statistics.median(t for t, _ in results[(rate, dtype)])
        sent = statistics.median(b for _, b in results[(rate, dtype)])
        base = statistics.median(t for t, _ in results[(rate, WireDtype.F32)])
        mb, wire_s = (f"{sent / 1e6:.2f}", f"{sent * 8 / (rate * 1e6):.2f}") if rate else ("-", "-")
        print(f"| {f'{rate:g}' if rate else 'none (compute)'} | {dtype} | {row_bytes(dtype, n_embd)} | {mb} | {wire_s}"
              f" | {ttft:.2f} | {ttft / base:.2f} |")
    return 0


def add_to(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dtype", help="TTFT of a long prompt at a rate limit, per --activation-wire-dtype")
    p.add_argument("--rate-mbit", default="10", help="rate limit(s), comma-separated: each dtype at each")
    p.add_argument("--prompt-tokens", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.set_defaults(run=run_dtype)
