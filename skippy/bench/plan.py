"""`skippy bench plan`: hosts of one core each, skippy split by the planner against llama-server on one of
those cores, with the planner's prediction next to each measurement, in one run.

    scripts/bench-plan [--stage-cpus 0,1] [--levels 1,4,16] [--rounds 2] [--even] [--delay-ms 20] [--model M]
    scripts/netns-hosts up 3 --delay-ms 20 && scripts/bench-plan --netns skippy --stage-cpus 0,1,0 --plain

Servers, started together and swept level by level in turn (skippy.bench.http_load): `skippy-plan`
(`skippy up --stage-cpus LIST` without `--split`: the plan's split or replicas, each stage pinned to its CPU
set; `--no-replicas`: a split),
with `--even` also `skippy-even` (the layers halved, the same pinning), and `llama-server` pinned to the
first CPU set with as many threads (`--parallel` = the lane count). `--delay-ms` delays each of
skippy's hops (`--downstream-wire-delay-ms`) and the plan knows it. `--netns PREFIX` puts the stages on
that namespace set's hosts instead (`skippy up --netns`, one stage per host, plain TCP links carrying the
set's delay both ways; the plan reads the set's conditions). For each level: the plan's
predicted TPOT and tok/s, the measured ones (p50 TPOT of the streams, aggregate tok/s over the level's
wall time, which also counts TTFT), measured / predicted, skippy / llama-server and each server's CPU ms per token
(skippy.bench.cpu_time: where the work goes, steadier than tok/s on a shared machine); the planner's
one-host prediction sits next to llama-server's measurement. The cost tables are calibrated again at the
start (`--cached-costs`: the cached ones), so the prediction is of the machine as it is now; `--plain` runs
skippy with `--no-speculative` (plain decoding, what the model predicts; the validation table in
docs/plan.md). Writes nothing unless `--json PATH`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from skippy.bench.http import vocab_facts
from skippy.bench.http_load import Server, sweep
from skippy.bench.http_report import cpu_by_role, cpu_total
from skippy.bench.http_servers import start_llama_server, start_skippy, stop
from skippy.bench.llama_server_build import ensure_llama_server_binary
from skippy.config.errors import ConfigError
from skippy.plan.hosts import Host, hosts_from_flags, netns_hosts
from skippy.plan.memory import ServingShape
from skippy.plan.plan import Plan, make_plan
from skippy.plan.predict import replica_shares
from skippy.runtime.models import resolve_model_path

__all__ = ["add_to"]


def _row(cells: list[str]) -> str:
    return "".join(c.rjust(12) for c in cells)


def stage_compute_lines(plan: Plan, levels: list[dict[str, Any]]) -> list[str]:
    """Each planned stage's predicted compute per token next to its measured CPU per token: the cost model's
    compute side checked by CPU time, which other work on the machine moves far less than wall time. Tokens are
    every stream's: a replica serving s of c streams computes s / c of them."""
    lines = ["per stage, compute ms per token: predicted (the calibration, one micro-batch / its rows)"
             " vs measured (the stage process's CPU time / tokens)"]
    names = plan.stage_ids()
    for level in levels:
        c = level["concurrency"]
        per_token = [] if plan.replicated else [ms / p.rows for p in [plan.predicted(c)] for ms in p.stage_ms]
        shares = replica_shares(c, len(plan.replicas)) if plan.replicated else []
        for replica, share in zip(plan.replicas, shares):
            p = plan.at(replica, max(share, 1))
            per_token.append(p.stage_ms[0] / p.rows * share / c)
        cells = []
        for name, ms in zip(names, per_token):
            measured = level.get("cpu_ms_per_token", {}).get(f"stage:{name}")
            shown = "-" if measured is None or not ms else f"{measured:.2f} ({measured / ms:.2f}x)"
            cells.append(f"{name} {ms:.2f} / {shown}")
        lines.append(f"  c={c:<3} " + "; ".join(cells))
    return lines


def hosts_and_flags(args: argparse.Namespace, concurrency: int) -> tuple[list[Host], list[str]]:
    """The hosts the prediction is for and the `skippy up` flags serving the same split on them. Loopback hosts,
    one per CPU set, `--delay-ms` on each forward hop (`--downstream-wire-delay-ms`; predictions return to stage 0
    undelayed); or, with `--netns PREFIX`, the hosts of that namespace set, one stage in each, on plain TCP links
    whose conditions are the set's (every hop delayed, the return to stage 0 included)."""
    pin = ["--stage-cpus", args.stage_cpus, "--plan-concurrency", str(concurrency),
           *(["--no-speculative"] if args.plain else []), *([] if args.replicas else ["--no-replicas"])]
    if args.netns:
        if args.delay_ms or args.even:
            raise ConfigError("bench plan --netns: the set's links carry the delay (scripts/netns-hosts up N"
                              " --delay-ms D) and --even has no place on them; drop --delay-ms / --even")
        return netns_hosts(args.netns, args.stage_cpus), [*pin, "--netns", args.netns, "--insecure-links"]
    hosts = hosts_from_flags(args.stage_cpus, delay_ms=args.delay_ms)
    hosts[-1] = dataclasses.replace(hosts[-1], delay_ms=0.0)
    return hosts, [*pin, *(["--downstream-wire-delay-ms", str(args.delay_ms)] if args.delay_ms else [])]


