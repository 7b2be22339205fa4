"""`skippy bench speculative`: plain vs speculative decoding on one 2-stage pipeline (or one stage, `--split 0`),
side by side in one run.

Stage 1 runs as a real process (`skippy stage`); stage 0's driver runs in this process, as in
`skippy bench pipeline`, so the bench can switch the driver's speculation between rounds of requests:
none (plain, what `--no-speculative` runs), the default of `skippy up` (the policy: the suffix
proposer with the cross-request index under SpeculationPolicy, C(rows) calibrated through the pipeline when
the driver starts, the hop delay followed live; its index emptied before every cell, so no cell drafts from
another cell's requests), and with `--draft-model` a small model of the same vocabulary drafting under the same
policy (what `skippy up --openai-draft-model` runs); in the 0 ms cells also llama-server with and without its own n-gram drafting
(skippy.bench.speculative_peers, `--peers`). Every cell (workload x delay per hop x concurrency) runs its
rounds mode after mode on the same prompts, so machine noise hits the modes alike, and checks each greedy
output against the plain one.

The wire delay conditions both hops of a round trip. The forward hop (stage 0 -> stage 1) is stage
0's downstream link (SetWire). The return hop: stage 1 sends predictions and heartbeats to stage 0's
endpoint in the topology, so the driver binds another endpoint (`--bind-addr`; stage 1's Ready and
credits go there, to the Hello's reply endpoint) and a relay in this process, bound at the topology's
endpoint, forwards every message to it through a DownstreamLink with the same wire condition.
Workloads and timing: skippy.bench.speculative_load; table, doc, plot: skippy.bench.speculative_report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import zmq.asyncio

from skippy.bench.http import DOCS, ensure_matplotlib
from skippy.bench.http_load import Server
from skippy.bench.speculative_load import ModeResult, divergence_margin, run_wave
from skippy.bench.speculative_peers import PEERS, parse_peers, peer_facts, peer_wave, running_peers
from skippy.bench.speculative_report import Cell, write_report
from skippy.bench.speculative_workloads import FORMATS, Prompt, PromptFormat, prose_prompts, reemission_prompts, subtask_prompts
from skippy.config import WireCondition, parse_serving_args
from skippy.config.generation import DEFAULT_GLOBAL_TOKENS, DEFAULT_POLICY_PLAN
from skippy.driver.driver import Driver
from skippy.driver.speculative import ProposerFactory
from skippy.driver.speculative.draft_model import DraftModelProposerFactory
from skippy.driver.speculative.engine import Speculation
from skippy.driver.speculative.global_suffix import GlobalSuffixProposerFactory
from skippy.driver.speculative.policy import SpeculationPolicy
from skippy.launcher import StageProcesses, write_local_topology
from skippy.log import configure_logging
from skippy.protocol import SetWire, decode
from skippy.runtime.chain import LocalChain
from skippy.runtime.models import BENCH_MODEL, BENCH_MODEL_HELP, resolve_model_path
from skippy.runtime.slices import read_model_info
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_params import MAX_DRAFT_TOKENS
from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.tokenizer import Tokenizer
from skippy.stage.links import DownstreamLink, apply_wire
from skippy.transport.queues import PullQueue

ROUND = 2  # a round is 2c requests at concurrency c: finished requests are replaced, as under steady load
WORKLOADS = ("re-emission", "sub-tasks", "prose")


def _workloads(text: str) -> str:
    unknown = [w for w in text.split(",") if w not in WORKLOADS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown workload {', '.join(repr(w) for w in unknown)}: choose from"
                                         f" {', '.join(WORKLOADS)}")
    return text


def _split(text: str) -> int:
    """A split point, or none (0): one stage."""
    if text == "none":
        return 0
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a layer number or none, got '{text}'") from None


def _peers(text: str) -> str:
    try:
        parse_peers(text)
    except SystemExit as exc:  # refused while the command line is parsed, before anything starts
        raise argparse.ArgumentTypeError(str(exc).removeprefix("bench: --peers: ")) from None
    return text


def policy_factory() -> GlobalSuffixProposerFactory:
    """The default plan's proposer with an empty cross-request index."""
    assert DEFAULT_POLICY_PLAN.ngram is not None
    return GlobalSuffixProposerFactory(DEFAULT_POLICY_PLAN.ngram, DEFAULT_GLOBAL_TOKENS)


