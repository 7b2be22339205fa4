"""What stage 0 checks before a request becomes a sequence: its numbers, its id, and room to wait for a lane.

`check_submission` refuses what can never run (a prompt over the context, max_tokens < 1, a resume point's
history already at max_tokens, an id in flight) with RuntimeUsageError (bad_request). `WaitingRoom` bounds
the requests waiting for a lane: past `max_waiting` it raises QueueFull (ErrorCode.QUEUE_FULL, HTTP 429),
counted by its `on_refused` callback and logged once per episode (`waiting_full`, then `waiting_full_ended`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from skippy.config import ServingOptions, default_queue_capacity, prompt_length_error
from skippy.driver.sequence import SequenceTable
from skippy.protocol import ResumePoint
from skippy.request_events import QueueFull
from skippy.runtime.errors import RuntimeUsageError
from skippy.transport.overflow import Overflows


def default_max_waiting(options: ServingOptions, lane_count: int) -> int:
    """Requests waiting for a lane at stage 0 at most: its OpenAI front's queue capacity, else the default one
    for `lane_count` lanes (clamp(8 x lanes, 16, 256)); at least `lane_count`."""
    capacity = options.openai.admission.queue_capacity if options.openai is not None else None
    return max(lane_count, capacity if capacity is not None else default_queue_capacity(lane_count))


def check_submission(table: SequenceTable, ctx_size: int, prompt_tokens: int, max_tokens: int,
                     resume_from: ResumePoint | None, request_id: str) -> None:
    unfit = prompt_length_error(prompt_tokens, ctx_size)
    if unfit is not None:
        raise RuntimeUsageError(unfit.message)
    if max_tokens < 1:
        raise RuntimeUsageError(f"max_tokens must be >= 1, got {max_tokens}")
    if resume_from is not None and len(resume_from.history) >= max_tokens:
        raise RuntimeUsageError(f"resume_from.history: {len(resume_from.history)} tokens, but max_tokens is {max_tokens}")
    if table.get(request_id) is not None:
        raise RuntimeUsageError(f"request id {request_id!r} is already in flight")


class WaitingRoom:
    def __init__(self, max_waiting: int, log: Any, on_refused: Callable[[], None]) -> None:
        self.max_waiting = max_waiting
        self._full = Overflows("waiting_full", log, on_refused)

    def enter(self, waiting: int, request_id: str) -> None:
        """One more request would wait (`waiting` wait now): refuse it when the room is full."""
        if waiting >= self.max_waiting:
            self._full.refused("waiting", max_waiting=self.max_waiting, request_id=request_id)
            raise QueueFull(f"stage 0 queue full: {waiting} requests waiting for a lane (at most {self.max_waiting})")
        self._full.ok("waiting", max_waiting=self.max_waiting)
