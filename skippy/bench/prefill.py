"""`skippy bench prefill`: a long prompt's time to first token, skippy against llama-server, in one run.

    skippy bench prefill [--model M] [--lengths 1k,4k,16k] [--repeat 3] [--stage-cpus 0,1] [--pairs one-host,split]
                         [--concurrent-stream] [--timeline] [--json PATH]

Two pairs, every server up at once, each prompt sent to one server at a time:

- `one-host`: `skippy` (`skippy up` as it serves one host: one stage on every CPU) against `llama-server` on
  the same cores (`-t` = the CPUs, unpinned);
- `split`: `skippy-split` (`skippy up --stage-cpus LIST --no-replicas --plan-for prefill`: the planner's split for
  the longest prompt, or `--plan-for` another objective, or `--split` the given one; one stage per CPU set,
  pinned) against `llama-server-1core`, pinned to the first set with as many threads.

Every server has `--lanes` sessions of a context that fits the longest prompt (skippy `--lane-count`,
`--ctx-size`; llama-server `--parallel`, `-c` = lanes x that) and its own batch defaults (llama-server: n_batch
2048, n_ubatch 512). skippy runs with `--no-speculative` (a prompt's prefill is the same either way; the
concurrent stream then decodes plainly, as llama-server's does). For each length, `--repeat` rounds: a new
prompt text per round (no prefix cache hit anywhere), sent to every server in turn, the order reversed every
other round so machine noise hits both sides alike. Reported per pair: the median TTFT of each side, and the
median over rounds of the round's ratio (skippy / peer, each round's pair measured back to back) against its
target (one host <= 1; 2 one-core stages <= 0.6, 3 <= 0.45), and each side's median CPU seconds per prompt
(steadier than wall time on a shared machine; a split's stages add up), and `busiest`: the ratio of each side's
busiest process's CPU seconds (a split's slowest stage against llama-server), what the TTFT ratio would be with
every process alone on its cores (with several threads a process also counts its spin-waits: llama-server's
OpenMP default spins longer than skippy's, which favours skippy on one host). `--concurrent-stream`: every prompt is sent
while a short prompt's stream decodes on the same server; its tokens/s before and during the prefill and
its longest stall are reported. `--timeline`: skippy runs at `--telemetry-level debug` and each skippy
server's last prompt of the longest length is shown chunk by chunk (skippy.bench.prefill_timeline). The
prompts and the timing: skippy.bench.prefill_load. Writes `--json PATH` (default docs/bench-prefill.json).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shlex
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from skippy.bench.http import vocab_facts
from skippy.bench.http_load import Server
from skippy.bench.http_servers import llama_server_args, start_llama_server, start_skippy, stop
from skippy.bench.llama_server_build import ensure_llama_server_binary, llama_server_version
from skippy.bench.prefill_load import PromptMaker, measure, parse_lengths
from skippy.bench.prefill_timeline import read_chunks, timeline_table
from skippy.plan.objective import OBJECTIVES
from skippy.runtime.models import resolve_model_path

__all__ = ["add_to"]

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAIRS = ("one-host", "split")
TARGETS = {1: 0.6, 2: 0.6, 3: 0.45}  # split: by stage count (one host: 1.0)
CONTEXT_MARGIN = 1024  # context beyond the longest prompt: the concurrent stream's tokens


@dataclasses.dataclass(frozen=True)
class Pair:
    label: str
    ours: str
    peer: str
    target: float | None


def _cpu_count(cpu_set: str) -> int:
    count = 0
    for part in cpu_set.replace("+", ",").split(","):
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return count


def _start(args: argparse.Namespace, model: Path, tmp: Path, ctx: int) -> tuple[list[Server], list[Pair], dict[str, Path]]:
    """Every server of the chosen pairs (started one after another), the pairs, and each skippy's run dir."""
    binary = args.binary = Path(args.llama_server) if args.llama_server else ensure_llama_server_binary()
    common = ["--ctx-size", str(ctx), "--no-speculative", *(["--telemetry-level", "debug"] if args.timeline else []),
              *shlex.split(args.skippy_flags)]
    servers: list[Server] = []
    pairs: list[Pair] = []
    runs: dict[str, Path] = {}
    threads = len(os.sched_getaffinity(0))
    if "one-host" in args.pair_list:
        runs["skippy"] = tmp / "skippy" / "run"
        servers.append(start_skippy(args.model, None, runs["skippy"], args.lanes, common))
        servers.append(start_llama_server(binary, model, tmp / "llama-server.log", args.lanes, threads, slot_ctx=ctx))
        pairs.append(Pair(f"one host, {threads} CPUs", "skippy", "llama-server", 1.0))
    if "split" in args.pair_list:
        sets = args.stage_cpus.split(",")
        runs["skippy-split"] = tmp / "skippy-split" / "run"
        planned = ["--no-replicas", "--plan-for", args.plan_for,
                   *(["--plan-prompt-tokens", str(max(args.length_list))] if args.plan_for != "decode" else [])]
        shape = ["--split", args.split] if args.split else planned
        servers.append(start_skippy(args.model, None, runs["skippy-split"], args.lanes,
                                    ["--stage-cpus", args.stage_cpus, *shape, *common], name="skippy-split"))
        first = sets[0].replace("+", ",")
        servers.append(start_llama_server(binary, model, tmp / "llama-server-1core.log", args.lanes,
                                          _cpu_count(sets[0]), cpus=first, slot_ctx=ctx))
        how = f"split {args.split}" if args.split else f"planned for {args.plan_for}"
        pairs.append(Pair(f"{len(sets)} stages ({how}) on CPUs {args.stage_cpus} vs CPUs {first}", "skippy-split",
                          "llama-server-1core", TARGETS.get(len(sets))))
    return servers, pairs, runs