class ReturnRelay:
    """Stage 1 -> stage 0 messages, from the topology's stage-0 endpoint to the driver's, over a wire condition."""

    def __init__(self, ctx: zmq.asyncio.Context, listen: str, driver_endpoint: str) -> None:
        self.inbound = PullQueue(ctx, listen, decoder=lambda f: decode(f, n_embd=None))
        self.link = DownstreamLink(ctx, driver_endpoint, WireCondition())
        self.task = asyncio.get_running_loop().create_task(self._pump(), name="return relay")

    async def _pump(self) -> None:
        while True:
            msg = await self.inbound.recv()
            if not isinstance(msg, Exception):
                self.link.enqueue(msg)

    def close(self) -> None:
        self.task.cancel()
        self.link.close()
        self.inbound.close()


def policy_speculation(factory: ProposerFactory) -> Speculation:
    """`factory`'s drafts under the default plan's window and SpeculationPolicy, as build_speculation makes them."""
    window = DEFAULT_POLICY_PLAN.verify_window
    return Speculation(factory, SpeculationPolicy(window.max_tokens, max_depth=window.pipeline_depth),
                       window.max_tokens, depth=window.pipeline_depth, min_k=window.min_tokens, calibrate=True)


@dataclass
class Bench:
    driver: Driver
    relay: ReturnRelay | None  # None: one stage, no hop
    modes: dict[str, Speculation | None]  # in the order each cell runs them first
    stop: frozenset[int]
    max_tokens: int
    waves: int = 0
    peers: dict[str, Server] = field(default_factory=dict)  # llama-servers, in the 0 ms cells (one host, no hop)

    def set_delay(self, delay_ms: float) -> None:
        if self.relay is None:
            assert delay_ms == 0, "one stage has no hop to delay"
            return
        for link in (self.driver.downstream, self.relay.link):
            apply_wire(link, SetWire(delay_ms), self.driver.log)

    def use(self, mode: str) -> Speculation | None:
        """Switch the driver's speculation (between waves only: no request is live)."""
        previous = self.driver.speculation
        self.driver.use_speculation(self.modes[mode])
        if previous is not None:
            previous.release(list(previous.sessions))  # sessions whose release went to the next mode
        return self.driver.speculation

    async def cell(self, workload: str, delay_ms: float, concurrency: int, prompts: list[Prompt],
                   max_tokens: int | None = None) -> Cell:
        peers = tuple(self.peers) if delay_ms == 0 else ()
        modes = (*self.modes, *peers)
        results = {mode: ModeResult() for mode in modes}
        for spec in self.modes.values():  # an empty cross-request index: drafts only from this cell's requests
            if spec is not None and isinstance(spec.factory, GlobalSuffixProposerFactory):
                spec.release(list(spec.sessions))
                spec.factory.close()
                spec.factory = policy_factory()
        for start in range(0, len(prompts), ROUND * concurrency):
            self.waves += 1  # mode after mode on the same prompts, the order rotating from round to round
            for mode in modes[self.waves % len(modes):] + modes[:self.waves % len(modes)]:
                wave_prompts, tokens = prompts[start:start + ROUND * concurrency], max_tokens or self.max_tokens
                if mode in self.peers:
                    results[mode].add_wave(await peer_wave(self.peers[mode], wave_prompts, tokens, concurrency), None, None)
                    continue
                spec = self.use(mode)
                before = replace(spec.totals) if spec is not None else None
                wave = await run_wave(self.driver, wave_prompts, tokens, self.stop, concurrency)
                results[mode].add_wave(wave, before, spec.totals if spec is not None else None)
        return Cell(workload, delay_ms, concurrency, len(prompts), results, [p.tokens for p in prompts], peers=peers)


