"""`skippy bench deterministic`: what `--deterministic` costs, `skippy up` with it against without it.

Both servers run at once (same model, split, lanes and, with `--speculative`, the README's suffix plan),
and the HTTP sweep of `bench http` (skippy.bench.http_load: streamed /v1/completions, temperature 0,
fixed max_tokens) alternates between them level by level and round by round, so machine noise hits
both alike. Printed: tok/s, TTFT and TPOT medians per concurrency and the ratio deterministic / default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

from skippy.bench.http import SPECULATIVE_PLAN, vocab_facts
from skippy.bench.http_load import Results, Server, sweep
from skippy.bench.http_servers import start_skippy, stop
from skippy.runtime.models import resolve_model_path
from skippy.runtime.slices import read_model_info


def report(results: Results) -> str:
    """One row per concurrency: both servers' tok/s (every round's too), TTFT/TPOT p50, and the ratio."""
    rows = [("conc", "tok/s default", "tok/s det", "ratio det/default", "rounds default", "rounds det",
             "TTFT ms def/det", "TPOT ms def/det")]
    for a, b in zip(results["skippy"], results["skippy-det"], strict=True):
        rounds = lambda r: " ".join(f"{x:.1f}" for x in r["tok_s_rounds"])  # noqa: E731
        rows.append((str(a["concurrency"]), f"{a['tok_s']:.1f}", f"{b['tok_s']:.1f}", f"{b['tok_s'] / a['tok_s']:.2f}",
                     rounds(a), rounds(b), f"{a['ttft_p50_ms']:.0f}/{b['ttft_p50_ms']:.0f}",
                     f"{a['tpot_p50_ms']:.1f}/{b['tpot_p50_ms']:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("".join(f"{cell:>{w + 2}}" for cell, w in zip(row, widths, strict=True)) for row in rows)


def run_deterministic_bench(args: argparse.Namespace) -> int:
    model = resolve_model_path(args.model)
    split = args.split or str(read_model_info(model).n_layer // 2)  # 2 stages: activations cross a link
    levels = [int(x) for x in args.levels.split(",")]
    lanes = max(levels)
    banned, prompt_tokens = vocab_facts(model)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    servers: list[Server] = []
    with tempfile.TemporaryDirectory(prefix="skippy-bench-det-") as tmp:
        flags: list[str] = []
        if args.speculative:
            plan = Path(tmp) / "speculative-plan.json"
            plan.write_text(json.dumps(SPECULATIVE_PLAN))
            flags = ["--openai-speculative-config", str(plan), "--openai-adaptive-speculative-window"]
        try:
            for name, extra in (("skippy", []), ("skippy-det", ["--deterministic"])):
                servers.append(start_skippy(args.model, split, Path(tmp) / name / "run", lanes, [*flags, *extra],
                                            name=name))
            results = asyncio.run(sweep(servers, levels, args.max_tokens, banned, False, args.rounds))
        finally:
            print(f"bench: stopped {({s.name: stop(s) for s in servers})}", file=sys.stderr)
    spec = f"; suffix speculation {json.dumps(SPECULATIVE_PLAN)}" if args.speculative else ""
    print(f"model {model.name}; 2 stages split at {split}, {lanes} lanes, each stage on all"
          f" {len(os.sched_getaffinity(0))} CPUs{spec};"
          f" prompt {prompt_tokens} tokens, max_tokens {args.max_tokens}, temperature 0; N = max(2c, 4) streamed"
          f" requests per level and round; {args.rounds} rounds alternating, the median shown\n{report(results)}")
    return 0


def add_to(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("deterministic", help="skippy up --deterministic vs without: tok/s, TTFT, TPOT side by side")
    p.add_argument("--model", default="smollm2-135m", help="a packaged model or a GGUF path (default smollm2-135m)")
    p.add_argument("--split", default=None, help="split point (default: half the layers)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--levels", default="1,8", help="concurrency levels, comma separated (default 1,8)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each level per server, alternating (median shown)")
    p.add_argument("--speculative", action="store_true", help="both servers with the README's suffix plan")
    p.set_defaults(run=run_deterministic_bench)
