"""`skippy bench hosts`: one model served across namespace hosts reached only over SSH, skippy against llama.cpp's
RPC split of the same model over the same hosts, in one run (root; Debian's openssh-server).

    skippy bench hosts [--model qwen2.5-coder-1.5b] [--hosts 2,3] [--mem-mb 1100,900] [--delay-ms 20]
                       [--lanes 8] [--ctx-size 3328] [--levels 1,8] [--prompt-tokens 3072] [--loss-timeout-s 300]

For each host count: a host set (`skippy.netns`, a memory cgroup of `--mem-mb` each, `--delay-ms` one way between
hosts; the client and `skippy up` sit in the root namespace, which reaches each host without delay) with an sshd in
every host (`skippy.netns.sshd`). Then, on that set:

1. skippy cold: `skippy up --hosts` with empty host caches (the probe, shipping each stage its slice, loading):
   time to ready, bytes each host received meanwhile, aggregate tok/s at each `--levels` concurrency (64-token
   answers, unique prompts), and the TTFT of a `--prompt-tokens` prompt;
2. skippy warm: `skippy up` again, the slices now in the hosts' caches: time to ready; then host loss: 8 streams
   (at most `--lanes`), and once each has a token the host of the last stage is cut off (link down, everything there killed): each
   stream's pause (cut to its next token), when the re-plan was counted, how many streams finished.

Then on a fresh set the peer (`hosts_rpc.py`): llama-server on host 1 with `ggml-rpc-server` on the others, at the
layer ranges of skippy's plan: time to ready, bytes received, the same tok/s and TTFT, and the same cut.
The measurements are in `hosts_measure.py`. Results print as a markdown table and go to `--json`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from skippy.bench import hosts_measure
from skippy.bench.hosts_rpc import start_rpc_split, stop_rpc_split
from skippy.bench.http_load import Server
from skippy.bench.http_servers import start_skippy_up, stop
from skippy.bench.llama_server_build import ensure_llama_server_binary, ensure_rpc_server_binary
from skippy.netns import HostSet, LinkConditions, down, unavailable_reason, up
from skippy.netns.commands import received_bytes
from skippy.netns.sshd import SshHost, cut_off, sshd_hosts, sshd_missing
from skippy.runtime.models import resolve_model_path
from skippy.telemetry.scrape import scrape

DOCS = Path(__file__).resolve().parents[2] / "docs"
LOSS_STREAMS = 8
RPC_THREADS = len(os.sched_getaffinity(0))  # what each skippy stage takes on a host: every CPU it has
MAX_TOKENS = 64
_SENT = re.compile(r"(sent stage\d+'s slice .*|nothing sent to .*|.* already has .*)")


def _say(text: str) -> None:
    print(f"bench hosts: {text}", file=sys.stderr, flush=True)


def _received(hosts: HostSet) -> list[int]:
    return [received_bytes(namespace) for namespace, _ in hosts.hosts]


def _replanned(server: Server) -> bool:
    samples = scrape(f"http://{server.host}:{server.port}/metrics", 5.0) or []
    return any(sample.name == "skippy_replans_total" and sample.value >= 1 for sample in samples)


def _host_set(n: int, args: argparse.Namespace, mem_mb: float) -> HostSet:
    prefix = f"{args.prefix}{n}"
    down(prefix)
    return up(n, LinkConditions(delay_ms=args.delay_ms), prefix=prefix, subnet=f"{args.subnet}.{n}", mem_mb=mem_mb)


def _skippy_runs(args: argparse.Namespace, model: Path, hosts: HostSet, ssh: list[SshHost], mem_mb: float,
                 root: Path) -> tuple[dict[str, Any], list[tuple[int, int]], int, str]:
    hosts_file = root / "hosts.json"
    hosts_file.write_text(json.dumps({"hosts": [{**h.entry(f"h{i + 1}"), "mem_mb": mem_mb} for i, h in enumerate(ssh)]}))
    flags = ["--model", str(model), "--lane-count", str(args.lanes), "--ctx-size", str(args.ctx_size),
             "--no-prefix-cache", "--hosts", str(hosts_file)]
    row: dict[str, Any] = {"system": "skippy"}
    before, start = _received(hosts), time.monotonic()
    _say(f"{len(ssh)} hosts: skippy up, host caches empty")
    server = start_skippy_up(flags, root / "cold" / "run", "cold")
    try:
        row["ready_cold_s"] = round(time.monotonic() - start, 1)
        row["received_mb"] = [round((b - a) / 1e6, 1) for a, b in zip(before, _received(hosts))]
        stderr = (root / "cold" / "cold-up.stderr").read_text()
        row["shipped"] = [m.group(1) for line in stderr.splitlines() if (m := _SENT.search(line))]
        plan = json.loads((root / "cold" / "run" / "topology" / "plan.json").read_text())["stages"]
        ranges = [(int(s["layer_start"]), int(s["layer_end"])) for s in plan]
        row["split"] = [f"{s['host']}:{s['layer_start']}-{s['layer_end']}" for s in plan]
        pool = re.search(r"KV pool (\d+) cells", stderr)
        kv_cells = int(pool.group(1)) if pool else args.lanes * args.ctx_size
        prompt, row["prompt_tokens"] = hosts_measure.long_prompt(server, args.prompt_tokens)
        row["tok_s"] = hosts_measure.rates(server, args.levels, MAX_TOKENS)
        row["ttft_s"] = round(hosts_measure.ttft_s(server, prompt), 2)
        _say(f"skippy: {row}")
    finally:
        stop(server)
    start = time.monotonic()
    server = start_skippy_up(flags, root / "warm" / "run", "warm")
    try:
        row["ready_warm_s"] = round(time.monotonic() - start, 1)
        lost = str(plan[-1]["host"])
        namespace = ssh[int(lost.removeprefix("h")) - 1].namespace
        row["host_loss"] = {"host": lost, **hosts_measure.host_loss(
            server, lambda: cut_off(hosts, namespace), min(LOSS_STREAMS, args.lanes), MAX_TOKENS,
            lambda: _replanned(server), args.loss_timeout_s)}
        _say(f"skippy host loss: {row['host_loss']}")
    finally:
        stop(server)
    return row, ranges, kv_cells, prompt


def _rpc_run(args: argparse.Namespace, model: Path, hosts: HostSet, ranges: list[tuple[int, int]], kv_cells: int,
             prompt: str, root: Path) -> dict[str, Any]:
    row: dict[str, Any] = {"system": "llama.cpp RPC", "split": [f"h{k + 1}:{a}-{b}" for k, (a, b) in enumerate(ranges)]}
    before, start = _received(hosts), time.monotonic()
    _say(f"{len(ranges)} hosts: llama-server --rpc")
    split = start_rpc_split(hosts, (ensure_llama_server_binary(), ensure_rpc_server_binary()), model, ranges,
                            RPC_THREADS, args.lanes, kv_cells, root)
    try:
        row["ready_cold_s"] = round(time.monotonic() - start, 1)
        row["received_mb"] = [round((b - a) / 1e6, 1) for a, b in zip(before, _received(hosts))]
        row["prompt_tokens"] = len(hosts_measure.post_json(split.server, "/tokenize", {"content": prompt})["tokens"])
        row["tok_s"] = hosts_measure.rates(split.server, args.levels, MAX_TOKENS)
        row["ttft_s"] = round(hosts_measure.ttft_s(split.server, prompt), 2)
        _say(f"llama.cpp RPC: {row}")
        if len(ranges) > 1:
            row["host_loss"] = {"host": f"h{len(ranges)}", **hosts_measure.host_loss(
                split.server, lambda: cut_off(hosts, hosts.namespace(len(ranges))), min(LOSS_STREAMS, args.lanes),
                MAX_TOKENS, timeout_s=args.loss_timeout_s)}
            _say(f"llama.cpp RPC host loss: {row['host_loss']}")
    finally:
        stop_rpc_split(split)
    return row


def _one_count(args: argparse.Namespace, model: Path, n: int, mem_mb: float) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix=f"skippy-bench-hosts{n}-"))
    _say(f"{n} namespace hosts, {mem_mb:g} MiB each, {args.delay_ms:g} ms between them (logs in {root})")
    hosts = _host_set(n, args, mem_mb)
    try:
        with sshd_hosts(hosts, root / "ssh") as ssh:
            row, ranges, kv_cells, prompt = _skippy_runs(args, model, hosts, ssh, mem_mb, root)
    finally:
        down(hosts.prefix)
    rows = [{"hosts": n, "mem_mb": mem_mb, **row}]
    hosts = _host_set(n, args, mem_mb)
    try:
        rows.append({"hosts": n, "mem_mb": mem_mb, **_rpc_run(args, model, hosts, ranges, kv_cells, prompt, root)})
    finally:
        down(hosts.prefix)
    return rows


def _loss_text(loss: dict[str, Any] | None) -> str:
    if not loss:
        return "-"
    text = f"{loss['host']} cut: {loss['finished']}/{loss['streams']} finished"
    if loss["finished"]:
        text += f", paused {loss['pause_median_s']} s (max {loss['pause_max_s']})"
    if loss.get("replanned_s") is not None:
        text += f", re-planned at {loss['replanned_s']} s"
    if loss["failed"]:
        text += f"; {loss['failed']} failed {loss['failed_at_s']} s after the cut: {loss['errors'][0].split(':')[0][:100]}"
    if loss["hung"]:
        text += f"; {loss['hung']} hung (no byte in {loss['timeout_s']:g} s)"
    return text


def report(rows: list[dict[str, Any]], levels: list[int]) -> str:
    head = ("| hosts | system | split | received per host at start (MB) | up -> ready cold / warm (s) | "
            + " | ".join(f"c={c} tok/s" for c in levels) + " | TTFT (prompt tokens) | host lost mid-stream |")
    lines = [head, "|" + "---|" * (7 + len(levels))]
    for r in rows:
        ready = f"{r['ready_cold_s']} / {r.get('ready_warm_s', '-')}"
        rates = " | ".join(f"{r['tok_s'][c]:.2f}" for c in levels)
        lines.append(f"| {r['hosts']} | {r['system']} | {', '.join(r['split'])} | "
                     f"{', '.join(f'{mb:g}' for mb in r['received_mb'])} | {ready} | {rates} | "
                     f"{r['ttft_s']} s ({r['prompt_tokens']}) | {_loss_text(r.get('host_loss'))} |")
    return "\n".join(lines)


def run_hosts_bench(args: argparse.Namespace) -> int:
    if (reason := unavailable_reason() or sshd_missing()) is not None:
        print(f"bench hosts: cannot run here: {reason}", file=sys.stderr)
        return 2
    counts = [int(x) for x in args.hosts.split(",")]
    mems = [float(x) for x in args.mem_mb.split(",")]
    if len(mems) != len(counts):
        print(f"bench hosts: --mem-mb needs one value per --hosts count ({len(counts)}), got {len(mems)}",
              file=sys.stderr)
        return 2
    args.levels = [int(x) for x in args.levels.split(",")]
    model = resolve_model_path(args.model)
    ensure_rpc_server_binary()  # built once (minutes) before any host is made
    rows: list[dict[str, Any]] = []
    for n, mem in zip(counts, mems):
        rows += _one_count(args, model, n, mem)
    print(f"{model.name}: namespace hosts reached over SSH on this machine, {args.delay_ms:g} ms one way between hosts;"
          f" {args.lanes} lanes x {args.ctx_size} context, no prefix cache; {RPC_THREADS} threads per host")
    print(report(rows, args.levels))
    if args.json != "-":
        Path(args.json).write_text(json.dumps({"model": model.name, "delay_ms": args.delay_ms, "rows": rows}, indent=1))
    return 0


def add_to(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("hosts", help="a model across namespace hosts over SSH: skippy vs llama.cpp's RPC split (root)")
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="a packaged model or a GGUF path")
    p.add_argument("--hosts", default="2,3", help="host counts, comma separated (one host set each)")
    p.add_argument("--mem-mb", default="1100,900", help="each host's memory (MiB; cgroup cap and hosts-file budget),"
                                                         " one value per --hosts count")
    p.add_argument("--delay-ms", type=float, default=20.0, help="one-way delay between hosts (default 20)")
    p.add_argument("--lanes", type=int, default=8, help="skippy --lane-count, llama-server --parallel (default 8)")
    p.add_argument("--ctx-size", type=int, default=3328, help="context per request (default 3328)")
    p.add_argument("--levels", default="1,8", help="concurrency levels for tok/s (default 1,8)")
    p.add_argument("--prompt-tokens", type=int, default=3072, help="the long prompt's length for TTFT (default 3072)")
    p.add_argument("--loss-timeout-s", type=float, default=hosts_measure.LOSS_TIMEOUT_S,
                   help="after a host is cut, how long streams may go without a byte before they count as hung")
    p.add_argument("--prefix", default="skbh", help="host sets' name prefix (+ the host count; default skbh)")
    p.add_argument("--subnet", default="10.78", help="host sets' subnets: SUBNET.N.0/24 for N hosts (default 10.78)")
    p.add_argument("--json", default=str(DOCS / "bench-hosts.json"), help="where the JSON goes ('-': nowhere)")
    p.set_defaults(run=run_hosts_bench)
