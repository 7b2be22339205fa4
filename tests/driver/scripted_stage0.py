"""Stage 0 as its request endpoint sees it (`skippy.driver.requests.Stage0`), scripted by a test: the test fills
each request's handle itself; cancels are recorded and end the request."""

from __future__ import annotations

import asyncio

from skippy.protocol import FinishReason, ResumePoint, Status, TokenEvents
from skippy.request_events import RequestHandle
from skippy.runtime.sampling import SamplingParams


class ScriptedStage0:
    """Stage 0 as the request endpoint sees it: handles the test fills, cancels recorded."""

    def __init__(self) -> None:
        self.handles: dict[str, RequestHandle] = {}
        self.cancelled: list[str] = []
        self.submitted = asyncio.Queue[str]()

    def submit(self, prompt: list[int], sampling: SamplingParams | None, max_tokens: int, stop_tokens: frozenset[int],
               request_id: str | None, resume_from: ResumePoint | None = None, progress: bool = False) -> RequestHandle:
        assert request_id is not None
        handle = self.handles[request_id] = RequestHandle(request_id)
        self.submitted.put_nowait(request_id)
        return handle

    def cancel(self, request_id: str, abandoned: bool = False) -> None:
        self.cancelled.append(request_id)
        self.handles[request_id].put(TokenEvents(request_id, (), FinishReason.CANCELLED))

    def status(self, nonce: int) -> Status:
        return Status(nonce, True, None, len(self.handles), 0, 2, 512)
