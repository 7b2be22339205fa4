"""Server-sent events framing for streamed responses (`StreamResponse` chunks)."""

from __future__ import annotations

import json
from typing import Any

SSE_DONE = b"data: [DONE]\n\n"


def sse_event(data: str | dict[str, Any], event: str | None = None) -> bytes:
    """One SSE event: `data: <payload>\\n\\n`; dicts become compact JSON, multi-line strings one `data:` per line.
    `event`: an `event: NAME` line first (the Responses and Anthropic streams name each event)."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    lines = payload.splitlines() or [""]
    head = f"event: {event}\n" if event else ""
    return (head + "".join(f"data: {line}\n" for line in lines)).encode() + b"\n"
