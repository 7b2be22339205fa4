"""`skippy bench pipeline`: the multi-process pipeline against unsplit llama.cpp, side by side in one run.

Stage 1 runs as a real process; stage 0 (the driver) runs in this process so the bench can switch
its micro-batch depth and, through SetWire, the wire delay of the running link between scenarios.
`--pin` runs only the 16-stream micro-batch comparison, stages sharing every core vs pinned to their own
cores (skippy.bench.pipeline_pin). The row type, the prompts and the driver's decode rate that both use
are in skippy.bench.streams.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path

import numpy as np
import zmq
import zmq.asyncio

from skippy.bench.floor import floor_in_child
from skippy.bench.pipeline_pin import pin_rows
from skippy.bench.streams import Row, pipeline_rate, random_prompts
from skippy.bench.timeline import recorded, timeline_table, token_segments
from skippy.config import parse_serving_args
from skippy.driver.driver import Driver
from skippy.launcher import StageProcesses, write_local_topology
from skippy.log import configure_logging
from skippy.protocol import Batch, SetWire, StageTiming, Window, decode, encode
from skippy.runtime.chain import LocalChain
from skippy.runtime.models import BENCH_MODEL, BENCH_MODEL_HELP, resolve_model_path
from skippy.runtime.slices import read_model_info
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.windows import SessionWindow
from skippy.stage.links import apply_wire


def unsplit_batch_rate(chain: LocalChain, prompts: list[list[int]], steps: int) -> float:
    """Decode tok/s of the unsplit model stepping all prompts together as one batch per step."""
    windows = [SessionWindow(i, 0, len(p), (len(p) - 1,), np.array(p, np.int32)) for i, p in enumerate(prompts)]
    rows = chain.decode(windows)
    pos = [len(p) for p in prompts]
    start = time.perf_counter()
    for _ in range(steps):
        tokens = [chain.final.sample(i, r[0]) for i, r in enumerate(rows)]
        rows = chain.decode([SessionWindow(i, pos[i], 1, (0,), np.array([t], np.int32)) for i, t in enumerate(tokens)])
        pos = [p + 1 for p in pos]
    rate = steps * len(prompts) / (time.perf_counter() - start)
    for i in range(len(prompts)):
        chain.release(i)
    return rate


async def single_stream(unsplit: LocalChain, driver: Driver, tokens: int, rounds: int
                        ) -> tuple[float, float, float, str]:
    """Alternating rounds of one stream, unsplit then pipeline: (unsplit tok/s, pipeline tok/s, pipeline ms per
    token outside the stages' compute, one token's timeline), each a median over rounds; the pipeline's rate
    is the unsplit median times the median of the rounds' ratios, so slow spells of the machine hit both
    sides of a pair alike."""
    unsplit_batch_rate(unsplit, random_prompts(1), 8)
    await pipeline_rate(driver, random_prompts(1), 8)
    pairs: list[tuple[float, float, float]] = []
    steps: list[tuple[float, ...]] = []
    for _ in range(rounds):
        u = unsplit_batch_rate(unsplit, random_prompts(1), tokens)
        with recorded(driver) as messages:
            p, tpot, compute_ms = await pipeline_rate(driver, random_prompts(1), tokens)
        steps += token_segments(messages[2:])  # after the prompt's batch and the first decode
        pairs.append((u, p, tpot - compute_ms))
    u1 = statistics.median(u for u, _, _ in pairs)
    timeline = timeline_table(steps, 1e3 / u1)
    return u1, u1 * statistics.median(p / u for u, p, _ in pairs), statistics.median(o for _, _, o in pairs), timeline


_ECHO = """
import asyncio, sys, zmq, zmq.asyncio
async def main(here, back, rounds):
    ctx = zmq.asyncio.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(here)
    push.connect(back)
    for _ in range(rounds):
        await push.send_multipart(await pull.recv_multipart())
    pull.close(0)
    push.close(1000)
    ctx.term()
asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def raw_round_trip_ms(directory: Path, n_embd: int, *, other_process: bool, rounds: int = 200) -> float:
    """A plain pyzmq (asyncio) PUSH/PULL ping-pong of one decode-sized batch message (two hops), in ms: to an
    echo in this event loop, or in another process (as a stage's hops are: each wakes another process)."""
    ctx = zmq.asyncio.Context()
    here, there = f"ipc://{directory}/raw-a", f"ipc://{directory}/raw-b"
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(here)
    push.connect(there)
    frames = encode(Batch(1, (Window(1, 10, 1, (0,)),), np.zeros((1, n_embd), np.float32),
                          (StageTiming("s", 0.0, 0.0, 0.0, 0.0),)))
    warm = 10
    if other_process:
        echo = await asyncio.create_subprocess_exec(sys.executable, "-c", _ECHO, there, here, str(rounds + warm))
        wait: Awaitable[object] = echo.wait()
    else:
        echo_in, echo_out = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        echo_in.bind(there)
        echo_out.connect(here)

        async def echo_here() -> None:
            for _ in range(rounds + warm):
                await echo_out.send_multipart(await echo_in.recv_multipart())

        wait = asyncio.get_running_loop().create_task(echo_here())
    try:
        for n in range(rounds + warm):
            if n == warm:
                start = time.perf_counter()
            await push.send_multipart(frames)
            decode(await asyncio.wait_for(pull.recv_multipart(copy=False), 30.0))
        elapsed = (time.perf_counter() - start) / rounds * 1e3
        await asyncio.wait_for(wait, 30.0)
    finally:
        if not other_process:
            echo_in.close(0)
            echo_out.close(0)
        pull.close(0)
        push.close(0)
        ctx.term()
    return elapsed


async def _ttft_ms(driver: Driver, prompt: list[int]) -> float:
    start = time.perf_counter()
    elapsed = None
    async for event in driver.submit(prompt, max_tokens=1):
        if event.tokens and elapsed is None:
            elapsed = (time.perf_counter() - start) * 1e3
    assert elapsed is not None, "no token"
    return elapsed


async def long_prompt_ttft(model: Path, split: int, delay_ms: float, rounds: int, length: int = 1500) -> tuple[float, float]:
    """Median TTFT (ms) of a `length`-token prompt over 2 stages at 0 and at `delay_ms` on the stage 0 -> 1
    hop, alternating, a fresh prompt each time (default prefill chunking: adaptive ramp)."""
    rng = np.random.default_rng(11)
    with tempfile.TemporaryDirectory(prefix="skippy-bench-ttft-") as tmp:
        d = Path(tmp)
        topology, configs = write_local_topology(d, model, read_model_info(model).n_layer, [split], lane_count=2,
                                                 ctx_size=2048)
        with StageProcesses(topology, configs, d / "run"):
            options = parse_serving_args(["--config", str(configs[0]), "--topology", str(topology)])
            runtime = StageRuntime(RuntimeSpec.from_stage_config(options.config))
            driver = Driver(options, runtime)
            await driver.start()
            try:
                await _ttft_ms(driver, rng.integers(100, 5000, 256).tolist())  # warm-up
                at: dict[float, list[float]] = {0.0: [], delay_ms: []}
                for _ in range(rounds):
                    for delay, times in at.items():
                        apply_wire(driver.downstream, SetWire(delay), driver.log)
                        times.append(await _ttft_ms(driver, rng.integers(100, 5000, length).tolist()))
                return statistics.median(at[0.0]), statistics.median(at[delay_ms])
            finally:
                await driver.close()
                runtime.close()


