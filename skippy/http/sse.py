"""Server-sent events framing for streamed responses (`StreamResponse` chunks)."""

from __future__ import annotations

import json
from typing import Any

SSE_DONE = b"data: [DONE]\n\n"


def sse_event(data: str | dict[str, Any]) -> bytes:
    """One SSE event: `data: <payload>\\n\\n`; dicts become compact JSON, multi-line strings one `data:` per line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    lines = payload.splitlines() or [""]
    return "".join(f"data: {line}\n" for line in lines).encode() + b"\n"
