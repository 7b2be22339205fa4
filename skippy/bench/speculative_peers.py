"""`skippy bench speculative`, the peers: llama.cpp's `llama-server` with and without its own n-gram drafting,
run in the same cells on the same token prompts as skippy's modes.

Each peer is one llama-server process (one host: no hop, so a peer runs in the 0 ms cells only), built from
the llama-cpp-python sdist (skippy.bench.llama_server_build), with as many slots as skippy has lanes, the
same context per slot and every core. A round POSTs the prompts' token ids to `/completion`, c at a time
(`stream`, `return_tokens`, greedy: temperature 0, `cache_prompt` off as skippy's bench driver has no prefix
cache) and times every streamed token as skippy's rounds do (skippy.bench.speculative_load.Timed), so the
tables compare like with like; its output tokens are kept, so the report can say where llama-server's
greedy output differs from skippy's plain decoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from skippy.bench.http_load import Server
from skippy.bench.http_servers import llama_server_args, start_llama_server, stop
from skippy.bench.llama_server_build import ensure_llama_server_binary, llama_server_version
from skippy.bench.speculative_load import Timed, closed_loop
from skippy.bench.speculative_workloads import Prompt

__all__ = ["PEERS", "parse_peers", "peer_facts", "peer_wave", "running_peers"]

PEERS = {"llama-server": False, "llama-server-ngram": True}  # name -> its n-gram drafting (--spec-type ngram-simple)


def parse_peers(text: str) -> list[str]:
    """`--peers`: comma-separated names of PEERS, or "none"."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    if names == ["none"]:
        return []
    unknown = [p for p in names if p not in PEERS]
    if unknown:
        raise SystemExit(f"bench: --peers: unknown {', '.join(unknown)}; choose from {', '.join(PEERS)} or none")
    return names


def peer_facts(names: list[str], slots: int, ctx_size: int) -> str:
    """What each peer ran, for the report."""
    threads = len(os.sched_getaffinity(0))
    return "; ".join(f"{name} = llama.cpp llama-server {llama_server_version()} "
                     f"`{' '.join(llama_server_args(slots, threads, PEERS[name], ctx_size))}`" for name in names)


@contextlib.contextmanager
def running_peers(names: list[str], model: Path, directory: Path, slots: int, ctx_size: int,
                  binary: Path | None = None) -> Iterator[dict[str, Server]]:
    """The named llama-servers (`binary`, else the cached build), started one after the other (logs in `directory`),
    stopped on exit."""
    servers: dict[str, Server] = {}
    try:
        if names:
            binary = binary or ensure_llama_server_binary()  # built once (minutes), then cached
            threads = len(os.sched_getaffinity(0))
            for name in names:
                print(f"bench: starting {name} ({slots} slots, {threads} threads)", file=sys.stderr, flush=True)
                servers[name] = start_llama_server(binary, model, directory / f"{name}.log", slots, threads,
                                                   speculative=PEERS[name], slot_ctx=ctx_size)
        yield servers
    finally:
        for server in servers.values():
            stop(server)


async def _stream(server: Server, prompt: Prompt, max_tokens: int) -> Timed:
    body = json.dumps({"prompt": prompt.tokens, "n_predict": max_tokens, "stream": True, "temperature": 0.0,
                       "return_tokens": True, "cache_prompt": False}).encode()
    timed = Timed(submitted=time.perf_counter())
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(b"POST /completion HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (server.host.encode(), len(body), body))
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if int(head.split(b" ", 2)[1]) != 200:
            raise RuntimeError(f"bench: {server.name} answered {head.splitlines()[0].decode()} for {prompt.name}")
        # server-sent events, one `data: {...}` line per chunk; chunked framing lines are skipped (not JSON)
        while line := await reader.readline():
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            now = time.perf_counter()
            for token in event.get("tokens") or []:
                if not timed.tokens:
                    timed.first = now
                timed.tokens.append(int(token))
                timed.times.append(now)
                timed.last = now
            if event.get("stop"):
                break
    finally:
        writer.close()
    if not timed.tokens:
        raise RuntimeError(f"bench: {server.name} produced no token for {prompt.name}")
    return timed


async def peer_wave(server: Server, prompts: list[Prompt], max_tokens: int, concurrency: int | None = None) -> list[Timed]:
    """The prompts streamed from one llama-server, `concurrency` at a time (all at once when None), as skippy's
    rounds are; returns when every stream has ended."""
    return await closed_loop(lambda p: _stream(server, p, max_tokens), prompts, concurrency)