async def _bench(model: Path, split: int, tokens: int, delay_ms: float, threads: int | None,
                 rounds: int) -> tuple[list[Row], str]:
    n_layer = read_model_info(model).n_layer
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="skippy-bench-") as tmp:
        d = Path(tmp)
        extra: dict[str, object] | None = {"n_threads": threads} if threads else None
        topology, configs = write_local_topology(d, model, n_layer, [split], lane_count=16, ctx_size=512, extra=extra)
        unsplit = LocalChain(RuntimeSpec(model_path=model, layer_start=0, layer_end=0, lane_count=16))
        with StageProcesses(topology, configs, d / "run"):
            options = parse_serving_args(["--config", str(configs[0]), "--topology", str(topology), "--max-inflight", "4"])
            runtime = StageRuntime(RuntimeSpec.from_stage_config(options.config))
            driver = Driver(options, runtime)
            await driver.start()
            try:
                # single stream, unsplit vs 2 stages, alternating (after a warm-up of both: first decodes
                # page in weights and allocate graphs); per-token overhead vs a raw round trip
                u1, p1, overhead, timeline = await single_stream(unsplit, driver, tokens, rounds)
                rows.append((f"single-stream decode tok/s (median of {rounds} pairs)", u1, p1, ">= 0.95"))
                raw = await raw_round_trip_ms(d, runtime.n_embd, other_process=False)
                rows.append(("per-token overhead vs raw round trip, one process (ms)", raw, overhead, "<= 2x"))
                raw = await raw_round_trip_ms(d, runtime.n_embd, other_process=True)
                rows.append(("per-token overhead vs raw round trip, 2 processes (ms)", raw, overhead, "<= 2x"))
                # the floor: the same split with no skippy code between the stages (skippy.bench.floor)
                floor = (await floor_in_child(model, split, max(200, tokens)))["overhead_ms"]
                rows.append(("per-token overhead vs a bare llama.cpp + ZeroMQ pipeline (ms)", floor, overhead, "(the floor)"))
                rows.append(("bare pipeline's per-token overhead vs raw round trip (ms)", raw, floor, "(not a target)"))
                # the same cost measured against the unsplit model's whole token (which pays its own sampling and
                # Python per token too) instead of against the stages' compute timers
                rows.append(("pipeline token - unsplit token vs raw round trip, 2 processes (ms)", raw,
                             1e3 / p1 - 1e3 / u1, "(not a target)"))
                # 8 concurrent: unsplit one batch vs pipeline
                u8 = unsplit_batch_rate(unsplit, random_prompts(8), tokens)
                p8, _, _ = await pipeline_rate(driver, random_prompts(8), tokens)
                rows.append(("8 concurrent aggregate tok/s", u8, p8, ">= 0.85"))
                # wire delay on the stage0 -> stage1 hop (predictions return directly, undelayed)
                apply_wire(driver.downstream, SetWire(delay_ms), driver.log)
                _, tpot_d, compute_d = await pipeline_rate(driver, random_prompts(1), max(8, tokens // 4))
                expected = compute_d + 1 * delay_ms
                rows.append((f"TPOT with {delay_ms:g} ms/hop vs compute + 1 hop (ms)", expected, tpot_d, "within 15%"))
                driver.max_iterations = 1
                one, _, _ = await pipeline_rate(driver, random_prompts(16), max(8, tokens // 2))
                driver.max_iterations = 2
                micro, _, _ = await pipeline_rate(driver, random_prompts(16), max(8, tokens // 2))
                rows.append((f"16 concurrent tok/s, {delay_ms:g} ms: 1 batch vs micro-batches", one, micro,
                             ">= 1.15 pinned (--pin)"))
            finally:
                await driver.close()
                runtime.close()
                unsplit.close()
    ttft0, ttft_d = await long_prompt_ttft(model, split, delay_ms, max(3, rounds // 2))
    rows.append((f"TTFT 1,500-token prompt, 0 vs {delay_ms:g} ms/hop: +{ttft_d - ttft0:.0f} ms"
                 f" = {(ttft_d - ttft0) / delay_ms:.1f} hops", ttft0, ttft_d, "<= ~1 hop above"))
    return rows, timeline


def run_pipeline_bench(args: argparse.Namespace) -> int:
    configure_logging("off")
    model = resolve_model_path(args.model)
    print(f"model {model.name}, 2 stages split at {args.split} (stage 1 a separate process), one run")
    if args.pin:
        where, rows = asyncio.run(pin_rows(model, args.split, args.tokens, args.delay_ms, args.rounds))
        print(where)
        timeline = ""
    else:
        rows, timeline = asyncio.run(_bench(model, args.split, args.tokens, args.delay_ms, args.threads, args.rounds))
    width = max(52, *(len(row[0]) + 2 for row in rows))
    print(f"{'measure':<{width}}{'reference':>12}{'pipeline':>12}{'ratio':>9}  target")
    for name, ref, got, target in rows:
        print(f"{name:<{width}}{ref:>12.2f}{got:>12.2f}{got / ref:>9.3f}  {target}")
    if timeline:
        print(timeline)
    return 0


def add_to(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("pipeline", help="2-stage pipeline vs unsplit llama.cpp: overhead, tok/s, wire delay")
    p.add_argument("--model", default=BENCH_MODEL, help=BENCH_MODEL_HELP)
    p.add_argument("--split", type=int, default=9)
    p.add_argument("--tokens", type=int, default=48, help="decode tokens per request")
    p.add_argument("--delay-ms", type=float, default=20.0)
    p.add_argument("--threads", type=int, default=None, help="llama.cpp threads per stage (default: all cores)")
    p.add_argument("--pin", action="store_true", help="only 16 streams, 1 batch vs micro-batches: stages sharing every"
                   " core vs pinned to their own cores (stage 1 --cpu-affinity, this process pinned)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds of the single-stream pair and, with --pin,"
                   " of the 16-stream pair (medians reported)")
    p.set_defaults(run=run_pipeline_bench)
