"""What a submitted request gives back: a stream of token events ending with a finish reason."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from skippy.protocol import ErrorCode, FinishReason, PromptProgress, TokenLogprob
from skippy.protocol.stats import RequestStats


class PipelineUnavailable(RuntimeError):
    """The pipeline cannot take requests now (a stage is down); the message names it."""


class QueueFull(RuntimeError):
    """Stage 0 cannot take a request now: as many as it lets wait for a lane are waiting (ErrorCode.QUEUE_FULL)."""


@dataclass(frozen=True)
class RequestEvent:
    token: int | None = None  # a generated token, or None on the final event
    finish_reason: FinishReason | None = None  # set on the final event
    error: str | None = None  # why, when finish_reason is "error"
    logprob: TokenLogprob | None = None  # when the request asked for logprobs
    code: ErrorCode | None = None  # error class (unavailable, pipeline_failed, ...)
    stats: RequestStats | None = None  # on the final event: the request's numbers
    # what resuming the request needs, besides its tokens (skippy.protocol.ResumePoint):
    draws: int = 0  # the sampler's RNG draws after this token
    chunk_ends: tuple[int, ...] = ()  # on the first token: where the prompt's prefill chunks ended
    progress: PromptProgress | None = None  # a prompt progress report (no token; Submit.progress)

    @property
    def final(self) -> bool:
        return self.finish_reason is not None


class RequestHandle:
    """The consumer side of one request; iterate it for TokenEvents (the last one is final)."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._events: asyncio.Queue[RequestEvent] = asyncio.Queue()

    def put(self, event: RequestEvent) -> None:
        self._events.put_nowait(event)

    async def __aiter__(self) -> AsyncIterator[RequestEvent]:
        while True:
            event = await self._events.get()
            yield event
            if event.final:
                return

    async def collect(self) -> tuple[list[int], RequestEvent]:
        """All generated tokens and the final event."""
        tokens: list[int] = []
        async for event in self:
            if event.final:
                return tokens, event
            if event.token is not None:  # else a progress report
                tokens.append(event.token)
        raise AssertionError("unreachable")