def without_plan_flags(flags: list[str]) -> list[str]:
    """`flags` less those only a plan reads (`--plan-concurrency C`, `--no-replicas`), for a `skippy up` given its
    `--split` (which refuses them: nothing is planned)."""
    kept: list[str] = []
    for i, flag in enumerate(flags):
        if flag != "--no-replicas" and "--plan-concurrency" not in (flag, flags[i - 1] if i else None):
            kept.append(flag)
    return kept


def predicted_plan(args: argparse.Namespace, model: Path, hosts: list[Host], lanes: int, concurrency: int) -> Plan:
    """The plan the bench serves and predicts, one stage per CPU set. Calibrated now, just before the runs it
    predicts (unless --cached-costs): on a shared VM the speed of a core moved by 30-50% within an hour (a
    cached table from earlier predicted 25 ms a token where 16 ms was measured)."""
    return make_plan(model, hosts, ServingShape(lanes, 512, True), concurrency, stages=len(args.stage_cpus.split(",")),
                     refresh=not args.cached_costs, replicate=args.replicas)


def run_plan_bench(args: argparse.Namespace) -> int:
    model = resolve_model_path(args.model)
    levels = [int(x) for x in args.levels.split(",")]
    lanes = max(16, *levels)
    sets = args.stage_cpus.split(",")
    hosts, flags = hosts_and_flags(args, max(levels))
    plan = predicted_plan(args, model, hosts, lanes, max(levels))
    print(plan.report(levels), file=sys.stderr)
    binary = ensure_llama_server_binary()
    banned, _ = vocab_facts(model)
    first = sets[0].replace("+", ",")
    load_before = os.getloadavg()[0]
    servers: list[Server] = []
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix="skippy-bench-plan-") as tmp:
        try:
            servers.append(start_skippy(args.model, None, Path(tmp) / "plan" / "run", lanes, flags, name="skippy-plan"))
            if args.even:
                half = str(plan.facts.n_layer // 2)
                servers.append(start_skippy(args.model, half, Path(tmp) / "even" / "run", lanes, without_plan_flags(flags),
                                            name="skippy-even"))
            threads = len(hosts[0].cpus.split(",")) if hosts[0].cpus else 1
            servers.append(start_llama_server(binary, model, Path(tmp) / "llama-server.log", lanes, threads, cpus=first))
            results = asyncio.run(sweep(servers, levels, args.max_tokens, banned, False, args.rounds))
        finally:
            for server in servers:
                stop(server)
    served = " | ".join(", ".join(f"{s.start}-{s.end}" for s in split.stages) for split in plan.served)
    lines = [f"model {model.name}; hosts: {', '.join(h.describe() for h in hosts)}; plan: "
             + (f"{len(plan.replicas)} replicas, layers " if plan.replicated else "layers ")
             + served + f"; llama-server pinned to CPUs {first};"
             f" {args.max_tokens}-token streams, {args.rounds} round(s) per level (median)",
             f"machine shared with other work: 1-min load {load_before:.1f} before, {os.getloadavg()[0]:.1f} after",
             _row(["server", "c", "pred TPOT", "TPOT p50", "pred tok/s", "tok/s", "meas/pred", "vs llama-s", "CPU ms/tok"])]
    peer = {lv["concurrency"]: lv for lv in results["llama-server"]}
    for name, split in [("skippy-plan", plan.chosen), ("skippy-even", None), ("llama-server", plan.single)]:
        for level in results.get(name, []):
            c = level["concurrency"]
            predicted = (plan.predicted(c) if name == "skippy-plan" else plan.at(split, c)) if split is not None else None
            ratio = f"{level['tok_s'] / predicted.tok_s:.2f}" if predicted else "-"
            lines.append(_row([name, str(c), f"{predicted.tpot_ms:.1f}" if predicted else "-", f"{level['tpot_p50_ms']:.1f}",
                               f"{predicted.tok_s:.1f}" if predicted else "-", f"{level['tok_s']:.1f}", ratio,
                               f"{level['tok_s'] / peer[c]['tok_s']:.2f}", cpu_total(level)]))
    lines += stage_compute_lines(plan, results.get("skippy-plan", []))
    print("\n".join(lines))
    print(cpu_by_role(results))
    if args.json:
        Path(args.json).write_text(json.dumps({"report": lines, "plan": plan.report(levels), "results": results}, indent=1))
    return 0


def add_to(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("plan", help="skippy split by the planner on pinned CPU sets vs llama-server on one:"
                                      " predicted vs measured")
    p.add_argument("--model", default="default")
    p.add_argument("--stage-cpus", default="0,1", help="one host per CPU set (default 0,1)")
    p.add_argument("--levels", default="1,4,16")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay of each of skippy's hops")
    p.add_argument("--even", action="store_true", help="also skippy with the layers halved")
    p.add_argument("--netns", default=None, metavar="PREFIX",
                   help="the stages on the hosts of this namespace set (scripts/netns-hosts up N), one per host, over"
                        " its links; --stage-cpus pairs a CPU set with each host")
    p.add_argument("--cached-costs", action="store_true",
                   help="predict from the cached cost tables (default: calibrate again, just before the runs)")
    p.add_argument("--plain", action="store_true",
                   help="skippy with --no-speculative: plain decoding, what the cost model predicts (for validating it)")
    p.add_argument("--no-replicas", dest="replicas", action="store_false",
                   help="splits only (skippy up --no-replicas): no whole-model replica per host")
    p.add_argument("--json", default=None, help="write the tables and every level here")
    p.set_defaults(run=run_plan_bench)
