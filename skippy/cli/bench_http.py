"""`skippy bench http`: `skippy up` against llama-cpp-python's own OpenAI server, over HTTP, in one run.

Same GGUF, same streamed /v1/completions requests (fixed ~64-token prompt, temperature 0, fixed
max_tokens, end-of-generation tokens banned via logit_bias as llama-cpp-python lacks ignore_eos), raw
HTTP on asyncio streams; the two servers alternate level by level of the concurrency sweep so machine
noise hits both alike. llama-cpp-python gets all cores and `--interrupt_requests False` (else a new
request cuts the running stream short). Its server extras, and matplotlib for the plot, are
pip-installed into the venv on first use; the built llama-cpp-python itself is reused, never rebuilt.
This module starts and stops the two servers and runs the benchmark; the requests and the sweep are
in skippy.cli.bench_http_load, the table, plot and JSON in skippy.cli.bench_http_report.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import IO

from skippy.cli.bench_http_load import PROMPT, Server, sweep
from skippy.cli.bench_http_report import table, write_report
from skippy.runtime.models import resolve_model_path

LLAMA_SERVER_REQ = "llama-cpp-python[server]==0.3.36"
DOCS = Path(__file__).resolve().parents[2] / "docs"
READY = re.compile(r"skippy ready: (http://\S+)/v1 \(model (\S+)\)")


def _pip(*args: str) -> None:
    print(f"bench: pip install {' '.join(args)} (into {sys.prefix}, for the benchmark only)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--only-binary=:all:", *args], check=True)


def ensure_llama_server() -> None:
    """Install the server extras only; `--only-binary` plus the pinned installed version means no rebuild."""
    if subprocess.run([sys.executable, "-c", "import llama_cpp.server.app"], capture_output=True).returncode == 0:
        return
    if (installed := metadata.version("llama-cpp-python")) != LLAMA_SERVER_REQ.rsplit("==", 1)[1]:
        raise SystemExit(f"bench: llama-cpp-python {installed} is installed; refusing to rebuild it for the extras")
    _pip(LLAMA_SERVER_REQ)


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


def _drain(stream: IO[bytes] | None, lines: queue.Queue[bytes]) -> None:
    assert stream is not None
    for line in iter(stream.readline, b""):
        lines.put(line)


def start_skippy(model: str, split: str, run_dir: Path) -> Server:
    cmd = [str(Path(sys.executable).with_name("skippy")), "up", "--model", model, "--split", split,
           "--lane-count", "16", "--openai-generation-concurrency", "16", "--bind", "127.0.0.1:0",
           "--run-dir", str(run_dir)]
    with open(run_dir.parent / "skippy-up.stderr", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    lines: queue.Queue[bytes] = queue.Queue()  # stdout, drained by a thread so the ready wait can time out
    threading.Thread(target=_drain, args=(proc.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + 300
    server = Server("skippy", proc, "", 0, None)
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            match = READY.search(lines.get(timeout=0.5).decode())
        except queue.Empty:
            continue
        if match:
            host, port = match.group(1).removeprefix("http://").rsplit(":", 1)
            server.host, server.port, server.model = host, int(port), match.group(2)
            return server
    stop(server)
    raise SystemExit(f"bench: skippy up did not get ready (see {run_dir.parent / 'skippy-up.stderr'})")


def start_llama(model: Path, log_path: Path) -> Server:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port, threads = int(s.getsockname()[1]), len(os.sched_getaffinity(0))
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1", "--port",
           str(port), "--n_ctx", "2048", "--n_threads", str(threads), "--n_threads_batch", str(threads),
           "--interrupt_requests", "False"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server("llama-cpp-python", proc, "127.0.0.1", port, None)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/v1/models")
            if conn.getresponse().status == 200:
                return server
        except OSError:
            time.sleep(0.3)
    stop(server)
    raise SystemExit(f"bench: llama_cpp.server did not get ready (see {log_path})")


def stop(server: Server, timeout_s: float = 30.0) -> int | None:
    """SIGINT, wait; then SIGKILL the process group."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGINT)
        try:
            server.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait()
    return server.proc.returncode


def run_http_bench(args: argparse.Namespace) -> int:
    model = resolve_model_path(args.model)
    levels = [int(x) for x in args.levels.split(",")]
    ensure_llama_server()
    banned, prompt_tokens = vocab_facts(model)
    servers: list[Server] = []
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM also stops both servers
    with tempfile.TemporaryDirectory(prefix="skippy-bench-http-") as tmp:
        try:
            print(f"bench: starting skippy up and llama_cpp.server on {model.name} (logs in {tmp})", file=sys.stderr)
            servers.append(start_skippy(args.model, args.split, Path(tmp) / "run"))
            servers.append(start_llama(model, Path(tmp) / "llama-server.log"))
            results = asyncio.run(sweep(servers, levels, args.max_tokens, banned, args.unique_prompts))
        finally:
            codes = {s.name: stop(s) for s in servers}
            print(f"bench: stopped {codes}", file=sys.stderr)
    header = (f"model {model.name}; skippy: 2 stages split at {args.split}, 16 lanes, generation concurrency 16; "
              f"llama-cpp-python {LLAMA_SERVER_REQ.rsplit('==', 1)[1]} server, n_ctx 2048, "
              f"{len(os.sched_getaffinity(0))} threads\nprompt {prompt_tokens} tokens, max_tokens {args.max_tokens}, "
              f"temperature 0, EOG ids {banned} banned by logit_bias; N = max(2c, 4) streamed requests per level")
    text = f"{header}\n\n{table(results)}"
    print(text)
    ensure_matplotlib()
    write_report(Path(args.out_dir), results, {
        "command": " ".join(["scripts/bench-http", *sys.argv[3:]]), "model": model.name,
        "prompt_tokens": prompt_tokens, "max_tokens": args.max_tokens, "banned_ids": banned,
        "cpus": len(os.sched_getaffinity(0))}, text, args.max_tokens)
    return 0


def add_to(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("http", help="skippy up vs llama-cpp-python's OpenAI server: tok/s, TTFT, TPOT by concurrency")
    p.add_argument("--model", default="default")
    p.add_argument("--split", default="9")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--levels", default="1,2,4,8,16", help="concurrency levels, comma separated")
    p.add_argument("--unique-prompts", action="store_true", help="prefix each prompt with a counter (no prefix cache)")
    p.add_argument("--out-dir", default=str(DOCS), help="where bench-http.json and bench-http.png go")
    p.set_defaults(run=run_http_bench)