@contextlib.asynccontextmanager
async def running_bench(directory: Path, model: Path, split: int, lanes: int, ctx_size: int, stop: frozenset[int],
                        max_tokens: int, draft_model: Path | None = None) -> AsyncIterator[Bench]:
    """The pipeline split at `split` (0: the model whole in one stage, this process's driver, as plain `skippy up`
    serves one host), its driver switchable between plain, the policy and (given `draft_model`) the draft model."""
    n_layer = read_model_info(model).n_layer
    topology, configs = write_local_topology(directory, model, n_layer, [split] if split else [], lane_count=lanes,
                                             ctx_size=ctx_size)
    driver_endpoint = f"ipc://{directory.resolve()}/stage0-driver.sock"
    with StageProcesses(topology, configs, directory / "run"):
        options = parse_serving_args(["--config", str(configs[0]), "--topology", str(topology), "--max-inflight", "4",
                                      "--bind-addr", driver_endpoint])
        ctx = zmq.asyncio.Context()
        assert options.topology is not None
        relay = ReturnRelay(ctx, options.topology.first().endpoint, driver_endpoint) if split else None
        runtime = StageRuntime(RuntimeSpec.from_stage_config(options.config))
        policy = policy_speculation(policy_factory())
        modes: dict[str, Speculation | None] = {"plain": None, "policy": policy}
        if draft_model is not None:  # refused here, before any wave, if its vocabulary is not the target's
            modes["draft-model"] = policy_speculation(DraftModelProposerFactory(
                draft_model, target_vocab_model=runtime.model, lane_count=lanes, ctx_size=ctx_size,
                n_threads=runtime.spec.n_threads))
        driver = Driver(options, runtime, speculation=policy)  # calibrates C(rows) at start
        bench = Bench(driver, relay, modes, stop, max_tokens)
        try:
            await driver.start()
            yield bench
        finally:
            bench.use("plain")
            await driver.close()
            for spec in modes.values():
                if spec is not None:
                    spec.close()
            runtime.close()
            if relay is not None:
                relay.close()
            ctx.term()


def _lanes(args: argparse.Namespace) -> int:
    """Lanes of the pipeline (and slots of each llama-server): the highest concurrency, and two to spare."""
    return max(int(c) for c in args.concurrency.split(",")) + 2