async def _rounds(servers: list[Server], lengths: list[int], repeat: int, maker: PromptMaker, banned: list[int],
                  stream_tokens: int) -> list[dict[str, Any]]:
    for server in servers:  # warm-up, not recorded
        await measure(server, maker.text(64, seed=-1), banned)
    samples: list[dict[str, Any]] = []
    for n in lengths:
        for r in range(repeat):
            text = maker.text(n, seed=n * 1000 + r)
            for server in servers if r % 2 == 0 else servers[::-1]:
                sample = await measure(server, text, banned, stream_tokens)
                samples.append({"length": n, "round": r, **dataclasses.asdict(sample)})
                print(f"  {server.name:<20} {n:>6} tokens  round {r + 1}: TTFT {sample.ttft_s:7.2f} s"
                      + (f"  stream {sample.stream['during_tok_s']:.1f} tok/s, stall {sample.stream['longest_gap_s']:.1f} s"
                         if sample.stream else ""), file=sys.stderr, flush=True)
    return samples


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def report(samples: list[dict[str, Any]], pairs: list[Pair], lengths: list[int]) -> tuple[str, dict[str, Any]]:
    """The table (per length and pair: TTFT medians, the median round ratio, its target, every run) and its JSON."""
    rows = [("tokens", "pair", "skippy s", "peer s", "ratio", "target", "CPU s skippy/peer", "CPU ratio", "busiest",
             "skippy runs", "peer runs")]
    streams = []
    summary: dict[str, Any] = {}
    for n in lengths:
        for pair in pairs:
            by = {name: {s["round"]: s for s in samples if s["length"] == n and s["server"] == name}
                  for name in (pair.ours, pair.peer)}
            ours, peer = by[pair.ours], by[pair.peer]
            ratios = [ours[r]["ttft_s"] / peer[r]["ttft_s"] for r in sorted(ours) if r in peer]
            ratio = _median(ratios)
            cpu = [_median([s["cpu_s"] for s in side.values()]) for side in (ours, peer)]
            busiest = [_median([max(s["cpu_by_role"].values(), default=0.0) for s in side.values()]) for side in (ours, peer)]
            target = "-" if pair.target is None else f"<={pair.target:g} " + ("ok" if ratio <= pair.target else "NO")
            tokens = max((s["prompt_tokens"] for s in ours.values()), default=n)
            rows.append((str(tokens), pair.label, f"{_median([s['ttft_s'] for s in ours.values()]):.2f}",
                         f"{_median([s['ttft_s'] for s in peer.values()]):.2f}", f"{ratio:.2f}", target,
                         f"{cpu[0]:.1f}/{cpu[1]:.1f}", f"{cpu[0] / cpu[1]:.2f}" if cpu[1] else "-",
                         f"{busiest[0] / busiest[1]:.2f}" if busiest[1] else "-",
                         " ".join(f"{s['ttft_s']:.1f}" for s in ours.values()),
                         " ".join(f"{s['ttft_s']:.1f}" for s in peer.values())))
            summary[f"{n}/{pair.ours}/{pair.peer}"] = {"ratio": ratio, "round_ratios": ratios, "cpu_s": cpu,
                                                       "busiest_cpu_s": busiest,
                                                       "target": pair.target,
                                                       "met": pair.target is None or ratio <= pair.target}
            for name, runs in by.items():
                rates = [s["stream"] for s in runs.values() if s["stream"]]
                if rates:
                    streams.append(f"  {n:>6} {name:<20} {_median([x['before_tok_s'] for x in rates]):6.1f} ->"
                                   f" {_median([x['during_tok_s'] for x in rates]):6.2f} tok/s, longest stall"
                                   f" {_median([x['longest_gap_s'] for x in rates]):.2f} s")
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    text = "\n".join("  ".join(f"{cell:>{w}}" for cell, w in zip(row, widths)).rstrip() for row in rows)
    if streams:
        text += "\n\nconcurrent stream, tokens/s before -> during the prefill (medians):\n" + "\n".join(streams)
    return text, summary


