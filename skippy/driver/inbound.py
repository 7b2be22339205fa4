"""What comes back to stage 0 on its PULL: predictions, heartbeats, stage errors, credits, wire changes.

Predictions go to the driver's post-processing. A stage's ErrorReport fails the requests it names
(or its batch's); `stage_stopped`, or heartbeats that stop (`Liveness`), mark the stage dead: every
live request fails with an error naming it and new requests are refused until it heartbeats again,
when stage 0 greets it anew (credits reset, Hello) and serving resumes.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from skippy.protocol import ErrorCode, ErrorReport, FinishReason, Heartbeat, Hello, Message, Predictions, ProtocolError, Ready
from skippy.stage.handshake import connectable
from skippy.stage.links import handle_link_control

if TYPE_CHECKING:
    from skippy.driver.driver import Driver


class Inbound:
    def __init__(self, driver: Driver) -> None:
        self.driver = driver

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
            d.on_predictions(msg)
        elif isinstance(msg, Heartbeat):
            if d.liveness.heard(msg.stage_id):
                await self.revive(msg.stage_id)
        elif isinstance(msg, ErrorReport):
            self.on_error(msg)
        elif isinstance(msg, ProtocolError):
            d.log.warning("bad_message", code=msg.code, error=msg.message)
        elif isinstance(msg, Ready):
            d.log.info("downstream_ready", downstream=msg.sender.stage_id)
        elif not await handle_link_control(msg, d.downstream, d.log):
            d.log.warning("unexpected_message", kind=type(msg).__name__)

    def on_error(self, msg: ErrorReport) -> None:
        d = self.driver
        d.log.error("stage_error", from_stage=msg.stage_id, code=msg.code, error=msg.message, batch_id=msg.batch_id)
        error = f"stage {msg.stage_id}: {msg.message}"
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
        d = self.driver
        assert d.downstream is not None and d.inbound is not None
        await d.downstream.credits.reset()
        await d.downstream.send(Hello(d.identity, connectable(d.inbound.endpoint)))
        d.log.info("stage_back", stage=stage_id)

    async def monitor(self) -> None:
        while True:
            liveness = self.driver.liveness
            await asyncio.sleep(liveness.dead_after_s / 6)
            stage = liveness.silent()
            if stage is not None:
                self.mark_dead(stage, f"stage {stage} stopped responding (no heartbeat for {liveness.dead_after_s:g} s)")
