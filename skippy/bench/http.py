"""`skippy bench http`: `skippy up` against llama-cpp-python's OpenAI server and llama.cpp's own `llama-server`,
over HTTP, in one run.

skippy runs twice side by side: plain (`skippy`: `skippy up --no-speculative`) and with speculative
decoding (`skippy-spec`: default `skippy up`, the per-session speculation policy; this bench's
`--no-speculative` leaves it out).
The peer `llama-server-spec` is llama-server with its own n-gram drafting (`--spec-type ngram-simple`).

Same GGUF, same streamed /v1/completions requests (fixed ~64-token prompt, temperature 0, fixed
max_tokens, end-of-generation tokens banned via logit_bias as llama-cpp-python lacks ignore_eos), raw
HTTP on asyncio streams; the servers alternate level by level of the concurrency sweep so machine noise
hits them alike (`--order alternate`), or run one at a time, each alone on the machine, skippy first
(`--order sequential`) or last (`--order reverse`). Every server gets all cores: llama-cpp-python with
`--interrupt_requests False` (else a new request cuts the running stream short), llama-server with
`--parallel N -c N*512 -t <cpus>` (N = 16 or the highest level, as skippy's lanes). skippy is split at
default as plain `skippy up` serves one host (the model whole in one stage), at `--split` (e.g. 9: two stages, each
on every CPU), or with `--split plan` as `skippy plan` chooses for this machine as one host of all its CPUs
(`--stage-cpus 0-N`: one stage too, pinned). llama-cpp-python's
server extras, and matplotlib for the plot, are pip-installed into the venv on first use; the built
llama-cpp-python itself is reused, never rebuilt; llama-server is built once from the same llama.cpp
sources (skippy.bench.llama_server_build). This module runs the benchmark; the servers are started in
skippy.bench.http_servers, the requests and the sweep are in skippy.bench.http_load, the tables, plot and
JSON in skippy.bench.http_report.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from skippy.bench.http_load import ORDERS, PROMPT, Server, sweep, sweep_in_turn
from skippy.bench.http_report import cpu_by_role, pairs, table, write_report
from skippy.bench.http_servers import (
    llama_server_args,
    start_llama_cpp_python,
    start_llama_server,
    start_skippy,
    stop,
)
from skippy.bench.llama_server_build import ensure_llama_server_binary, llama_server_version
from skippy.config.generation import DEFAULT_POLICY_PLAN
from skippy.runtime.models import BENCH_MODEL, BENCH_MODEL_HELP, resolve_model_path

LLAMA_CPP_PYTHON_REQ = "llama-cpp-python[server]==0.3.36"
DOCS = Path(__file__).resolve().parents[2] / "docs"


def _pip(*args: str) -> None:
    print(f"bench: pip install {' '.join(args)} (into {sys.prefix}, for the benchmark only)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--only-binary=:all:", *args], check=True)


def ensure_llama_cpp_python_server() -> None:
    """Install the server extras only; `--only-binary` plus the pinned installed version means no rebuild."""
    if subprocess.run([sys.executable, "-c", "import llama_cpp.server.app"], capture_output=True).returncode == 0:
        return
    if (installed := metadata.version("llama-cpp-python")) != LLAMA_CPP_PYTHON_REQ.rsplit("==", 1)[1]:
        raise SystemExit(f"bench: llama-cpp-python {installed} is installed; refusing to rebuild it for the extras")
    _pip(LLAMA_CPP_PYTHON_REQ)


def ensure_matplotlib() -> None:
    """matplotlib for the plot, pip-installed on first use."""
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError:
        _pip("matplotlib")


def vocab_facts(model: Path) -> tuple[list[int], int]:
    """(end-of-generation token ids, prompt length in tokens with BOS), from llama.cpp's own vocab."""
    import llama_cpp  # noqa: PLC0415

    llm = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    ids = [t for t in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    prompt_tokens = len(llm.tokenize(PROMPT.encode(), add_bos=True))
    llm.close()
    return ids, prompt_tokens


PEERS = ("llama-cpp-python", "llama-server", "llama-server-spec")
DEFAULT_PEERS = PEERS[:2]
SPECULATIVE_PLAN = DEFAULT_POLICY_PLAN.to_dict()  # what skippy-spec (default `skippy up`) runs
OWN_PLAN_FLAGS = ("--openai-speculative-config", "--openai-draft-model-path")  # --skippy-flags choosing for both


def _start_peer(name: str, model: Path, tmp: Path, lanes: int, threads: int) -> Server:
    if name.startswith("llama-server"):
        return start_llama_server(ensure_llama_server_binary(), model, tmp / f"{name}.log", lanes, threads,
                                  speculative=name == "llama-server-spec")
    return start_llama_cpp_python(model, tmp / "llama-cpp-python.log", threads)


PLANNED = "plan"  # --split plan


def _skippy_shape(args: argparse.Namespace, threads: int) -> tuple[str | None, list[str], str]:
    """`skippy up`'s --split and extra flags for this bench's --split, and how the header says it."""
    flags = shlex.split(args.skippy_flags)
    if args.split is None:
        return None, flags, f"as plain `skippy up` serves one host (one stage: no split), on all {threads} CPUs"
    if args.split != PLANNED:
        return args.split, flags, f"split at {args.split}, each stage on all {threads} CPUs"
    cpus = f"0-{threads - 1}" if threads > 1 else "0"
    return None, [*flags, "--stage-cpus", cpus], f"as planned for one host of CPUs {cpus} (one stage: no split)"


def _skippy_starters(args: argparse.Namespace, tmp: Path, lanes: int, threads: int) -> list[Callable[[], Server]]:
    """skippy up --no-speculative, and (unless this bench's --no-speculative) default skippy up (the policy)."""
    split, flags, _ = _skippy_shape(args, threads)
    plain = flags if any(f in OWN_PLAN_FLAGS for f in flags) else [*flags, "--no-speculative"]
    starters = [lambda: start_skippy(args.model, split, tmp / "skippy" / "run", lanes, plain)]
    if args.speculative:
        starters.append(lambda: start_skippy(args.model, split, tmp / "skippy-spec" / "run", lanes, flags,
                                             name="skippy-spec"))
    return starters


def _peer_facts(peers: list[str], lanes: int, threads: int) -> str:
    facts = {"llama-cpp-python": f"llama-cpp-python {LLAMA_CPP_PYTHON_REQ.rsplit('==', 1)[1]} server, n_ctx 2048,"
                                 f" {threads} threads",
             "llama-server": f"llama.cpp llama-server {llama_server_version()} (built from the llama-cpp-python sdist),"
                             f" {' '.join(llama_server_args(lanes, threads))}",
             "llama-server-spec": f"llama-server-spec: the same with {' '.join(llama_server_args(lanes, threads, True)[-2:])}"}
    return "; ".join(facts[p] for p in peers)


def run_http_bench(args: argparse.Namespace) -> int:
    model = resolve_model_path(args.model)
    levels = [int(x) for x in args.levels.split(",")]
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    if not peers or any(p not in PEERS for p in peers):
        raise SystemExit(f"bench: --peers must name some of {', '.join(PEERS)}, got '{args.peers}'")
    lanes, threads = max(16, *levels), len(os.sched_getaffinity(0))
    if "llama-cpp-python" in peers:
        ensure_llama_cpp_python_server()
    if any(p.startswith("llama-server") for p in peers):
        ensure_llama_server_binary()  # built once (minutes) before any server starts
    banned, prompt_tokens = vocab_facts(model)
    load_before = os.getloadavg()[0]
    servers: list[Server] = []
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM also stops every server
    with tempfile.TemporaryDirectory(prefix="skippy-bench-http-") as tmp:
        try:
            print(f"bench: starting skippy up and {', '.join(peers)} on {model.name} (logs in {tmp})", file=sys.stderr)
            starters: list[Callable[[], Server]] = [
                *_skippy_starters(args, Path(tmp), lanes, threads),
                *(functools.partial(_start_peer, p, model, Path(tmp), lanes, threads) for p in peers)]
            if args.order == "alternate":
                servers += [start() for start in starters]
                results = asyncio.run(sweep(servers, levels, args.max_tokens, banned, args.unique_prompts, args.rounds))
            else:  # one server at a time, alone on the machine
                ordered = starters if args.order == "sequential" else starters[::-1]
                results = sweep_in_turn(ordered, stop, levels, args.max_tokens, banned, args.unique_prompts, args.rounds)
        finally:
            codes = {s.name: stop(s) for s in servers}
            print(f"bench: stopped {codes}", file=sys.stderr)
    spec = (f"; skippy-spec: the same with speculation on (default: the policy over {json.dumps(SPECULATIVE_PLAN)})"
            if args.speculative else "")
    header = (f"model {model.name}; skippy: {_skippy_shape(args, threads)[2]}, {lanes} lanes, generation concurrency"
              f" {lanes}{', ' + args.skippy_flags if args.skippy_flags else ''}"
              f"{spec};"
              f" {_peer_facts(peers, lanes, threads)}\n"
              f"prompt {prompt_tokens} tokens{' (numbered: no prefix cache)' if args.unique_prompts else ''},"
              f" max_tokens {args.max_tokens}, temperature 0, EOG ids {banned} banned by logit_bias;"
              f" N = max(2c, 4) streamed requests per level and round; {args.rounds} round(s), the median one shown;"
              f" order {args.order}\n"
              f"machine shared with other work: 1-min load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    text = "\n\n".join([header, *(f"{o} vs {p}:\n{table(results, p, o)}" for o, p in pairs(results)),
                         cpu_by_role(results)])
    print(text)
    ensure_matplotlib()
    write_report(Path(args.out_dir), results, {
        "command": " ".join(["scripts/bench-http", *sys.argv[3:]]), "model": model.name,
        "prompt_tokens": prompt_tokens, "max_tokens": args.max_tokens, "banned_ids": banned,
        "unique_prompts": args.unique_prompts, "rounds": args.rounds, "order": args.order, "cpus": threads, "peers": peers,
        "speculative_plan": SPECULATIVE_PLAN if args.speculative else None}, text, args.max_tokens)
    return 0


