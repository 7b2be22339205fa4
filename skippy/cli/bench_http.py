"""`skippy bench http`: `skippy up` against llama-cpp-python's own OpenAI server, over HTTP, in one run.

Same GGUF, same streamed /v1/completions requests (fixed ~64-token prompt, temperature 0, fixed
max_tokens, end-of-generation tokens banned via logit_bias as llama-cpp-python lacks ignore_eos), raw
HTTP on asyncio streams; the two servers alternate level by level of the concurrency sweep so machine
noise hits both alike. llama-cpp-python gets all cores and `--interrupt_requests False` (else a new
request cuts the running stream short). Its server extras, and matplotlib for the plot, are
pip-installed into the venv on first use; the built llama-cpp-python itself is reused, never rebuilt.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import itertools
import json
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
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from skippy.runtime.models import resolve_model_path

PROMPT = ("The old lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lantern, "
          "a thermos of tea and a worn notebook. From the gallery he watched the fishing boats return, "
          "counted the gulls on the breakwater and wrote down the colour of the sky. One autumn night "
          "he noticed a light far out at sea")
TARGETS = {1: 0.85, 8: 2.5}  # skippy tok/s / llama-cpp-python tok/s
LLAMA_SERVER_REQ = "llama-cpp-python[server]==0.3.36"
DOCS = Path(__file__).resolve().parents[2] / "docs"
_SEQ = itertools.count()
READY = re.compile(r"skippy ready: (http://\S+)/v1 \(model (\S+)\)")


@dataclass
class Sample:
    status: int
    ttft: float = 0.0  # seconds from connect to the first content chunk
    tpot: float = 0.0  # seconds per token after the first
    tokens: int = 0  # content chunks (one per token; checked against max_tokens)


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    host: str
    port: int
    model: str | None  # the `model` field to send (None: omit)


async def stream_once(host: str, port: int, body: bytes) -> Sample:
    """One streamed POST /v1/completions; content chunks are timed as they arrive."""
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                     b"Accept: text/event-stream\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                     % (host.encode(), port, len(body), body))
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            return Sample(status)
        chunked = b"transfer-encoding: chunked" in head.lower()
        times: list[float] = []
        buf = b""
        while True:
            if chunked:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                data = (await reader.readexactly(size + 2))[:-2] if size else b""
            else:
                data = await reader.read(65536)
            if not data:
                break
            now = time.perf_counter()
            *lines, buf = (buf + data).split(b"\n")
            for line in lines:
                line = line.strip()
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    choice = (json.loads(line[5:]).get("choices") or [{}])[0]
                    if choice.get("text"):
                        times.append(now)
        if not times:
            return Sample(status)
        tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
        return Sample(status, times[0] - start, tpot, len(times))
    finally:
        writer.close()


async def run_level(server: Server, body: Callable[[], bytes], concurrency: int, n: int) -> dict[str, Any]:
    """n requests with `concurrency` in flight; the level's percentiles (ms) and aggregate tok/s."""
    gate = asyncio.Semaphore(concurrency)

    async def one() -> Sample:
        async with gate:
            return await stream_once(server.host, server.port, body())

    start = time.perf_counter()
    samples = await asyncio.gather(*(one() for _ in range(n)))
    wall = time.perf_counter() - start
    ok = [s for s in samples if s.status == 200 and s.tokens]
    pct = lambda xs, q: float(np.percentile(xs, q) * 1e3) if xs else float("nan")  # noqa: E731
    ttft, tpot = [s.ttft for s in ok], [s.tpot for s in ok]
    return {"concurrency": concurrency, "requests": n, "ok": len(ok), "status_429": sum(s.status == 429 for s in samples),
            "errors": sum(s.status not in (200, 429) or (s.status == 200 and not s.tokens) for s in samples),
            "tokens": sum(s.tokens for s in ok), "token_counts": sorted({s.tokens for s in ok}), "wall_s": wall,
            "tok_s": sum(s.tokens for s in ok) / wall, "ttft_p50_ms": pct(ttft, 50), "ttft_p95_ms": pct(ttft, 95),
            "tpot_p50_ms": pct(tpot, 50), "tpot_p95_ms": pct(tpot, 95)}


def bodies(model: str | None, max_tokens: int, banned: list[int], unique: bool) -> Callable[[], bytes]:
    """Request bodies; `unique` prefixes each prompt with a fresh number (no prefix-cache hits anywhere)."""
    def body() -> bytes:
        prompt = f"Note {next(_SEQ)}. {PROMPT}" if unique else PROMPT
        return json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                           "ignore_eos": True, "logit_bias": {str(t): -100 for t in banned},
                           **({"model": model} if model else {})}).encode()
    return body


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


