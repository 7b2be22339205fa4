"""What comes back to stage 0 on its PULL: predictions, heartbeats, stage errors, credits, wire changes.

Predictions go to the driver's post-processing. A stage's ErrorReport fails the requests it names
(or its batch's); `stage_stopped`, or heartbeats that stop (`Liveness`), mark the stage dead: the
requests in flight pause (skippy.driver.replay) and new ones wait at stage 0 until it is back. A
heartbeat from another process of a stage (its `incarnation`) means it restarted: the same, at once.
When the dead stage heartbeats again stage 0 greets it anew (credits reset, prefix caches emptied,
Hello to stage 1, which greets its own downstream before answering, so every stage below drops the
sessions it held) and serving resumes (the paused requests replay) only when the Ready comes back; its Ready carries the
downstream prefix cache bounds. A greeting refused (a restarted stage with another model or layer range)
is logged (`stage_refused`), fails the paused requests with that reason, the stage stays down, and it is
greeted again at most every
`REFUSED_RETRY_S`; a greeting not answered within `GREETING_TIMEOUT_S` is sent again.

`Inbound` holds no driver: it is built from the parts it reads (the liveness record, the paused
requests, the link to stage 1) and tells stage 0's driver what happened through `DriverCallbacks`, as
brokers.link's `PipelineLink` answers to its broker's callbacks.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Protocol

from skippy.driver.liveness import Heard, Liveness
from skippy.driver.replay import Replays
from skippy.protocol import (
    CacheCaps,
    ErrorCode,
    ErrorReport,
    Heartbeat,
    Hello,
    Message,
    Predictions,
    ProtocolError,
    Ready,
    StageIdentity,
)
from skippy.stage.handshake import connectable
from skippy.stage.links import DownstreamLink, handle_link_control
from skippy.transport.queues import PullQueue

__all__ = ["DriverCallbacks", "Greeting", "Inbound"]

GREETING_TIMEOUT_S = 10.0  # no Ready by then: greet again on the stage's next heartbeat
REFUSED_RETRY_S = 5.0  # a refused greeting is tried again after this long (logged each time)


@dataclass
class Greeting:
    """A Hello sent to bring `stage_id` back, waiting for the chain's Ready until `deadline` (monotonic)."""

    stage_id: str
    deadline: float


class DriverCallbacks(Protocol):
    """What `Inbound` tells stage 0's driver."""

    def on_predictions(self, msg: Predictions) -> None:
        """A batch's predictions are back."""

    def fail_batch(self, batch_id: int | None, session_ids: tuple[int, ...], error: str) -> None:
        """A stage reported `error` for a batch and sessions: fail their requests."""

    def pause_live(self, stage_id: str, error: str) -> None:
        """A later stage is dead: the requests in flight pause (skippy.driver.replay)."""

    def chain_back(self) -> None:
        """The dead stage answered its greeting: the paused requests replay."""

    def downstream_ready(self, cache: CacheCaps | None) -> None:
        """The chain below answered a greeting; `cache`: its prefix cache bounds."""

    async def forget_prefixes(self) -> None:
        """A greeting empties every stage's prefix cache: forget stage 0's entries too."""


