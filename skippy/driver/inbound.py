"""What comes back to stage 0 on its PULL: predictions, heartbeats, stage errors, credits, wire changes.

Predictions go to the driver's post-processing. A stage's ErrorReport fails the requests it names
(or its batch's); `stage_stopped`, or heartbeats that stop (`Liveness`), mark the stage dead: every
live request fails with an error naming it and new requests are refused until it is back. A
heartbeat from another process of a stage (its `incarnation`) means it restarted: the same, at once.
When the dead stage heartbeats again stage 0 greets it anew (credits reset, prefix caches emptied,
Hello to stage 1, which greets its own downstream before answering, so every stage below drops the
sessions it held) and serving resumes only when the Ready comes back; its Ready carries the downstream
prefix cache bounds. A greeting refused (a restarted stage with another model or layer range) is
logged (`stage_refused`), the stage stays down, and it is greeted again at most every
`REFUSED_RETRY_S`; a greeting not answered within `GREETING_TIMEOUT_S` is sent again.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from skippy.driver.liveness import Heard
from skippy.protocol import ErrorCode, ErrorReport, FinishReason, Heartbeat, Hello, Message, Predictions, ProtocolError, Ready
from skippy.stage.handshake import connectable
from skippy.stage.links import handle_link_control

if TYPE_CHECKING:
    from skippy.driver.driver import Driver


GREETING_TIMEOUT_S = 10.0  # no Ready by then: greet again on the stage's next heartbeat
REFUSED_RETRY_S = 5.0  # a refused greeting is tried again after this long (logged each time)


@dataclass
class Greeting:
    """A Hello sent to bring `stage_id` back, waiting for the chain's Ready until `deadline` (monotonic)."""

    stage_id: str
    deadline: float


class Inbound:
    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.greeting: Greeting | None = None
        self.retry_at = 0.0  # after a refusal, no greeting before this (monotonic)

    async def run(self, early: list[Message]) -> None:
        inbound = self.driver.inbound
        assert inbound is not None
        for msg in early:
            await self.dispatch(msg)
        while True:
            await self.dispatch(await inbound.recv())

    async def dispatch(self, msg: Message | ProtocolError) -> None:
        d = self.driver
        if isinstance(msg, Predictions):
            if msg.credit and d.downstream is not None:
                d.downstream.credits.release()
            d.on_predictions(msg)
        elif isinstance(msg, Heartbeat):
            heard = d.liveness.heard(msg.stage_id, msg.incarnation)
            if heard is Heard.RESTARTED:
                self.mark_dead(msg.stage_id, f"stage {msg.stage_id} restarted (the sessions it held are gone)")
                self.greeting, self.retry_at = None, 0.0  # a new process: whatever was pending, greet it now
            if heard is not Heard.ALIVE:
                await self.revive(msg.stage_id)
        elif isinstance(msg, ErrorReport):
            self.on_error(msg)
        elif isinstance(msg, ProtocolError):
            d.log.warning("bad_message", code=msg.code, error=msg.message)
        elif isinstance(msg, Ready):
            d.prefix.set_downstream(msg.cache)  # a stage came back: its prefix cache bounds may differ
            d.log.info("downstream_ready", downstream=msg.sender.stage_id, prefix_cache=msg.cache)
            if self.greeting is not None:
                self.greeting = None
                d.log.info("stage_back", stage=d.liveness.revived())
        elif not await handle_link_control(msg, d.downstream, d.log):
            d.log.warning("unexpected_message", kind=type(msg).__name__)

    def on_error(self, msg: ErrorReport) -> None:
        d = self.driver
        d.log.error("stage_error", from_stage=msg.stage_id, code=msg.code, error=msg.message, batch_id=msg.batch_id)
        error = f"stage {msg.stage_id}: {msg.message}"
        if msg.code is ErrorCode.HANDSHAKE and self.greeting is not None:
            d.log.error("stage_refused", stage=self.greeting.stage_id, error=error, retry_in_s=REFUSED_RETRY_S)
            self.greeting, self.retry_at = None, time.monotonic() + REFUSED_RETRY_S
            return
        if msg.code is ErrorCode.STAGE_STOPPED:
            self.mark_dead(msg.stage_id, error)
            return
        entry = d.launcher.complete(msg.batch_id) if msg.batch_id is not None else None
        seqs = [pw.seq for pw in entry.plan] if entry else []
        seqs += [s for s in d.table.live() if s.session_id in msg.session_ids]
        for seq in seqs:
            seq.in_flight = 0
            d.finish(seq, FinishReason.ERROR, error)

    def mark_dead(self, stage_id: str, error: str) -> None:
        d = self.driver
        if d.liveness.mark_dead(stage_id):
            d.log.error("stage_dead", dead_stage=stage_id, error=error)
        d.fail_live(error, ErrorCode.PIPELINE_FAILED)

    async def revive(self, stage_id: str) -> None:
        """Greet the chain again (unless a greeting is pending or was just refused); the stage is back
        when the Ready arrives."""
        d = self.driver
        assert d.downstream is not None and d.inbound is not None
        now = time.monotonic()
        if (self.greeting is not None and now < self.greeting.deadline) or now < self.retry_at:
            return
        d.downstream.credits.reset()
        d.prefix.clear()  # the Hello empties the prefix caches downstream: start every stage afresh
        if d.runtime.prefix is not None:
            await d.worker.call(d.runtime.prefix.clear)
        self.greeting = Greeting(stage_id, now + GREETING_TIMEOUT_S)
        d.downstream.enqueue(Hello(d.identity, connectable(d.inbound.endpoint)))  # not awaited: a PUSH may block
        d.log.info("stage_greeted", stage=stage_id)

    async def monitor(self) -> None:
        while True:
            liveness = self.driver.liveness
            await asyncio.sleep(liveness.dead_after_s / 6)
            stage = liveness.silent()
            if stage is not None:
                self.mark_dead(stage, f"stage {stage} stopped responding (no heartbeat for {liveness.dead_after_s:g} s)")
