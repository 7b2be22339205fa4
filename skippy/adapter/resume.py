"""Resuming: a request whose stage 0 or broker died goes on from the tokens its client already has.

Stage 0 holds a request's KV and the broker holds its place; when either process dies the request ends with
`pipeline_lost` (the broker saw its stage 0 go, or this adapter's PipelineClient lost the broker). Nothing
the client was sent is lost: the adapter knows the prompt and every token it streamed, so `ResumingClient`
waits (polling the broker's status) until a pipeline is ready again and submits the request anew from
where it resumes (skippy.protocol.ResumePoint: those tokens, the prompt's chunk ends and the sampler's
draws, so stage 0 rebuilds the KV and the sampler state exactly); its events continue the same stream, each
token once, and the client's stream only pauses (the lost submission is cancelled first, in case a stage 0
that outlived its broker still runs it). A request that cannot be resumed within `resume_timeout_s` of its
loss ends with one pipeline_failed error naming what died. Each resume is counted (`on_resume`) and logged
(`request_resumed`, with the tokens it carried and the pause).

A new request that finds no pipeline ready waits the same way (`wait_ready`, bounded by the same deadline)
before it is refused with 503, so requests sent during a restart are served once it is over.

`gone` (the adapter reads it from the run's restarts.json: skippy.telemetry.restart_counts.pipeline_gone) says
why no pipeline will come back (a lost host, and the hosts left cannot hold the model): a waiting request then
ends at once with that reason, as every waiting one does with `stopping`'s once the adapter stops.

The handle it returns is the one the generation routes iterate (skippy.adapter.completions); `cancel` takes
the request id they know and cancels whichever submission is current.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from skippy.config.serving import DEFAULT_RESUME_TIMEOUT_S
from skippy.log import get_logger
from skippy.protocol import ErrorCode, FinishReason, ResumePoint, Status, TokenEvents
from skippy.request_events import PipelineUnavailable
from skippy.runtime.sampling import SamplingParams

READY_POLL_S = 0.2  # while a lost request waits for a pipeline, the broker's status is asked this often


class EventSource(Protocol):
    def __aiter__(self) -> AsyncIterator[TokenEvents]: ...


class Submitter(Protocol):
    """What the adapter talks to: skippy.client.PipelineClient (the broker)."""

    async def submit(self, prompt: Sequence[int], sampling: SamplingParams | None = None, max_tokens: int = 16,
                     stop_tokens: frozenset[int] = frozenset(), request_id: str | None = None, *,
                     resume_from: ResumePoint | None = None, progress: bool = False) -> EventSource: ...

    async def cancel(self, request_id: str, abandoned: bool = False) -> None: ...

    async def status(self, timeout_s: float = 5.0) -> Status: ...


@dataclass
class _ResumeTracker:
    """A ResumePoint as the request's events come (one rebuilt per token would copy the history each time)."""

    history: list[int] = field(default_factory=list)  # tokens the client was sent
    chunk_ends: tuple[int, ...] = ()
    draws: int = 0

    def add(self, event: TokenEvents) -> None:
        self.history += event.tokens
        self.chunk_ends = event.chunk_ends or self.chunk_ends
        self.draws = event.draws or self.draws

    def point(self) -> ResumePoint | None:
        """Where the request resumes; None while its client was sent nothing (it starts afresh)."""
        return ResumePoint(tuple(self.history), self.chunk_ends, self.draws) if self.history else None


@dataclass
class _Request:
    prompt: list[int]
    sampling: SamplingParams | None
    max_tokens: int
    stop_tokens: frozenset[int]
    request_id: str
    current: str  # the id of the submission now in flight
    sent: _ResumeTracker = field(default_factory=_ResumeTracker)
    progress: bool = False  # prompt progress reports asked for (Submit.progress)
    attempts: int = 0
    cancelled: bool = False


