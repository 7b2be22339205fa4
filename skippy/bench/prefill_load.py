"""`skippy bench prefill`, the requests: prompts of a given token length, a long prompt's time to first token,
and the decode rate of a concurrent stream while that prompt prefills.

Prompts are sentences of common words drawn from a seeded generator, cut to the length in the model's own
tokens (llama.cpp's vocab, as the servers tokenize it), so each seed's text shares nothing with another's: no
prefix cache (skippy's or llama-server's) can hit. The servers read the same text in a round. A request is a
streamed POST /v1/completions (temperature 0, end-of-generation ids banned, 2 tokens); its TTFT is from
sending it to the first streamed token, and the prompt's length is the server's own `usage.prompt_tokens`;
the CPU seconds its processes used meanwhile (skippy.bench.cpu_time) move less with other work on the machine
than wall time does (a core shared with another process's work is not counted, only the server's own).
The concurrent stream is a short prompt decoding all the while: the tokens it streams between the long
prompt's send and its first token give its rate during the prefill, and the longest gap between two of them
the stall the prefill caused.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skippy.bench.cpu_time import snapshot
from skippy.bench.http_load import Server

__all__ = ["PromptMaker", "StreamRate", "TtftSample", "measure", "parse_lengths"]

WORDS = ("river", "stone", "garden", "window", "letter", "morning", "engine", "harbor", "winter", "lantern",
         "market", "forest", "bridge", "castle", "silver", "meadow", "thunder", "pencil", "ladder", "candle",
         "orchard", "compass", "village", "mirror", "feather", "island", "basket", "signal", "valley", "copper",
         "walked", "carried", "opened", "noticed", "painted", "counted", "followed", "gathered", "remembered",
         "quiet", "bright", "narrow", "ancient", "gentle", "distant", "heavy", "golden", "hollow", "patient",
         "the", "a", "of", "and", "under", "beside", "across", "toward", "after", "before", "while", "because",
         "seven", "twelve", "forty", "every", "each", "some", "many", "few", "old", "new", "small", "large")
STREAM_PROMPT = "Write a long story about a lighthouse keeper and the ships he watched over the years."


def parse_lengths(text: str) -> list[int]:
    """'1k,4k,16k' or '1000,4096' -> token counts (k = 1024)."""
    lengths = []
    for part in text.split(","):
        part = part.strip().lower()
        try:
            lengths.append(int(float(part[:-1]) * 1024) if part.endswith("k") else int(part))
        except ValueError:
            raise SystemExit(f"bench prefill: --lengths takes token counts like 1k,4k,16k, got '{text}'") from None
    if not lengths or min(lengths) < 16:
        raise SystemExit(f"bench prefill: --lengths must be token counts of at least 16, got '{text}'")
    return lengths


class PromptMaker:
    """Prompt texts of an exact length in the model's tokens, one per seed."""

    def __init__(self, model: Path) -> None:
        import llama_cpp  # noqa: PLC0415

        self._llm = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)

    def tokens(self, text: str) -> int:
        return len(self._llm.tokenize(text.encode(), add_bos=True))

    def text(self, n_tokens: int, seed: int) -> str:
        """`n_tokens` tokens (with BOS, as a completion's prompt is tokenized) of sentences drawn with `seed`."""
        rng = random.Random(seed)
        sentences: list[str] = [f"Note {seed}."]
        while self.tokens(" ".join(sentences)) < n_tokens + 16:
            for _ in range(64):
                words = rng.choices(WORDS, k=rng.randint(6, 14))
                sentences.append(" ".join(words).capitalize() + ".")
        ids = self._llm.tokenize(" ".join(sentences).encode(), add_bos=True)
        bos = len(ids) - len(self._llm.tokenize(" ".join(sentences).encode(), add_bos=False))
        return self._llm.detokenize(ids[bos:n_tokens]).decode(errors="ignore")

    def close(self) -> None:
        self._llm.close()


def body(server: Server, prompt: str, max_tokens: int, banned: list[int]) -> bytes:
    return json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}, "ignore_eos": True,
                       "logit_bias": {str(t): -100 for t in banned},
                       **({"model": server.model} if server.model else {})}).encode()


