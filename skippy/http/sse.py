"""Server-sent events framing for streamed responses (`StreamResponse` chunks), and keep-alive pings.

`with_pings` sends an SSE comment (`: ping`, which SSE clients skip) whenever a stream has been silent for
the interval, as llama-server's `--sse-ping-interval` does: a long prompt's prefill is then not mistaken
for a dead connection by clients and proxies that time out idle reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

SSE_DONE = b"data: [DONE]\n\n"
SSE_PING = b": ping\n\n"
DEFAULT_PING_INTERVAL_S = 30.0  # llama-server's default --sse-ping-interval


def sse_event(data: str | dict[str, Any], event: str | None = None) -> bytes:
    """One SSE event: `data: <payload>\\n\\n`; dicts become compact JSON, multi-line strings one `data:` per line.
    `event`: an `event: NAME` line first (the Responses and Anthropic streams name each event)."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    lines = payload.splitlines() or [""]
    head = f"event: {event}\n" if event else ""
    return (head + "".join(f"data: {line}\n" for line in lines)).encode() + b"\n"


async def with_pings(chunks: AsyncIterator[bytes], interval_s: float | None) -> AsyncIterator[bytes]:
    """`chunks`, with SSE_PING whenever none came for `interval_s` (None or <= 0: no pings)."""
    if interval_s is None or interval_s <= 0:
        async for chunk in chunks:
            yield chunk
        return
    pending: asyncio.Future[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(chunks.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield SSE_PING
                continue
            finished, pending = pending, None
            try:
                chunk = finished.result()
            except StopAsyncIteration:
                return
            yield chunk
    finally:  # the client left (or the stream ended): stop the producer where it waits, then close it
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        with contextlib.suppress(RuntimeError):
            await chunks.aclose()  # type: ignore[attr-defined]
