"""`skippy bench http`, the measurement: streamed /v1/completions requests over raw HTTP on asyncio
streams, each content chunk timed as it arrives (tokens counted from the stream's usage where the server
gives it: a server streaming per step sends several in one chunk); a level of the concurrency sweep is N requests with
C in flight, summarised as percentiles (ms), aggregate tok/s and the server's CPU ms per token by process
(skippy.bench.cpu_time); the sweep alternates the servers
level by level so machine noise hits both alike, or (`sweep_in_turn`) runs one server at a time, each alone
on the machine, in either order.  Starting the servers: skippy.bench.http;
the table, plot and JSON: skippy.bench.http_report.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from skippy.bench.cpu_time import per_token_ms, snapshot

__all__ = ["ORDERS", "PROMPT", "Results", "Sample", "Server", "bodies", "run_level", "stream_once", "sweep",
           "sweep_in_turn"]

PROMPT = ("The old lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lantern, "
          "a thermos of tea and a worn notebook. From the gallery he watched the fishing boats return, "
          "counted the gulls on the breakwater and wrote down the colour of the sky. One autumn night "
          "he noticed a light far out at sea")
_SEQ = itertools.count()
Results = dict[str, list[dict[str, Any]]]  # server name -> one summary (run_level) per concurrency level


@dataclass
class Sample:
    status: int
    ttft: float = 0.0  # seconds from connect to the first content chunk
    tpot: float = 0.0  # seconds per token after the first
    tokens: int = 0  # the stream's usage.completion_tokens, else its content chunks (one per token)
    chunks: int = 0  # content chunks (a server that streams per step sends several tokens in one)


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
        usage_tokens: int | None = None
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
                    event = json.loads(line[5:])
                    choice = (event.get("choices") or [{}])[0]
                    if choice.get("text"):
                        times.append(now)
                    if isinstance(event.get("usage"), dict):
                        usage_tokens = int(event["usage"].get("completion_tokens", 0))
        if not times:
            return Sample(status)
        tokens = usage_tokens or len(times)
        tpot = (times[-1] - times[0]) / (tokens - 1) if tokens > 1 else 0.0
        return Sample(status, times[0] - start, tpot, tokens, len(times))
    finally:
        writer.close()


async def run_level(server: Server, body: Callable[[], bytes], concurrency: int, n: int) -> dict[str, Any]:
    """n requests with `concurrency` in flight; the level's percentiles (ms) and aggregate tok/s."""
    gate = asyncio.Semaphore(concurrency)

    async def one() -> Sample:
        async with gate:
            return await stream_once(server.host, server.port, body())

    cpu_before = snapshot(server.proc.pid)
    start = time.perf_counter()
    samples = await asyncio.gather(*(one() for _ in range(n)))
    wall = time.perf_counter() - start
    cpu_after = snapshot(server.proc.pid)
    ok = [s for s in samples if s.status == 200 and s.tokens]
    pct = lambda xs, q: float(np.percentile(xs, q) * 1e3) if xs else float("nan")  # noqa: E731
    ttft, tpot = [s.ttft for s in ok], [s.tpot for s in ok]
    return {"concurrency": concurrency, "requests": n, "ok": len(ok), "status_429": sum(s.status == 429 for s in samples),
            "errors": sum(s.status not in (200, 429) or (s.status == 200 and not s.tokens) for s in samples),
            "tokens": sum(s.tokens for s in ok), "token_counts": sorted({s.tokens for s in ok}),
            "chunks": sum(s.chunks for s in ok), "wall_s": wall,
            "tok_s": sum(s.tokens for s in ok) / wall, "ttft_p50_ms": pct(ttft, 50), "ttft_p95_ms": pct(ttft, 95),
            "tpot_p50_ms": pct(tpot, 50), "tpot_p95_ms": pct(tpot, 95),
            "cpu_ms_per_token": per_token_ms(cpu_before, cpu_after, sum(s.tokens for s in ok))}


def bodies(model: str | None, max_tokens: int, banned: list[int], unique: bool) -> Callable[[], bytes]:
    """Request bodies; `unique` prefixes each prompt with a fresh number (no prefix-cache hits anywhere)."""
    def body() -> bytes:
        prompt = f"Note {next(_SEQ)}. {PROMPT}" if unique else PROMPT
        return json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True},
                           "ignore_eos": True, "logit_bias": {str(t): -100 for t in banned},
                           **({"model": model} if model else {})}).encode()
    return body


ORDERS = ("alternate", "sequential", "reverse")


async def sweep(servers: list[Server], levels: list[int], max_tokens: int, banned: list[int], unique: bool,
                rounds: int = 1) -> Results:
    """A warm-up per server, then every level on each server in turn, `rounds` times over (progress on
    stderr). A level's summary is that of its median-tok/s round (with every round's tok/s in
    `tok_s_rounds`), so a burst of other work on the machine during one round does not decide it."""
    results: Results = {s.name: [] for s in servers}
    for s in servers:  # warm-up, not recorded
        await run_level(s, bodies(s.model, 8, banned, unique), 1, 2)
    for c in levels:
        runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in servers}
        for r in range(rounds):
            for s in servers:
                runs[s.name].append(level := await run_level(s, bodies(s.model, max_tokens, banned, unique), c,
                                                             max(2 * c, 4)))
                print(f"  {s.name:<17} c={c:<3} {level['tok_s']:8.1f} tok/s" + (f"  (round {r + 1})" if rounds > 1 else ""),
                      file=sys.stderr, flush=True)
        for name, levels_run in runs.items():
            ordered = sorted(levels_run, key=lambda level: level["tok_s"])
            results[name].append({**ordered[(len(ordered) - 1) // 2], "tok_s_rounds": [lv["tok_s"] for lv in levels_run]})
    return results


def sweep_in_turn(starters: list[Callable[[], Server]], stop: Callable[[Server], object], levels: list[int],
                  max_tokens: int, banned: list[int], unique: bool, rounds: int = 1) -> Results:
    """One server at a time: start it, warm it up, run every level (`rounds` times), stop it; then the next.
    Nothing else of the benchmark runs meanwhile (`bench http --order sequential|reverse`)."""
    results: Results = {}
    for start in starters:
        server = start()
        try:
            results.update(asyncio.run(sweep([server], levels, max_tokens, banned, unique, rounds)))
        finally:
            stop(server)
    return results