def run_prefill_bench(args: argparse.Namespace) -> int:
    lengths = args.length_list = parse_lengths(args.lengths)
    args.pair_list = [p.strip() for p in args.pairs.split(",") if p.strip()]
    if not args.pair_list or any(p not in PAIRS for p in args.pair_list):
        raise SystemExit(f"bench prefill: --pairs must name some of {', '.join(PAIRS)}, got '{args.pairs}'")
    if args.repeat < 1 or args.lanes < 1:
        raise SystemExit("bench prefill: --repeat and --lanes must be at least 1")
    if args.llama_server and not os.access(args.llama_server, os.X_OK):
        raise SystemExit(f"bench prefill: --llama-server {args.llama_server} is not an executable file")
    model = resolve_model_path(args.model)
    ctx = -(-(max(lengths) + CONTEXT_MARGIN) // 256) * 256
    banned, _ = vocab_facts(model)
    maker = PromptMaker(model)
    load_before = os.getloadavg()[0]
    servers: list[Server] = []
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM also stops every server
    with tempfile.TemporaryDirectory(prefix="skippy-bench-prefill-") as tmp:
        try:
            print(f"bench: starting the servers on {model.name} (logs in {tmp})", file=sys.stderr)
            started, pairs, runs = _start(args, model, Path(tmp), ctx)
            servers += started
            stream_tokens = ctx - CONTEXT_MARGIN // 2 if args.concurrent_stream else 0
            samples = asyncio.run(_rounds(servers, lengths, args.repeat, maker, banned, stream_tokens))
            timelines = {name: timeline_table(read_chunks(run, last["sent_at"], last["first_at"]),
                                              last["sent_at"], last["first_at"])
                         for name, run in runs.items() if args.timeline
                         for last in [[s for s in samples if s["server"] == name and s["length"] == max(lengths)][-1]]}
        finally:
            for server in servers:
                stop(server)
            maker.close()
    text, summary = report(samples, pairs, lengths)
    header = (f"model {model.name}; skippy up --no-speculative --lane-count {args.lanes} --ctx-size {ctx}"
              f"{' ' + args.skippy_flags if args.skippy_flags else ''};"
              f" llama.cpp llama-server {llama_server_version(args.binary)}"
              f" {' '.join(llama_server_args(args.lanes, 0, slot_ctx=ctx)[:4])} (-t: the pair's CPUs);"
              f" TTFT of a streamed /v1/completions, median of {args.repeat} round(s), order alternating\n"
              f"machine shared with other work: 1-min load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    text = "\n\n".join([header, text, *(f"{name}, the last {max(lengths)}-token prompt, chunk by chunk (ms):\n{t}"
                                         for name, t in timelines.items())])
    print(text)
    if args.json != "-":
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                                    "command": " ".join(["skippy", "bench", "prefill", *sys.argv[3:]]),
                                    "model": model.name, "ctx_size": ctx, "lanes": args.lanes, "lengths": lengths,
                                    "repeat": args.repeat, "ratios": summary, "samples": samples, "table": text},
                                   indent=1) + "\n")
        print(f"\nwrote {path}", file=sys.stderr)
    return 0


def add_to(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("prefill", help="a long prompt's TTFT: skippy one host vs llama-server, and skippy over one-core"
                                         " stages vs llama-server on one core")
    p.add_argument("--model", default="default", help="a packaged model or a GGUF path (default: skippy up's)")
    p.add_argument("--lengths", default="1k,4k,16k", help="prompt lengths in tokens, comma separated (k = 1024)")
    p.add_argument("--repeat", type=int, default=3, help="rounds per length, alternating the order (median shown)")
    p.add_argument("--pairs", default=",".join(PAIRS), help=f"which comparisons, some of {','.join(PAIRS)}")
    p.add_argument("--stage-cpus", default="0,1", help="split: one stage per CPU set (default 0,1)")
    p.add_argument("--split", default=None, help="split: these split points (skippy up --split, e.g. 12) instead of"
                                                 " the planner's split")
    p.add_argument("--plan-for", choices=OBJECTIVES, default="prefill",
                   help="split: what the planner chooses the split for (skippy up --plan-for; default prefill, of the"
                        " longest prompt)")
    p.add_argument("--lanes", type=int, default=2, help="sessions per server (skippy --lane-count, llama-server"
                                                        " --parallel; default 2)")
    p.add_argument("--concurrent-stream", action="store_true",
                   help="a short prompt's stream decodes while each long prompt prefills; its rate is reported")
    p.add_argument("--timeline", action="store_true", help="skippy at --telemetry-level debug; each skippy server's"
                                                           " last longest prompt shown chunk by chunk")
    p.add_argument("--llama-server", default=None, metavar="BINARY",
                   help="this llama-server binary (default: built once from the pinned llama.cpp sources and cached)")
    p.add_argument("--skippy-flags", default="", help="more flags for every skippy up, e.g. '--no-prefix-cache'")
    p.add_argument("--json", default=str(DOCS / "bench-prefill.json"), help="where the JSON goes ('-': nowhere)")
    p.set_defaults(run=run_prefill_bench)