class ResumingClient:
    def __init__(self, client: Submitter, resume_timeout_s: float = DEFAULT_RESUME_TIMEOUT_S,
                 on_resume: Callable[[], None] | None = None, log: Any = None) -> None:
        self.client = client
        self.resume_timeout_s = resume_timeout_s
        self.on_resume = on_resume
        self.log = log or get_logger()
        self.active: dict[str, _Request] = {}
        self.gone: Callable[[], str | None] | None = None  # why no pipeline will come back (None: one may)
        self.stopping: str | None = None  # the adapter is stopping, for this reason

    def gone_reason(self) -> str | None:
        """Why waiting for a pipeline is pointless (None: one may come back)."""
        return self.stopping or (self.gone() if self.gone is not None else None)

    def not_ready(self, why: str) -> str:
        """What a new request that found no pipeline ready is told."""
        return self.gone_reason() or f"{why} (none became ready within {self.resume_timeout_s:g} s)"

    async def submit(self, prompt: Sequence[int], sampling: SamplingParams | None = None, max_tokens: int = 16,
                     stop_tokens: frozenset[int] = frozenset(), request_id: str = "", *,
                     progress: bool = False) -> AsyncIterator[TokenEvents]:
        req = _Request(list(prompt), sampling, max_tokens, stop_tokens, request_id, request_id, progress=progress)
        handle = await self.client.submit(req.prompt, sampling, max_tokens, stop_tokens, request_id=request_id,
                                          progress=progress)
        self.active[request_id] = req
        return self._events(req, handle)

    async def cancel(self, request_id: str, abandoned: bool = False) -> None:
        """Cancel whichever submission of the request is current; `abandoned`: its client went away."""
        req = self.active.pop(request_id, None)
        if req is not None:
            req.cancelled = True
        await self.client.cancel(req.current if req is not None else request_id, abandoned)

    async def _events(self, req: _Request, handle: EventSource) -> AsyncIterator[TokenEvents]:
        """The request's events across its submissions. It is forgotten at its final event, or, ended before that
        (its client left), by the `cancel` that follows: which then still names the current submission."""
        while True:
            final = None
            async for event in handle:
                if event.final:
                    final = event
                    break
                req.sent.add(event)
                yield event
            assert final is not None
            if final.code != ErrorCode.PIPELINE_LOST or req.cancelled:
                self.active.pop(req.request_id, None)
                yield final
                return
            resumed = await self._resume(req, final)
            if isinstance(resumed, TokenEvents):
                self.active.pop(req.request_id, None)
                yield resumed
                return
            handle = resumed

    async def _resume(self, req: _Request, lost: TokenEvents) -> EventSource | TokenEvents:
        """Wait for a ready pipeline and submit `req` again from what its client has; the final error when it
        cannot be within the deadline (or it was cancelled meanwhile)."""
        since = time.monotonic()
        deadline = since + self.resume_timeout_s
        self.log.warning("request_lost", request_id=req.request_id, generated_tokens=len(req.sent.history),
                         error=lost.error)
        lost_submission = req.current
        while time.monotonic() < deadline and not req.cancelled:
            if (gone := self.gone_reason()) is not None:
                return TokenEvents(req.request_id, (), FinishReason.ERROR, gone, ErrorCode.PIPELINE_FAILED)
            if await self._ready(deadline) is not None:
                # a stage 0 that outlived the broker still runs the lost submission: it is cancelled there
                await self.client.cancel(lost_submission)
                req.attempts += 1
                req.current = f"{req.request_id}-r{req.attempts}"
                handle = await self.client.submit(req.prompt, req.sampling, req.max_tokens, req.stop_tokens,
                                                  request_id=req.current, resume_from=req.sent.point(),
                                                  progress=req.progress)
                if self.on_resume is not None:
                    self.on_resume()
                self.log.info("request_resumed", request_id=req.request_id, submission=req.current,
                              history_tokens=len(req.sent.history), paused_ms=round((time.monotonic() - since) * 1e3, 3),
                              cause=lost.error)
                return handle
        if req.cancelled:
            return TokenEvents(req.request_id, (), FinishReason.CANCELLED)
        error = f"{lost.error}; no pipeline took it back within {self.resume_timeout_s:g} s"
        return TokenEvents(req.request_id, (), FinishReason.ERROR, error, ErrorCode.PIPELINE_FAILED)

    async def wait_ready(self) -> Status | None:
        """A new request that finds no pipeline ready (a process of it is restarting) waits for one rather than
        being refused: the broker's ready Status, or None when none is ready within `resume_timeout_s`."""
        since = time.monotonic()
        deadline = since + self.resume_timeout_s
        while time.monotonic() < deadline and self.gone_reason() is None:
            status = await self._ready(deadline)
            if status is not None:
                self.log.info("pipeline_waited", waited_ms=round((time.monotonic() - since) * 1e3, 3))
                return status
        self.log.warning("pipeline_not_ready", waited_s=self.resume_timeout_s)
        return None

    async def _ready(self, deadline: float) -> Status | None:
        """Bounded poll: the broker's Status once it answers that a pipeline is ready (else None, after a pause)."""
        try:
            status = await self.client.status(timeout_s=max(0.1, min(2.0, deadline - time.monotonic())))
            if status.ready and status.ctx_size > 0:
                return status
        except PipelineUnavailable:
            pass
        await asyncio.sleep(READY_POLL_S)  # the poll's period (the broker or stage 0 is restarting)
        return None