async def events(server: Server, payload: bytes) -> AsyncIterator[tuple[float, dict[str, Any]]]:
    """(arrival time, event) for each `data:` event of one streamed completion; raises on a non-200 answer."""
    reader, writer = await asyncio.open_connection(server.host, server.port, limit=1 << 22)
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                     b"Accept: text/event-stream\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                     % (server.host.encode(), server.port, len(payload), payload))
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if (status := int(head.split(b" ", 2)[1])) != 200:
            raise RuntimeError(f"{server.name} answered {status}: {(await reader.read(500)).decode(errors='replace')}")
        chunked, buf = b"transfer-encoding: chunked" in head.lower(), b""
        while data := await (_chunk(reader) if chunked else reader.read(65536)):
            now = time.perf_counter()
            *lines, buf = (buf + data).split(b"\n")
            for line in lines:
                line = line.strip()
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    yield now, json.loads(line[5:])
    finally:
        writer.close()


async def _chunk(reader: asyncio.StreamReader) -> bytes:
    """The next chunk of a chunked body (b"" at its end)."""
    size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
    return (await reader.readexactly(size + 2))[:-2] if size else b""


@dataclass
class StreamRate:
    """The concurrent stream's token times (perf_counter)."""

    times: list[float] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)

    def during(self, start: float, end: float) -> dict[str, float]:
        """Its tokens/s before `start` (since its 4th token) and within [start, end], and its longest gap there."""
        inside = [t for t in self.times if start <= t <= end]
        before = [t for t in self.times[3:] if t < start]
        edges = [start, *inside, end]
        return {"before_tok_s": (len(before) - 1) / (before[-1] - before[0]) if len(before) > 1 else 0.0,
                "during_tok_s": len(inside) / (end - start) if end > start else 0.0,
                "longest_gap_s": max(b - a for a, b in zip(edges, edges[1:]))}


async def _stream(server: Server, payload: bytes, rate: StreamRate) -> None:
    async for now, event in events(server, payload):
        if (event.get("choices") or [{}])[0].get("text") is not None:
            rate.times.append(now)
            if len(rate.times) >= 8:
                rate.started.set()


@dataclass
class TtftSample:
    server: str
    ttft_s: float
    prompt_tokens: int
    sent_at: float  # wall clock (time.time()) when the prompt was sent: for the per-chunk timeline
    first_at: float  # wall clock of its first token
    cpu_s: float  # CPU seconds the server's processes used from the send to the end of the stream (user + system)
    cpu_by_role: dict[str, float]  # the same by process (skippy: each stage, the broker, the adapter)
    stream: dict[str, float] | None = None  # the concurrent stream's rates (StreamRate.during)


async def measure(server: Server, prompt: str, banned: list[int], stream_tokens: int = 0) -> TtftSample:
    """One long prompt's TTFT; with `stream_tokens`, a concurrent stream of that many tokens decodes meanwhile
    (started first, measured from its 4th token, and cut off once the prompt's first token is back)."""
    rate, task = StreamRate(), None
    if stream_tokens:
        task = asyncio.create_task(_stream(server, body(server, STREAM_PROMPT, stream_tokens, []), rate))
        waiter = asyncio.create_task(rate.started.wait())
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task.done() and not rate.started.is_set():  # a fast server may finish a started stream at once: kept
            task.result()  # raises what ended it
            raise RuntimeError(f"{server.name}: the concurrent stream ended after {len(rate.times)} tokens")
    cpu_before = snapshot(server.proc.pid)
    sent_wall, start = time.time(), time.perf_counter()
    first = first_wall = 0.0
    prompt_tokens = 0
    try:
        async for now, event in events(server, body(server, prompt, 2, banned)):
            if not first and (event.get("choices") or [{}])[0].get("text") is not None:
                first, first_wall = now, time.time()
            if isinstance(event.get("usage"), dict):
                prompt_tokens = int(event["usage"].get("prompt_tokens", 0))
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    cpu_after = snapshot(server.proc.pid)
    if not first:
        raise RuntimeError(f"{server.name}: the prompt's stream carried no token")
    by_role = {role: round(after - cpu_before[role], 2) for role, after in cpu_after.items() if role in cpu_before}
    return TtftSample(server.name, first - start, prompt_tokens, sent_wall, first_wall, round(sum(by_role.values()), 2),
                      by_role, rate.during(start, first) if stream_tokens else None)
