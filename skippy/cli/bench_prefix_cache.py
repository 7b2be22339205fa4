"""`skippy bench prefix-cache`: the prefix cache on vs off, 2 stages, side by side in one run.

Two pipelines of the same model and split run at once, one with `kv_cache` lookup-record on every
stage (bounded by `--max-bytes`) and one with none. Stage 1 of each is a real process; both
drivers run in this process, each with a return relay, as in `skippy bench speculative`, so both
hops can be delayed. The pipelines take turns (one request or wave at a time on the whole machine):
turn k of a conversation runs on one side and then on the other, so noise hits both alike.

Workloads: multi-turn chat (the model's chat template; a system prompt and 10 user messages of
about 100 tokens, each reply of up to `--reply-tokens` appended, the history growing to ~1,500
tokens; every conversation on its own topic) at 0 and `--delay-ms` per hop, TTFT per turn; then
waves of short unique prompts (80-200 tokens, c=4), throughput. Memory: each stage's peak bytes of
cache entries against its cap. Table and doc: skippy.cli.bench_prefix_cache_report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq.asyncio

from skippy.cli.bench_http import DOCS
from skippy.cli.bench_prefix_cache_report import ChatTurn, write_report
from skippy.cli.bench_speculative import ReturnRelay
from skippy.cli.bench_speculative_load import Prompt, run_wave
from skippy.config import parse_serving_args
from skippy.driver.driver import Driver
from skippy.http.chat_template import ChatMessage, ChatTemplate
from skippy.launcher import StageProcesses, read_events, write_local_topology
from skippy.log import configure_logging
from skippy.protocol import SetWire
from skippy.runtime.models import resolve_model_path
from skippy.runtime.slices import read_model_info
from skippy.runtime.stage_runtime import RuntimeSpec, StageRuntime
from skippy.runtime.tokenizer import Tokenizer
from skippy.stage.links import apply_wire

SIDES = ("off", "on")
TOPICS = ("a community garden", "a small bakery", "a mountain railway", "a school science fair", "a lighthouse",
          "a city library", "a fishing village", "a music festival", "a bicycle repair shop", "a river cleanup",
          "a chess club", "a theatre workshop")
SENTENCES = ("The volunteers met on Saturday morning to plan the next steps.", "Nobody had expected the budget to be so tight.",
             "A local newspaper wrote a short article about it last week.", "The weather made everything take twice as long.",
             "Several neighbours offered to help with the heavier work.", "The old records were kept in a box in the attic.",
             "Children from the nearby school visited in the afternoon.", "The first results were better than anyone hoped.",
             "A few people raised concerns about noise and parking.", "The committee agreed to meet again next month.")


@dataclass
class Side:
    name: str
    driver: Driver
    relay: ReturnRelay
    stages: StageProcesses
    messages: list[ChatMessage] = field(default_factory=list)

    def set_delay(self, delay_ms: float) -> None:
        for link in (self.driver.downstream, self.relay.link):
            apply_wire(link, SetWire(delay_ms), self.driver.log)


@contextlib.asynccontextmanager
async def running_side(name: str, directory: Path, model: Path, split: int, lanes: int, ctx_size: int,
                       kv_cache: dict[str, Any] | None) -> AsyncIterator[Side]:
    directory.mkdir(parents=True)
    topology, configs = write_local_topology(directory, model, read_model_info(model).n_layer, [split], lane_count=lanes,
                                             ctx_size=ctx_size, topology_id=f"bench-{name}", extra={"kv_cache": kv_cache})
    driver_endpoint = f"ipc://{directory.resolve()}/stage0-driver.sock"
    stages = StageProcesses(topology, configs, directory / "run")
    with stages:
        options = parse_serving_args(["--config", str(configs[0]), "--topology", str(topology),
                                      "--bind-addr", driver_endpoint])
        assert options.topology is not None
        ctx = zmq.asyncio.Context()
        relay = ReturnRelay(ctx, options.topology.first().endpoint, driver_endpoint)
        runtime = StageRuntime(RuntimeSpec.from_stage_config(options.config))
        driver = Driver(options, runtime)
        try:
            await driver.start()
            yield Side(name, driver, relay, stages)
        finally:
            await driver.close()
            runtime.close()
            relay.close()
            ctx.term()


def user_message(topic: int, turn: int) -> str:
    rng = np.random.default_rng(1000 * topic + turn)
    body = " ".join(SENTENCES[i] for i in rng.permutation(len(SENTENCES))[:8])
    return f"Note {turn + 1} about {TOPICS[topic % len(TOPICS)]}: {body} What should we do next, briefly?"


class Bench:
    def __init__(self, sides: dict[str, Side], tokenizer: Tokenizer, template: ChatTemplate, args: argparse.Namespace):
        self.sides, self.tokenizer, self.template, self.args = sides, tokenizer, template, args
        self.stop = tokenizer.eog_tokens()
        self.rounds = 0

    def order(self) -> list[Side]:
        """Both sides, the first one alternating from round to round."""
        self.rounds += 1
        return [self.sides[s] for s in (SIDES if self.rounds % 2 else SIDES[::-1])]

    async def chat(self, topic: int, delay_ms: float) -> list[ChatTurn]:
        """One conversation on each side, turn by turn; TTFT and prompt/cached tokens per turn."""
        system = f"You are a helpful assistant planning work on {TOPICS[topic % len(TOPICS)]}. Answer briefly."
        for side in self.sides.values():
            side.messages = [ChatMessage("system", system)]
        turns = []
        for turn in range(self.args.turns):
            for side in self.order():
                side.messages.append(ChatMessage("user", user_message(topic, turn)))
                prompt = self.tokenizer.encode(self.template.apply(side.messages), add_special=True, parse_special=True)
                before = side.driver.prefix.counters["cached_tokens"]
                (timed,) = await run_wave(side.driver, [Prompt(f"{side.name}-{topic}-{turn}", prompt)],
                                          self.args.reply_tokens, self.stop)
                reply = self.tokenizer.decode([t for t in timed.tokens if t not in self.stop])
                side.messages.append(ChatMessage("assistant", reply))
                turns.append(ChatTurn(side.name, delay_ms, topic, turn, len(prompt),
                                      side.driver.prefix.counters["cached_tokens"] - before,
                                      (timed.first - timed.submitted) * 1e3))
        return turns

    async def unique(self, waves: int, concurrency: int) -> dict[str, list[float]]:
        """Waves of `concurrency` unique prompts on each side; tok/s (generated tokens / wave span) per wave."""
        rng = np.random.default_rng(7)
        rates: dict[str, list[float]] = {s: [] for s in SIDES}
        for wave in range(waves):
            texts = [f"Item {wave}-{i}: " + " ".join(SENTENCES[j] for j in rng.permutation(len(SENTENCES))[:rng.integers(4, 11)])
                     for i in range(concurrency)]
            prompts = [Prompt(f"u{wave}-{i}", self.tokenizer.encode(t)) for i, t in enumerate(texts)]
            for side in self.order():
                timed = await run_wave(side.driver, prompts, self.args.unique_tokens, frozenset())
                span = max(t.last for t in timed) - min(t.submitted for t in timed)
                rates[side.name].append(sum(len(t.tokens) for t in timed) / span)
        return rates


async def _bench(args: argparse.Namespace, model: Path, tokenizer: Tokenizer, template: ChatTemplate,
                 loads: list[float]) -> dict[str, Any]:
    kv = {"mode": "lookup-record", "max_entries": args.max_entries, "max_bytes": args.max_bytes}
    with tempfile.TemporaryDirectory(prefix="skippy-bench-prefix-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            sides = {name: await stack.enter_async_context(
                running_side(name, Path(tmp) / name, model, args.split, args.lanes, args.ctx_size,
                             kv if name == "on" else None)) for name in SIDES}
            bench = Bench(sides, tokenizer, template, args)
            await bench.unique(1, 2)  # warm-up, not counted
            turns: list[ChatTurn] = []
            for i, delay in enumerate((0.0, args.delay_ms)):
                for side in sides.values():
                    side.set_delay(delay)
                for c in range(args.conversations):
                    turns += await bench.chat(i * args.conversations + c, delay)
                    print(turns[-2].line(), turns[-1].line(), file=sys.stderr, flush=True)
                    loads.append(os.getloadavg()[0])
            for side in sides.values():
                side.set_delay(0.0)
            rates = await bench.unique(args.unique_waves, 4)
            stage0 = sides["on"].driver.runtime.prefix
            memory = {"stage0": stage0.summary() if stage0 is not None else {}, **sides["on"].driver.prefix.snapshot()}
            stages = sides["on"].stages
        memory["stage1"] = stopped_cache(stages)
    return {"turns": turns, "rates": rates, "memory": memory}


def stopped_cache(stages: StageProcesses) -> dict[str, Any]:
    """Stage 1's prefix cache summary from its `stopped` log line."""
    events = [e for e in read_events(stages.log_path("stage1")) if e.get("event") == "stopped"]
    cache = events[-1].get("prefix_cache") if events else None
    return cache if isinstance(cache, dict) else {}


