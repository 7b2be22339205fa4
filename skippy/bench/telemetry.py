"""`skippy bench telemetry`: decode speed with a stalled or unreachable OTLP collector vs none, in one run.

Four copies of the same 2-stage pipeline (every stage a real process, `--telemetry-level debug`
everywhere so each batch and token emits spans) differ only in where their spans go:
- `none` and `none (again)`: no `--metrics-otlp-grpc` (nothing queued); the second measures the noise;
- `stalled`: a collector that accepts the connection and never answers (every export waits its 10 s timeout);
- `unreachable`: a port nobody listens on (every export fails).
Each round runs `--streams` concurrent requests on each pipeline in turn (each round starting with
the next one, so no pipeline always goes first), so machine noise hits them alike; the table reports
median aggregate decode tok/s per pipeline, the median of its per-round ratio to `none` and that
ratio's range, and the spans each pipeline dropped (its queue was full).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from skippy.bench.streams import random_prompts
from skippy.client import PipelineClient
from skippy.launcher import StageProcesses, write_local_topology
from skippy.request_events import RequestHandle
from skippy.runtime.models import BENCH_MODEL, BENCH_MODEL_HELP, resolve_model_path
from skippy.runtime.slices import read_model_info
from skippy.telemetry.scrape import scrape
from skippy.telemetry.targets import TARGETS_FILE, read_targets
from skippy.transport.endpoints import request_endpoint

SETUPS = ("none", "none (again)", "stalled", "unreachable")


async def decode_rate(client: PipelineClient, prompts: list[list[int]], max_tokens: int) -> float:
    """Aggregate decode tok/s of `prompts` run together: tokens after each one's first, over first to last token."""
    handles = [await client.submit(p, max_tokens=max_tokens) for p in prompts]
    firsts: list[float] = []
    last = 0.0
    counts: list[int] = []

    async def consume(handle: RequestHandle) -> None:
        nonlocal last
        n = 0
        async for event in handle:
            if event.tokens:
                n += len(event.tokens)
                if n == len(event.tokens):
                    firsts.append(time.perf_counter())
        last = max(last, time.perf_counter())
        counts.append(n)

    await asyncio.gather(*(consume(h) for h in handles))
    return sum(c - 1 for c in counts) / max(1e-9, last - min(firsts))


def collectors(stack: ExitStack) -> dict[str, str | None]:
    """Where each setup sends spans: a listening socket that never accepts, and a closed port."""
    stalled = stack.enter_context(socket.socket())
    stalled.bind(("127.0.0.1", 0))
    stalled.listen(64)  # connections complete in the kernel; nothing ever answers
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        unreachable = probe.getsockname()[1]
    return {"none": None, "none (again)": None, "stalled": f"http://127.0.0.1:{stalled.getsockname()[1]}",
            "unreachable": f"http://127.0.0.1:{unreachable}"}


def dropped(run_dir: Path) -> int:
    """Spans the pipeline's processes dropped so far (their telemetry queues were full)."""
    total = 0.0
    for _name, url in read_targets(run_dir / TARGETS_FILE):
        total += sum(s.value for s in scrape(url, timeout_s=5.0) or [] if s.name == "skippy_telemetry_events_dropped_total")
    return int(total)


Row = tuple[str, list[float], int]  # (setup, decode tok/s per round, spans dropped)


async def _bench(model: Path, split: int, streams: int, tokens: int, rounds: int, tmp: Path) -> list[Row]:
    n_layer = read_model_info(model).n_layer
    with ExitStack() as stack:
        pipelines: dict[str, tuple[PipelineClient, Path]] = {}
        for i, (setup, url) in enumerate(collectors(stack).items()):
            d = tmp / f"p{i}"
            topology, configs = write_local_topology(d, model, n_layer, [split], lane_count=max(4, streams), ctx_size=512)
            flags = ["--telemetry-level", "debug", *(["--metrics-otlp-grpc", url] if url else [])]
            stages = stack.enter_context(StageProcesses(topology, configs, d / "run", flags, include_stage0=True))
            client = PipelineClient(request_endpoint(stages.topology.first().endpoint))
            stack.callback(client.close)
            pipelines[setup] = (client, d / "run")
        prompts = random_prompts(streams)
        for client, _run in pipelines.values():  # warm-up: first-touch costs out of the rounds
            await decode_rate(client, prompts, 8)
        rates: dict[str, list[float]] = {setup: [] for setup in SETUPS}
        for r in range(rounds):
            for setup in SETUPS[r % len(SETUPS):] + SETUPS[:r % len(SETUPS)]:  # each round starts one later
                rates[setup].append(await decode_rate(pipelines[setup][0], prompts, tokens))
        return [(setup, rates[setup], dropped(run)) for setup, (_client, run) in pipelines.items()]


def run_telemetry_bench(args: argparse.Namespace) -> int:
    model = resolve_model_path(args.model)
    print(f"model {model.name}, 2 stages split at {args.split}, {args.streams} streams x {args.tokens} tokens, "
          f"--telemetry-level debug, {args.rounds} alternating rounds, one run")
    with tempfile.TemporaryDirectory(prefix="skippy-bench-telemetry-") as tmp:
        rows = asyncio.run(_bench(model, args.split, args.streams, args.tokens, args.rounds, Path(tmp)))
    base = rows[0][1]
    print(f"{'collector':<16}{'decode tok/s':>14}{'ratio':>8}  {'ratio range over rounds':<26}{'spans dropped':>14}")
    for setup, rates, lost in rows:
        per_round = [r / b for r, b in zip(rates, base)]
        print(f"{setup:<16}{statistics.median(rates):>14.2f}{statistics.median(per_round):>8.3f}  "
              f"{min(per_round):.3f} .. {max(per_round):.3f}{'':<14}{lost:>14}")
    return 0


def add_to(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("telemetry", help="decode tok/s with a stalled / unreachable OTLP collector vs none")
    p.add_argument("--model", default=BENCH_MODEL, help=BENCH_MODEL_HELP)
    p.add_argument("--split", type=int, default=9)
    p.add_argument("--streams", type=int, default=4, help="concurrent requests per measurement")
    p.add_argument("--tokens", type=int, default=48, help="decode tokens per request")
    p.add_argument("--rounds", type=int, default=5)
    p.set_defaults(run=run_telemetry_bench)