def add_to(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("http", help="skippy up vs llama-cpp-python's server and llama-server: tok/s, TTFT, TPOT")
    p.add_argument("--model", default=BENCH_MODEL, help=BENCH_MODEL_HELP)
    p.add_argument("--split", default=None, help="skippy's split points, e.g. 9 (default: none, as plain `skippy up`"
                                                 " serves one host: one stage); 'plan': as `skippy plan` chooses for"
                                                 " this machine as one host of pinned CPUs (one stage as well)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--levels", default="1,2,4,8,16", help="concurrency levels, comma separated")
    p.add_argument("--rounds", type=int, default=1, help="runs of each level per server, alternating (median shown)")
    p.add_argument("--order", choices=ORDERS, default="alternate",
                   help="alternate: every server up, level by level in turn; sequential: one server at a time (skippy"
                        " first), each alone on the machine; reverse: the same, peers first")
    p.add_argument("--peers", default=",".join(DEFAULT_PEERS),
                   help=f"servers to compare against, some of {','.join(PEERS)} (default {','.join(DEFAULT_PEERS)})")
    p.add_argument("--no-speculative", dest="speculative", action="store_false",
                   help="leave out skippy-spec (default skippy up: the speculation policy)")
    p.add_argument("--skippy-flags", default="", help="more flags for skippy up, e.g. '--no-prefix-cache'")
    p.add_argument("--unique-prompts", action="store_true", help="prefix each prompt with a counter (no prefix cache)")
    p.add_argument("--out-dir", default=str(DOCS), help="where bench-http.json and bench-http.png go")
    p.set_defaults(run=run_http_bench)
