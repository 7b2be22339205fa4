"""`skippy bench prefix-cache`: the prefix cache on vs off, 2 stages, side by side in one run.

Two pipelines of the same model and split run at once, one with `kv_cache` lookup-record on every
stage (bounded by `--max-bytes`) and one with none. Both stages of each are real processes (`skippy
stage`); this process only submits requests (`PipelineClient`) and relays stage 1's messages back to
stage 0 over the wire condition, as `skippy bench speculative` does, so both hops can be delayed.
The pipelines take turns (one request or wave at a time on the whole machine): turn k of a
conversation runs on one side and right after on the other, the order alternating, so noise hits
both alike; every pair is also compared by the CPU time its two stage processes used.

Workloads: multi-turn chat (the model's chat template; a system prompt and 10 user messages of about
75 tokens, each greedy reply of up to `--reply-tokens` appended, the history growing to ~1,500
tokens; every conversation on its own topic) at 0 and `--delay-ms` per hop, TTFT per turn; then
waves of short unique prompts (80-200 tokens, c=4): throughput and CPU per token. Memory: each
stage's peak bytes of cache entries against its cap. Table and doc: skippy.bench.prefix_cache_report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq.asyncio

from skippy.adapter.chat_template import ChatMessage, ChatTemplate
from skippy.bench.http import DOCS
from skippy.bench.prefix_cache_report import ChatTurn, Wave, write_report
from skippy.bench.speculative import ReturnRelay
from skippy.client import PipelineClient
from skippy.config import WireCondition
from skippy.launcher import StageProcesses, read_events, write_local_topology
from skippy.log import configure_logging, get_logger
from skippy.protocol import SetWire
from skippy.runtime.models import BENCH_MODEL, BENCH_MODEL_HELP, resolve_model_path
from skippy.runtime.slices import read_model_info
from skippy.runtime.tokenizer import Tokenizer
from skippy.stage.links import apply_wire
from skippy.transport.endpoints import request_endpoint
from skippy.transport.queues import PushQueue

SIDES = ("off", "on")
TOPICS = ("a community garden", "a small bakery", "a mountain railway", "a school science fair", "a lighthouse",
          "a city library", "a fishing village", "a music festival", "a bicycle repair shop", "a river cleanup",
          "a chess club", "a theatre workshop")
SENTENCES = ("The volunteers met on Saturday morning to plan the next steps.", "Nobody had expected the budget to be so tight.",
             "A local newspaper wrote a short article about it last week.", "The weather made everything take twice as long.",
             "Several neighbours offered to help with the heavier work.", "The old records were kept in a box in the attic.",
             "Children from the nearby school visited in the afternoon.", "The first results were better than anyone hoped.",
             "A few people raised concerns about noise and parking.", "The committee agreed to meet again next month.")
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Timed:
    submitted: float
    first: float = 0.0
    last: float = 0.0
    tokens: list[int] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens the prefix cache restored
    prefill_cpu_s: float = 0.0  # CPU of both stage processes from submit to the first token


@dataclass
class Side:
    name: str
    client: PipelineClient
    relay: ReturnRelay
    control: PushQueue  # to stage 0's endpoint: SetWire
    stages: StageProcesses
    messages: list[ChatMessage] = field(default_factory=list)

    async def set_delay(self, delay_ms: float) -> None:
        await self.control.send(SetWire(delay_ms))  # stage 0 -> stage 1
        apply_wire(self.relay.link, SetWire(delay_ms), get_logger())  # stage 1 -> stage 0

    def cpu_s(self) -> float:
        """CPU seconds both stage processes have used so far."""
        total = 0
        for proc in self.stages.procs.values():
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / _TICK

    async def request(self, prompt: Sequence[int], max_tokens: int, stop: frozenset[int]) -> Timed:
        timed, cpu = Timed(time.perf_counter()), self.cpu_s()
        handle = await self.client.submit(prompt, max_tokens=max_tokens, stop_tokens=stop)
        async for event in handle:
            if event.final:
                if event.error is not None:
                    raise RuntimeError(f"bench: {self.name}: {event.error}")
                prefix = event.stats.prefix_cache if event.stats is not None else None
                timed.cached_tokens = prefix.cached_tokens if prefix is not None else 0
                return timed
            timed.last = time.perf_counter()
            if not timed.first:
                timed.first, timed.prefill_cpu_s = timed.last, self.cpu_s() - cpu
            timed.tokens += event.tokens
        raise RuntimeError("bench: the request's events ended without a final one")


@contextlib.asynccontextmanager
async def running_side(name: str, directory: Path, model: Path, split: int, lanes: int, ctx_size: int,
                       kv_cache: dict[str, Any] | None) -> AsyncIterator[Side]:
    directory.mkdir(parents=True)
    topology, configs = write_local_topology(directory, model, read_model_info(model).n_layer, [split], lane_count=lanes,
                                             ctx_size=ctx_size, topology_id=f"bench-{name}", extra={"kv_cache": kv_cache})
    stage0 = f"ipc://{directory.resolve()}/stage0-driver.sock"  # stage 0 binds here; the topology's endpoint relays
    stages = StageProcesses(topology, configs, directory / "run", include_stage0=True, first_flags=["--bind-addr", stage0])
    ctx = zmq.asyncio.Context()
    relay = ReturnRelay(ctx, stages.topology.first().endpoint, stage0)
    client, control = PipelineClient(request_endpoint(stage0), ctx), PushQueue(ctx, stage0)
    try:
        with stages:
            yield Side(name, client, relay, control, stages)
    finally:
        client.close()
        control.close()
        relay.close()
        ctx.term()


def user_message(topic: int, turn: int) -> str:
    rng = np.random.default_rng(1000 * topic + turn)
    body = " ".join(SENTENCES[i] for i in rng.permutation(len(SENTENCES))[:6])
    return f"Note {turn + 1} about {TOPICS[topic % len(TOPICS)]}: {body} What next?"


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
        """One conversation on each side, turn by turn; TTFT, prompt and cached tokens, CPU per turn."""
        system = f"You are a helpful assistant planning work on {TOPICS[topic % len(TOPICS)]}. Answer in detail."
        for side in self.sides.values():
            side.messages = [ChatMessage("system", system)]
        turns = []
        for turn in range(self.args.turns):
            for side in self.order():
                side.messages.append(ChatMessage("user", user_message(topic, turn)))
                prompt = self.tokenizer.encode(self.template.apply(side.messages), add_special=True, parse_special=True)
                timed = await side.request(prompt, self.args.reply_tokens, self.stop)
                side.messages.append(ChatMessage("assistant", self.tokenizer.decode(
                    [t for t in timed.tokens if t not in self.stop])))
                turns.append(ChatTurn(side.name, delay_ms, topic, turn, len(prompt),
                                      timed.cached_tokens,
                                      (timed.first - timed.submitted) * 1e3, timed.prefill_cpu_s))
        return turns

    async def unique(self, waves: int, concurrency: int) -> list[Wave]:
        """Waves of `concurrency` unique prompts on each side: tok/s (generated tokens / wave span) and CPU."""
        rng = np.random.default_rng(7)
        done = []
        for wave in range(waves):
            texts = [f"Item {wave}-{i}: " + " ".join(SENTENCES[j] for j in rng.permutation(len(SENTENCES))[:rng.integers(4, 11)])
                     for i in range(concurrency)]
            prompts = [self.tokenizer.encode(t) for t in texts]
            for side in self.order():
                cpu = side.cpu_s()
                timed = await asyncio.gather(*(side.request(p, self.args.unique_tokens, frozenset()) for p in prompts))
                tokens = sum(len(t.tokens) for t in timed)
                span = max(t.last for t in timed) - min(t.submitted for t in timed)
                done.append(Wave(side.name, wave, tokens / span, (side.cpu_s() - cpu) / tokens))
        return done


def stopped_caches(stages: StageProcesses) -> dict[str, Any]:
    """Each stage's prefix cache summary (and stage 0's index) from its `stopped` log line."""
    out: dict[str, Any] = {}
    for stage_id in ("stage0", "stage1"):
        events = [e for e in read_events(stages.log_path(stage_id)) if e.get("event") == "stopped"]
        last = events[-1] if events else {}
        out[stage_id] = last.get("stage_prefix_cache") or last.get("prefix_cache") or {}
        if stage_id == "stage0":
            out["index"] = last.get("prefix_cache") or {}
    return out


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
                    await side.set_delay(delay)
                for c in range(args.conversations):
                    turns += await bench.chat(i * args.conversations + c, delay)
                    print(turns[-2].line(), turns[-1].line(), file=sys.stderr, flush=True)
                    loads.append(os.getloadavg()[0])
            for side in sides.values():
                await side.set_delay(0.0)
            waves = await bench.unique(args.unique_waves, 4)
            loads.append(os.getloadavg()[0])
            for side in sides.values():  # stage 0 sends the last releases (and kept replies) before admitting this
                await side.request([2, 3, 4], 2, frozenset())
            stages = sides["on"].stages
        memory = stopped_caches(stages)
    return {"turns": turns, "waves": waves, "memory": memory}


def run_prefix_cache_bench(args: argparse.Namespace) -> int:
    configure_logging("off")
    WireCondition(delay_ms=args.delay_ms)  # checked before anything starts
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
    p.add_argument("--model", default=BENCH_MODEL, help=BENCH_MODEL_HELP)
    p.add_argument("--split", type=int, default=9)
    p.add_argument("--lanes", type=int, default=4)
    p.add_argument("--ctx-size", type=int, default=2048, help="context per lane")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--conversations", type=int, default=4, help="conversations per delay")
    p.add_argument("--reply-tokens", type=int, default=80)
    p.add_argument("--delay-ms", type=float, default=20.0, help="the delayed run's wire delay per hop (both hops)")
    p.add_argument("--max-entries", type=int, default=16)
    p.add_argument("--max-bytes", type=int, default=24 << 20, help="kv_cache.max_bytes on every stage")
    p.add_argument("--unique-waves", type=int, default=10, help="waves of 4 short unique prompts per side")
    p.add_argument("--unique-tokens", type=int, default=32)
    p.add_argument("--out-dir", default=str(DOCS), help="where bench-prefix-cache.{md,json} go")
    p.set_defaults(run=run_prefix_cache_bench)
