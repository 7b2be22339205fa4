"""`skippy bench hosts`, the measurements on one serving system (skippy over SSH hosts or llama.cpp's RPC split):
aggregate tok/s at each concurrency (skippy.bench.http_load), the TTFT of a long prompt made to a token count with
the server's own /tokenize, and what streams in flight see when a host is cut off: how long they pause, when they
resume, and whether they finish or fail (and with what)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import itertools
import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from skippy.bench.http_load import Server, bodies, run_level, stream_once

__all__ = ["StreamRecord", "host_loss", "long_prompt", "post_json", "rates", "ttft_s"]

_SEQ = itertools.count()
LOSS_TIMEOUT_S = 300.0  # a stream with no byte for this long is reported as hung


@dataclass
class StreamRecord:
    times: list[float] = field(default_factory=list)  # monotonic arrival of each content chunk
    error: str | None = None
    finish: str | None = None
    ended: float | None = None  # monotonic time the stream ended (finished, failed or cut)


def post_json(server: Server, path: str, body: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise SystemExit(f"bench: {server.name} answered {response.status} to POST {path}: {data[:300]!r}")
    return dict(json.loads(data))


def long_prompt(server: Server, tokens: int) -> tuple[str, int]:
    """A prompt of about `tokens` tokens by `server`'s tokenizer (distinct numbered words), and its exact count."""
    def text(words: int) -> str:
        return "Read these notes and say which number comes last. " + " ".join(f"n{i}" for i in range(words))

    def count(prompt: str) -> int:
        return len(post_json(server, "/tokenize", {"content": prompt})["tokens"])

    words = tokens // 2
    for _ in range(4):
        counted = count(text(words))
        if abs(counted - tokens) <= tokens // 100:
            break
        words = max(1, round(words * tokens / counted))
    prompt = text(words)
    return prompt, count(prompt)


async def _stream(server: Server, body: dict[str, Any], record: StreamRecord) -> None:
    reader, writer = await asyncio.open_connection(server.host, server.port)
    data = json.dumps({**body, "stream": True, **({"model": server.model} if server.model else {})}).encode()
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(data), data))
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if int(head.split(b" ", 2)[1]) != 200:
            record.error = (head + await reader.read(2000)).decode(errors="replace").splitlines()[0]
            return
        while line := await reader.readline():
            line = line.strip()
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            event = json.loads(line[5:])
            if "error" in event:
                error = event["error"]
                record.error = str(error.get("message", error) if isinstance(error, dict) else error)[:300]
                return
            choice = (event.get("choices") or [{}])[0]
            if choice.get("text"):
                record.times.append(time.monotonic())
            record.finish = choice.get("finish_reason") or record.finish
    except (OSError, asyncio.IncompleteReadError, ValueError) as error:
        record.error = record.error or f"{type(error).__name__}: {error}"
    finally:
        record.ended = time.monotonic()
        writer.close()


def ttft_s(server: Server, prompt: str) -> float:
    """Seconds from connecting to send `prompt` (1 token asked) to its first token."""
    body = json.dumps({"prompt": f"Note {next(_SEQ)}. {prompt}", "max_tokens": 1, "temperature": 0, "stream": True,
                       **({"model": server.model} if server.model else {})}).encode()
    sample = asyncio.run(stream_once(server.host, server.port, body))
    if not sample.tokens:
        raise SystemExit(f"bench: {server.name} gave no token for the long prompt (HTTP {sample.status})")
    return sample.ttft


def rates(server: Server, levels: list[int], max_tokens: int) -> dict[int, float]:
    """Aggregate tok/s at each concurrency: 2c requests (at least 2) of `max_tokens` tokens, prompts unique."""
    asyncio.run(run_level(server, bodies(server.model, 4, [], True), 1, 1))  # warm-up, not recorded
    out = {}
    for c in levels:
        out[c] = asyncio.run(run_level(server, bodies(server.model, max_tokens, [], True), c, max(2 * c, 2)))["tok_s"]
    return out


def _pause_after(times: list[float], cut_at: float) -> float | None:
    """The longest wait for a token from the cut on (None: no token came after it)."""
    after = [cut_at, *(t for t in times if t > cut_at)]
    return max(b - a for a, b in zip(after, after[1:])) if len(after) > 1 else None


def host_loss(server: Server, cut: Callable[[], None], streams: int, max_tokens: int,
              replanned: Callable[[], bool] | None = None, timeout_s: float = LOSS_TIMEOUT_S) -> dict[str, Any]:
    """`streams` streams of `max_tokens` tokens (no more than the server runs at once, so all are under way); once
    each has a token, `cut()` takes a host away. Per stream: the pause (its longest wait for a token after the cut,
    the cut included), and whether it finished or failed; `replanned` (polled) says when a re-plan was counted."""
    records = [StreamRecord() for _ in range(streams)]

    async def run_all() -> None:  # streams still open at the timeout are cancelled: they count as hung
        body = {"prompt": "Write a long story about the sea.", "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True}
        jobs = [_stream(server, {**body, "prompt": f"Note {next(_SEQ)}. {body['prompt']}"}, r) for r in records]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*jobs), timeout_s)

    runner = threading.Thread(target=asyncio.run, args=(run_all(),), daemon=True)
    runner.start()
    deadline = time.monotonic() + timeout_s
    while not all(r.times or r.error for r in records) and time.monotonic() < deadline:
        time.sleep(0.05)  # poll interval: every stream has begun
    cut_at = time.monotonic()
    cut()
    replanned_at = None
    while runner.is_alive():
        if replanned is not None and replanned_at is None and replanned():
            replanned_at = time.monotonic() - cut_at
        runner.join(0.5)
    pauses = [_pause_after(record.times, cut_at) for record in records]
    resumed = [p for p in pauses if p is not None]
    done = sum(r.error is None and len(r.times) > 0 and r.finish == "length" for r in records)
    errors = sorted({r.error for r in records if r.error})
    hung = sum(r.error is None and r.finish is None for r in records)
    return {"streams": streams, "timeout_s": timeout_s, "finished": done, "failed": streams - done - hung, "hung": hung,
            "errors": errors[:3], "resumed": len(resumed),
            "pause_median_s": round(statistics.median(resumed), 1) if resumed else None,
            "pause_max_s": round(max(resumed), 1) if resumed else None,
            "replanned_s": round(replanned_at, 1) if replanned_at is not None else None,
            "failed_at_s": round(max(r.ended for r in records if r.error and r.ended) - cut_at, 1)
            if any(r.error and r.ended for r in records) else None,
            "ended_s": round(max((r.times[-1] for r in records if r.times), default=cut_at) - cut_at, 1)}