class Inbound:
    def __init__(self, callbacks: DriverCallbacks, identity: StageIdentity, log: Any, *, liveness: Liveness,
                 replays: Replays, downstream: DownstreamLink | None) -> None:
        """`identity`: stage 0's, sent in each greeting; `log`: the driver's logger; `liveness`: which stages
        were heard from lately; `replays`: the paused requests (their deadline, their failure when the stage
        is refused); `downstream`: the link to stage 1 (None: a single stage)."""
        self.callbacks = callbacks
        self.identity = identity
        self.log = log
        self.liveness = liveness
        self.replays = replays
        self.downstream = downstream
        self.queue: PullQueue | None = None  # stage 0's PULL, from `run`
        self.greeting: Greeting | None = None
        self.retry_at = 0.0  # after a refusal, no greeting before this (monotonic)

    async def run(self, queue: PullQueue, early: list[Message]) -> None:
        """Dispatch `early` (what came during the handshake), then everything stage 0's PULL `queue` receives."""
        self.queue = queue
        for msg in early:
            await self.dispatch(msg)
        while True:
            await self.dispatch(await queue.recv())

    async def dispatch(self, msg: Message | ProtocolError) -> None:
        d, log = self.callbacks, self.log
        if isinstance(msg, Predictions):
            if msg.credit and self.downstream is not None:
                self.downstream.credits.release()
            d.on_predictions(msg)
        elif isinstance(msg, Heartbeat):
            heard = self.liveness.heard(msg.stage_id, msg.incarnation)
            if heard is Heard.RESTARTED:
                self.mark_dead(msg.stage_id, f"stage {msg.stage_id} restarted (the sessions it held are gone)")
                self.greeting, self.retry_at = None, 0.0  # a new process: whatever was pending, greet it now
            if heard is not Heard.ALIVE:
                await self.revive(msg.stage_id)
        elif isinstance(msg, ErrorReport):
            self.on_error(msg)
        elif isinstance(msg, ProtocolError):
            log.warning("bad_message", code=msg.code, error=msg.message)
        elif isinstance(msg, Ready):
            d.downstream_ready(msg.cache)  # a stage came back: its prefix cache bounds may differ
            log.info("downstream_ready", downstream=msg.sender.stage_id, prefix_cache=msg.cache)
            if self.greeting is not None:
                self.greeting = None
                log.info("stage_back", stage=self.liveness.revived())
                d.chain_back()
        elif not await handle_link_control(msg, self.downstream, log):
            log.warning("unexpected_message", kind=type(msg).__name__)

    def on_error(self, msg: ErrorReport) -> None:
        self.log.error("stage_error", from_stage=msg.stage_id, code=msg.code, error=msg.message, batch_id=msg.batch_id)
        error = f"stage {msg.stage_id}: {msg.message}"
        if msg.code is ErrorCode.HANDSHAKE and self.greeting is not None:
            self.log.error("stage_refused", stage=self.greeting.stage_id, error=error, retry_in_s=REFUSED_RETRY_S)
            self.greeting, self.retry_at = None, time.monotonic() + REFUSED_RETRY_S
            self.replays.fail_paused(f"stage {msg.stage_id} came back but was refused: {msg.message}")
            return
        if msg.code is ErrorCode.STAGE_STOPPED:
            self.mark_dead(msg.stage_id, error)
            return
        self.callbacks.fail_batch(msg.batch_id, msg.session_ids, error)

    def mark_dead(self, stage_id: str, error: str) -> None:
        if self.liveness.mark_dead(stage_id):
            self.log.error("stage_dead", dead_stage=stage_id, error=error)
        self.callbacks.pause_live(stage_id, error)

    async def revive(self, stage_id: str) -> None:
        """Greet the chain again (unless a greeting is pending or was just refused); the stage is back
        when the Ready arrives."""
        downstream = self.downstream
        assert downstream is not None and self.queue is not None
        now = time.monotonic()
        if (self.greeting is not None and now < self.greeting.deadline) or now < self.retry_at:
            return
        downstream.credits.reset()
        await self.callbacks.forget_prefixes()  # the Hello empties the prefix caches downstream: start every stage afresh
        self.greeting = Greeting(stage_id, now + GREETING_TIMEOUT_S)
        downstream.enqueue(Hello(self.identity, connectable(self.queue.endpoint)))  # not awaited: a PUSH may block
        self.log.info("stage_greeted", stage=stage_id)

    async def monitor(self) -> None:
        while True:
            liveness = self.liveness
            await asyncio.sleep(min(liveness.dead_after_s / 6, 0.5))  # also the paused requests' deadline tick
            self.replays.expire()
            stage = liveness.silent()
            if stage is not None:
                self.mark_dead(stage, f"stage {stage} stopped responding (no heartbeat for {liveness.dead_after_s:g} s)")
