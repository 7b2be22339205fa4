"""The real OpenAI adapter served in the test's event loop, with a fake broker and a tiny model's tokenizer.

`FakeBroker` answers Status (ready, ctx `ctx_size`: 256) and every Submit with a few tokens and `length` (keeping the
last request's sampling), so each request exercises the adapter's parsing, tokenizing, detokenizing and
response paths without a pipeline; with `fail_after = N` it fails each request after N tokens instead
(`pipeline_failed`, as when a stage dies mid-stream); with `lose_after = N` it loses the first submission after N
tokens (`pipeline_lost`, as when stage 0 or the broker dies) and keeps each submission's resume point's `history`
(with `hold_resumed` the resumed submission then runs on without events); with
`not_ready = N` its next N Status answers say no pipeline is ready (`not_ready_after_loss`: from the loss on).
It keeps the last submitted prompt (`prompt`, token ids).
`adapter_server(model, api_key=..., limits=..., strict_request_fields=...)` yields the
HttpServer (port 0) and the fake broker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from skippy.adapter.chat_template import ChatTemplate
from skippy.adapter.routes import OpenAIAdapter
from skippy.http.server import HttpLimits, HttpServer
from skippy.protocol import ResumePoint, Status, TokenEvents
from skippy.request_events import RequestHandle
from skippy.runtime.slices import read_model_info
from skippy.runtime.tokenizer import Tokenizer

TOKENS = (72, 101, 108)


class FakeBroker:
    def __init__(self) -> None:
        self.submitted = 0
        self.cancelled = 0
        self.abandoned = 0  # cancels of requests whose client went away
        self.cancels: list[str] = []  # the submission ids cancelled, in order
        self.hold_resumed = False  # a resumed submission gets no events (it is still running)
        self.sampling: Any = None  # the last submitted request's
        self.fail_after: int | None = None
        self.max_tokens: int | None = None  # the last submitted request's
        self.prompt: list[int] = []  # the last submitted request's
        self.lose_after: int | None = None
        self.histories: list[tuple[int, ...]] = []  # each submission's resume point's history (() when none)
        self.not_ready = 0
        self.not_ready_after_loss = 0  # `not_ready` from the loss on
        self.ctx_size = 256

    async def status(self, timeout_s: float = 5.0) -> Status:
        if self.not_ready > 0:
            self.not_ready -= 1
            return Status(0, False, "stage0", 0, 0, 0, 0)
        return Status(0, True, None, 0, 0, 2, self.ctx_size)

    async def submit(self, prompt: Sequence[int], sampling: Any = None, max_tokens: int = 16,
                     stop_tokens: frozenset[int] = frozenset(), request_id: str | None = None, *,
                     resume_from: ResumePoint | None = None, progress: bool = False) -> RequestHandle:
        self.submitted += 1
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.prompt = list(prompt)
        history = resume_from.history if resume_from is not None else ()
        self.histories.append(history)
        handle = RequestHandle(request_id or "fake")
        if self.lose_after is not None:
            lose, self.lose_after, self.not_ready = self.lose_after, None, self.not_ready_after_loss
            rid = handle.request_id
            for token in TOKENS[:lose]:
                handle.put(TokenEvents(rid, (token,)))
            handle.put(TokenEvents(rid, (), "error", "stage 0 at ipc://x lost its connection", "pipeline_lost"))
            return handle
        rid = handle.request_id
        if self.hold_resumed and resume_from is not None:
            return handle
        for token in TOKENS[len(history):max_tokens if self.fail_after is None else self.fail_after]:
            handle.put(TokenEvents(rid, (token,)))
        if self.fail_after is not None:
            handle.put(TokenEvents(rid, (), "error", "stage 1 at ipc://x lost", "pipeline_failed"))
        else:
            handle.put(TokenEvents(rid, (), "length"))
        return handle

    async def cancel(self, request_id: str, abandoned: bool = False) -> None:
        self.cancelled += 1
        self.abandoned += abandoned
        self.cancels.append(request_id)


@asynccontextmanager
async def adapter_server(model: Path, *, api_key: str | None = None, limits: HttpLimits | None = None,
                         resume_timeout_s: float = 60.0, strict_request_fields: bool = False,
                         ) -> AsyncIterator[tuple[HttpServer, FakeBroker]]:
    """The adapter's route table (`OpenAIAdapter.router`, what `skippy adapter` serves) with production's
    limits unless `limits`, its metrics observing the server's connections."""
    tokenizer = Tokenizer(model)
    broker = FakeBroker()
    adapter = OpenAIAdapter(broker, tokenizer, ChatTemplate(tokenizer.model, read_model_info(model).architecture),  # type: ignore[arg-type]
                            "tiny", 8, api_key=api_key, resume_timeout_s=resume_timeout_s,
                            strict_request_fields=strict_request_fields)
    server = HttpServer(adapter.router(), limits=limits, observer=adapter.metrics)
    await server.start()
    try:
        yield server, broker
    finally:
        try:
            await server.close()
        finally:
            tokenizer.close()
