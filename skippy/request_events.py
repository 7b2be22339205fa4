"""What a submitted request gives back: its `TokenEvents`, one per step that gave it tokens, ending with a final
one (a finish reason, no tokens), and the errors a submission raises.

The events are the wire's own type (skippy.protocol.TokenEvents), so a token keeps one shape from stage 0's
postprocess to the adapter: stage 0 puts them on the request's `RequestHandle`, its request endpoint forwards
them (merged per step and client), and a `PipelineClient` puts what arrives on its own handle.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

import msgspec

from skippy.protocol import TokenEvents


class PipelineUnavailable(RuntimeError):
    """The pipeline cannot take requests now (a stage is down); the message names it."""


class QueueFull(RuntimeError):
    """Stage 0 cannot take a request now: as many as it lets wait for a lane are waiting (ErrorCode.QUEUE_FULL)."""


def merge_events(events: Sequence[TokenEvents]) -> TokenEvents:
    """A request's events of one step as one: the tokens in order, the last draws and progress report, the first
    chunk ends, the final fields of the last."""
    if len(events) == 1:
        return events[0]
    last = events[-1]
    return msgspec.structs.replace(
        last, tokens=tuple(t for e in events for t in e.tokens), logprobs=tuple(p for e in events for p in e.logprobs),
        draws=next((e.draws for e in reversed(events) if e.tokens), last.draws),
        chunk_ends=next((e.chunk_ends for e in events if e.chunk_ends), ()),
        progress=next((e.progress for e in reversed(events) if e.progress is not None), None))


def split_final(event: TokenEvents) -> tuple[TokenEvents, ...]:
    """A final event that carries tokens as two: the tokens, then the bare final (what a handle yields)."""
    if not (event.final and event.tokens):
        return (event,)
    tokens = msgspec.structs.replace(event, finish_reason=None, error=None, code=None, stats=None, sent_direct=None)
    return tokens, msgspec.structs.replace(event, tokens=(), logprobs=(), chunk_ends=(), progress=None)


class RequestHandle:
    """The consumer side of one request: iterate it for its TokenEvents; the last is final and has no tokens.

    `forward(listener)` hands every later event to `listener` instead (stage 0's request endpoint, which sends
    them on), so a forwarded request needs no queue and no task of its own."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._events: asyncio.Queue[TokenEvents] = asyncio.Queue()
        self._listener: Callable[[TokenEvents], None] | None = None

    def put(self, event: TokenEvents) -> None:
        if self._listener is not None:
            self._listener(event)
        else:
            self._events.put_nowait(event)

    def forward(self, listener: Callable[[TokenEvents], None]) -> None:
        while not self._events.empty():
            listener(self._events.get_nowait())
        self._listener = listener

    async def __aiter__(self) -> AsyncIterator[TokenEvents]:
        while True:
            event = await self._events.get()
            yield event
            if event.final:
                return

    async def collect(self) -> tuple[list[int], TokenEvents]:
        """All generated tokens and the final event."""
        tokens: list[int] = []
        async for event in self:
            tokens += event.tokens
            if event.final:
                return tokens, event
        raise AssertionError("unreachable")
