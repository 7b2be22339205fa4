"""The real OpenAI adapter served in the test's event loop, with a fake broker and a tiny model's tokenizer.

`FakeBroker` answers Status (ready, ctx 256) and every Submit with a few tokens and `length` (keeping the
last request's sampling), so each request exercises the adapter's parsing, tokenizing, detokenizing and
response paths without a pipeline. `adapter_server(model, api_key=..., limits=...)` yields the
HttpServer (port 0) and the fake broker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from skippy.http.adapter import OpenAIAdapter
from skippy.http.chat_template import ChatTemplate
from skippy.http.server import HttpLimits, HttpServer
from skippy.protocol import Status
from skippy.request_events import RequestHandle, TokenEvent
from skippy.runtime.slices import read_model_info
from skippy.runtime.tokenizer import Tokenizer

TOKENS = (72, 101, 108)


class FakeBroker:
    def __init__(self) -> None:
        self.submitted = 0
        self.cancelled = 0
        self.sampling: Any = None  # the last submitted request's

    async def status(self, timeout_s: float = 5.0) -> Status:
        return Status(0, True, None, 0, 0, 2, 256)

    async def submit(self, prompt: Sequence[int], sampling: Any = None, max_tokens: int = 16,
                     stop_tokens: frozenset[int] = frozenset(), request_id: str | None = None,
                     progress: bool = False) -> RequestHandle:
        self.submitted += 1
        self.sampling = sampling
        handle = RequestHandle(request_id or "fake")
        for token in TOKENS[:max_tokens]:
            handle.put(TokenEvent(token=token))
        handle.put(TokenEvent(finish_reason="length"))
        return handle

    async def cancel(self, request_id: str) -> None:
        self.cancelled += 1


@asynccontextmanager
async def adapter_server(model: Path, *, api_key: str | None = None,
                         limits: HttpLimits | None = None) -> AsyncIterator[tuple[HttpServer, FakeBroker]]:
    """The adapter's route table (`OpenAIAdapter.router`, what `skippy adapter` serves) with production's
    limits unless `limits`, its metrics observing the server's connections."""
    tokenizer = Tokenizer(model)
    broker = FakeBroker()
    adapter = OpenAIAdapter(broker, tokenizer, ChatTemplate(tokenizer.model, read_model_info(model).architecture),  # type: ignore[arg-type]
                            "tiny", 8, api_key=api_key)
    server = HttpServer(adapter.router(), limits=limits, observer=adapter.metrics)
    await server.start()
    try:
        yield server, broker
    finally:
        try:
            await server.close()
        finally:
            tokenizer.close()