def vocab_facts(model: Path) -> tuple[list[int], int]:
    """(end-of-generation token ids, prompt length in tokens with BOS), from llama.cpp's own vocab."""
    import llama_cpp  # noqa: PLC0415

    llm = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    ids = [t for t in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    prompt_tokens = len(llm.tokenize(PROMPT.encode(), add_bos=True))
    llm.close()
    return ids, prompt_tokens


def start_skippy(model: str, split: str, run_dir: Path) -> Server:
    cmd = [str(Path(sys.executable).with_name("skippy")), "up", "--model", model, "--split", split,
           "--lane-count", "16", "--openai-generation-concurrency", "16", "--bind", "127.0.0.1:0",
           "--run-dir", str(run_dir)]
    with open(run_dir.parent / "skippy-up.stderr", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    lines: queue.Queue[bytes] = queue.Queue()  # stdout, drained by a thread so the ready wait can time out
    threading.Thread(target=lambda: [lines.put(x) for x in iter(proc.stdout.readline, b"")],  # type: ignore[union-attr]
                     daemon=True).start()
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


async def sweep(servers: list[Server], levels: list[int], max_tokens: int, banned: list[int], unique: bool
                ) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {s.name: [] for s in servers}
    for s in servers:  # warm-up, not recorded
        await run_level(s, bodies(s.model, 8, banned, unique), 1, 2)
    for c in levels:
        for s in servers:
            results[s.name].append(level := await run_level(s, bodies(s.model, max_tokens, banned, unique), c,
                                                             max(2 * c, 4)))
            print(f"  {s.name:<17} c={c:<3} {level['tok_s']:8.1f} tok/s", file=sys.stderr, flush=True)
    return results


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """skippy | llama-cpp-python side by side; p50/p95 pairs; ratio = skippy tok/s / llama-cpp-python tok/s."""
    head = ("conc", "tok/s sk", "tok/s ll", "ratio", "target", "TTFT ms sk", "TTFT ms ll", "TPOT ms sk",
            "TPOT ms ll", "429 sk/ll")
    widths = (4, 9, 9, 6, 10, 12, 12, 11, 11, 10)
    rows = [head]
    for a, b in zip(results["skippy"], results["llama-cpp-python"]):
        ratio, target = a["tok_s"] / b["tok_s"], TARGETS.get(a["concurrency"])
        mark = "" if target is None else f">={target:g} " + ("ok" if ratio >= target else "NO")
        pair = lambda r, k, f: f"{r[k + '_p50_ms']:{f}}/{r[k + '_p95_ms']:{f}}"  # noqa: E731
        rows.append((str(a["concurrency"]), f"{a['tok_s']:.1f}", f"{b['tok_s']:.1f}", f"{ratio:.2f}", mark,
                     pair(a, "ttft", ".0f"), pair(b, "ttft", ".0f"), pair(a, "tpot", ".1f"), pair(b, "tpot", ".1f"),
                     f"{a['status_429']}/{b['status_429']}"))
    return "\n".join("".join(f"{cell:>{w + 2}}" for cell, w in zip(row, widths)).rstrip() for row in rows)


def plot(results: dict[str, list[dict[str, Any]]], path: Path) -> None:
    try:
        import matplotlib  # noqa: PLC0415
    except ImportError:
        _pip("matplotlib")
        import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in results.items():
        cs = [r["concurrency"] for r in rows]
        left.plot(cs, [r["tok_s"] for r in rows], marker="o", label=name)
        right.plot(cs, [r["ttft_p50_ms"] for r in rows], marker="o", label=name)
    for ax, label in ((left, "aggregate output tok/s"), (right, "TTFT p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.set_xlabel("concurrent requests")
        ax.set_ylim(bottom=0)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("skippy up (2 stages) vs llama-cpp-python server, same GGUF")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


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
    counts = {c for rows in results.values() for r in rows for c in r["token_counts"]}
    if counts != {args.max_tokens}:
        print(f"warning: content chunks per request {sorted(counts)} != max_tokens {args.max_tokens}", file=sys.stderr)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ratios = {r["concurrency"]: r["tok_s"] / b["tok_s"] for r, b in zip(results["skippy"], results["llama-cpp-python"])}
    (out / "bench-http.json").write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "command": " ".join(["scripts/bench-http", *sys.argv[3:]]),
        "model": model.name, "prompt_tokens": prompt_tokens, "max_tokens": args.max_tokens, "banned_ids": banned,
        "cpus": len(os.sched_getaffinity(0)), "results": results, "tok_s_ratio": ratios,
        "targets": {str(c): {"min_ratio": t, "met": ratios.get(c, 0) >= t} for c, t in TARGETS.items()},
        "table": text}, indent=2) + "\n")
    plot(results, out / "bench-http.png")
    print(f"\nwrote {out / 'bench-http.json'} and {out / 'bench-http.png'}", file=sys.stderr)
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