async def _bench(args: argparse.Namespace, model: Path, fmt: PromptFormat) -> tuple[list[Cell], dict[int, float]]:
    levels = [int(c) for c in args.concurrency.split(",")]
    max_prompt = args.ctx_size - args.max_tokens - MAX_DRAFT_TOKENS - 2
    need = {c: max(args.requests, c) for c in levels}  # whole rounds: n rounded up to a multiple of ROUND * c
    need = {c: -(-n // (ROUND * c)) * ROUND * c for c, n in need.items()}
    code = reemission_prompts(fmt, max(need.values()), max_prompt)
    prose = prose_prompts(fmt, max(need.values()))
    cell_prompts = {(w, c): subtask_prompts(fmt, 2 * c * -(-args.requests // (2 * c)), c, max_prompt)
                    if w == "sub-tasks" else (code if w == "re-emission" else prose)[:need[c]]
                    for w in args.workloads.split(",") for c in levels}
    with tempfile.TemporaryDirectory(prefix="skippy-bench-spec-") as tmp, \
            running_peers(parse_peers(args.peers), model, Path(tmp), _lanes(args), args.ctx_size) as peers:
        draft = resolve_model_path(args.draft_model) if args.draft_model else None
        async with running_bench(Path(tmp), model, args.split, _lanes(args), args.ctx_size,
                                 fmt.tokenizer.eog_tokens(), args.max_tokens, draft) as bench:
            bench.peers = peers
            policy = bench.driver.speculation.policy if bench.driver.speculation is not None else None
            cost = policy.cost if isinstance(policy, SpeculationPolicy) else None
            calibrated = {r: round(c, 2) for r, c in cost.calibrated_table().items()} if cost is not None else {}
            cells: list[Cell] = []
            for delay in (float(d) for d in args.delays_ms.split(",")):
                bench.set_delay(delay)
                await bench.cell("warm-up", delay, 1, code[-1:], max_tokens=24)  # every mode once; the cost model sees the delay
                for (workload, c), prompts in cell_prompts.items():
                    cell = await bench.cell(workload, delay, c, prompts)
                    cell.load = os.getloadavg()[0]
                    cell.served_factor = cost.speed if cost is not None else 1.0
                    print(cell.line(), file=sys.stderr, flush=True)
                    cells.append(cell)
    return cells, calibrated


def measure_margins(model: Path, cells: list[Cell], ctx_size: int) -> None:
    """For each request whose speculative output differs from plain's: the unsplit model's top-2 margin there."""
    chain = LocalChain(RuntimeSpec(model_path=model, layer_start=0, layer_end=0, lane_count=1, ctx_size=ctx_size))
    try:
        for cell in cells:
            for mode in list(cell.speculative()):
                cell.margins[mode] = [divergence_margin(chain, cell.prompts[i], cell.plain.outputs[i],
                                                        cell.results[mode].outputs[i]) for i in cell.mismatched(mode)]
    finally:
        chain.close()


def run_speculative_bench(args: argparse.Namespace) -> int:
    if args.split == 0 and any(float(d) for d in args.delays_ms.split(",")):
        raise SystemExit(f"bench: --split none is one stage, no hop to delay: --delays-ms must be 0, got {args.delays_ms}")
    configure_logging("off")
    model = resolve_model_path(args.model)
    tokenizer = Tokenizer(model)
    load_start = os.getloadavg()[0]
    try:
        fmt = PromptFormat.choose(tokenizer, model, args.prompt_format)
        cells, calibrated = asyncio.run(_bench(args, model, fmt))
        measure_margins(model, cells, args.ctx_size)
    finally:
        tokenizer.close()
    ensure_matplotlib()
    facts = {"command": " ".join(["scripts/bench-speculative", *sys.argv[3:]]), "model": model.name,
             "split": args.split, "draft_model": args.draft_model,
             "max_tokens": args.max_tokens, "requests": args.requests, "prompt_format": fmt.name,
             "calibrated_cost_ms": calibrated,
             "load_avg_1min": [round(load_start, 2), round(os.getloadavg()[0], 2)],
             "peers": peer_facts(parse_peers(args.peers), _lanes(args), args.ctx_size)}
    print(write_report(Path(args.out_dir), cells, facts))
    return 0


def add_to(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("speculative", help="plain vs the default speculation policy, 2 stages, by workload, delay"
                         " and concurrency")
    p.add_argument("--model", default=BENCH_MODEL, help=BENCH_MODEL_HELP)
    p.add_argument("--split", type=_split, default=9,
                   help="split point (default 9: 2 stages); none (or 0): one stage, as plain `skippy up` serves one"
                        " host (--delays-ms 0 only)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--requests", type=int, default=4, help="requests per cell at least (whole waves of c)")
    p.add_argument("--concurrency", default="1,4,8,16", help="requests in flight, comma separated")
    p.add_argument("--delays-ms", default="0,20", help="wire delay per hop (both hops), comma separated")
    p.add_argument("--ctx-size", type=int, default=1024, help="context per lane")
    p.add_argument("--peers", type=_peers, default=",".join(PEERS),
                   help=f"llama-servers to run in the 0 ms cells, comma separated, of {', '.join(PEERS)},"
                   " or none (llama-server is built from the llama-cpp-python sdist on first use)")
    p.add_argument("--workloads", type=_workloads, default=",".join(WORKLOADS),
                   help=f"comma separated, of {', '.join(WORKLOADS)}")
    p.add_argument("--prompt-format", default="auto", choices=FORMATS,
                   help="chat: each request as chat messages in the model's own template; completion: as raw text;"
                        " auto (default): chat when the GGUF carries a chat template (an instruct model)")
    p.add_argument("--draft-model", default=None,
                   help="also a mode where this packaged model or GGUF (same vocabulary) drafts under the policy")
    p.add_argument("--out-dir", default=str(DOCS), help="where bench-speculative.{md,json,png} go")
    p.set_defaults(run=run_speculative_bench)