def run_prefix_cache_bench(args: argparse.Namespace) -> int:
    configure_logging("off")
    model = resolve_model_path(args.model)
    tokenizer = Tokenizer(model)
    template = ChatTemplate(tokenizer.model, read_model_info(model).architecture)
    loads = [os.getloadavg()[0]]
    try:
        result = asyncio.run(_bench(args, model, tokenizer, template, loads))
    finally:
        tokenizer.close()
    facts = {"command": " ".join(["scripts/bench-prefix-cache", *sys.argv[3:]]), "model": model.name,
             "split": args.split, "lanes": args.lanes, "ctx_size": args.ctx_size, "turns": args.turns,
             "conversations": args.conversations, "reply_tokens": args.reply_tokens, "delay_ms": args.delay_ms,
             "max_entries": args.max_entries, "max_bytes": args.max_bytes, "unique_waves": args.unique_waves,
             "unique_tokens": args.unique_tokens, "load_avg_1min": [round(x, 2) for x in loads],
             "cpus": len(os.sched_getaffinity(0))}
    print(write_report(Path(args.out_dir), result, facts))
    return 0


def add_to(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("prefix-cache", help="prefix cache on vs off, 2 stages: multi-turn chat TTFT, throughput, memory")
    p.add_argument("--model", default="default")
    p.add_argument("--split", type=int, default=9)
    p.add_argument("--lanes", type=int, default=4)
    p.add_argument("--ctx-size", type=int, default=2048, help="context per lane")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--conversations", type=int, default=5, help="conversations per delay")
    p.add_argument("--reply-tokens", type=int, default=40)
    p.add_argument("--delay-ms", type=float, default=20.0, help="the delayed run's wire delay per hop (both hops)")
    p.add_argument("--max-entries", type=int, default=16)
    p.add_argument("--max-bytes", type=int, default=48 << 20, help="kv_cache.max_bytes on every stage")
    p.add_argument("--unique-waves", type=int, default=10, help="waves of 4 short unique prompts per side")
    p.add_argument("--unique-tokens", type=int, default=32)
    p.add_argument("--out-dir", default=str(DOCS), help="where bench-prefix-cache.{md,json} go")
    p.set_defaults(run=run_prefix_cache_bench)
