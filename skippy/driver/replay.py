"""Nothing lost when a stage after stage 0 dies: the requests in flight pause, and replay once the chain is back.

When a later stage dies (heartbeats stop, `stage_stopped`, or a restart told by a new incarnation) every
running session *pauses* (`pause`): its windows in flight are forgotten (`Sequence.attempt` bumped by
the replay; the batches' records dropped) and nothing of it runs. Waiting requests are untouched and
nobody is admitted while the chain is down. When the chain answers stage 0's greeting again (`replay_paused`),
each paused session is configured anew on the final stage with its sampler's state (ConfigureSession
`history`: the committed tokens; `draws`: the RNG draws the dead final stage had made, as of the last
committed window) and prefilled again through the normal scheduler: its prompt and all committed tokens
but the last, which drives the next decode row, exactly as a fresh prompt's last token does. No token
is emitted twice; the client's stream only pauses. A session that cannot replay within `timeout_s`
(and a request waiting while the chain has been down that long) fails with one `pipeline_failed` error
naming the stage (`expire`); a restarted stage refused on its greeting fails the paused ones with that
reason (`fail_paused`). Each replay is counted (`skippy_driver_replays_total`,
`skippy_driver_replayed_tokens_total`) and logged once per request (`request_replay`, with `paused_ms`).

A request submitted from a resume point after its first stage 0 or broker died (skippy.protocol.Submit.resume_from)
is admitted as a replay from the start (`replay_submitted`): its committed tokens are prefilled again in the chunks
its prompt first ran in, then one per window, and it is counted the same way and logged (`request_replay_submitted`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from skippy.config.serving import DEFAULT_RESUME_TIMEOUT_S
from skippy.driver.batches import BatchLauncher
from skippy.driver.sequence import Paused, Sequence, SequenceTable
from skippy.driver.telemetry import DriverTelemetry
from skippy.protocol import ConfigureSession, ErrorCode, FinishReason, ResumePoint

Finish = Callable[[Sequence, FinishReason, str | None, ErrorCode | None], None]
Configure = Callable[[ConfigureSession], None]


class Replays:
    def __init__(self, table: SequenceTable, launcher: BatchLauncher, telemetry: DriverTelemetry, log: Any,
                 finish: Finish, configure: Configure, timeout_s: float = DEFAULT_RESUME_TIMEOUT_S) -> None:
        self.table = table
        self.launcher = launcher
        self.telemetry = telemetry
        self.log = log
        self.finish = finish
        self.configure = configure
        self.timeout_s = timeout_s
        self.down: Paused | None = None  # the stage whose death paused the chain, and since when

    def pause(self, stage_id: str, error: str) -> None:
        """A later stage is dead: pause every running session (again, if already paused: its windows since are
        lost too); a cancelled one ends now."""
        now = time.perf_counter()
        first = self.down is None
        if first:
            self.down = Paused(stage_id, now, error)
        self.launcher.forget(reset=first)  # what was in flight is lost; anything back for it is ignored
        for seq in list(self.table.running):
            seq.in_flight = 0
            if seq.cancelled:
                self.finish(seq, FinishReason.CANCELLED, None, None)
            elif seq.paused is None:
                seq.paused = Paused(stage_id, now)
                self.log.info("request_paused", request_id=seq.request_id, session_id=seq.session_id,
                              dead_stage=stage_id, generated_tokens=len(seq.generated), reason=error)

    def replay_paused(self) -> None:
        """The chain is back: every paused session is configured again with its sampler's state and replays."""
        self.down = None
        self.launcher.forget()  # launched while the stage was dying: stale
        now = time.perf_counter()
        for seq in list(self.table.running):
            paused = seq.paused
            if paused is None:
                continue
            if seq.prefix.restore is not None:  # the greeting emptied every prefix cache
                seq.prefix.restore = None
            seq.prefix.points = ()  # a replay records nothing (its fill is more than the prompt)
            replayed = seq.replay()
            self.configure(ConfigureSession(seq.session_id, seq.sampling.to_dict(), tuple(seq.generated), seq.draws))
            self.telemetry.replays.inc()
            self.telemetry.replayed_tokens.inc(len(seq.fill))
            self.log.info("request_replay", request_id=seq.request_id, session_id=seq.session_id,
                          dead_stage=paused.stage_id, replayed_tokens=len(seq.fill), replayed_committed=replayed,
                          draws=seq.draws, paused_ms=round((now - paused.since) * 1e3, 3))

    def replay_submitted(self, seq: Sequence, point: ResumePoint) -> None:
        """Make a request submitted from `point` a replay of its prompt and the point's history; count and log it."""
        seq.replay_from(point)
        self.telemetry.replays.inc()
        self.telemetry.replayed_tokens.inc(len(seq.fill))
        self.log.info("request_replay_submitted", request_id=seq.request_id, session_id=seq.session_id,
                      replayed_tokens=len(seq.fill), replayed_committed=len(seq.generated), draws=seq.draws)

    def expire(self) -> None:
        """Fail what waited too long for the chain: paused sessions, and requests waiting since it went down."""
        down = self.down
        if down is None:
            return
        now = time.perf_counter()
        error = f"stage {down.stage_id} died and did not come back within {self.timeout_s:g} s ({down.reason})"
        for seq in self.table.live():
            since = seq.paused.since if seq.paused is not None else max(seq.submitted_at, down.since)
            if now - since > self.timeout_s:
                self.finish(seq, FinishReason.ERROR, error, ErrorCode.PIPELINE_FAILED)

    def fail_paused(self, error: str) -> None:
        """The dead stage came back but was refused (another model or layer range): the paused sessions fail."""
        for seq in list(self.table.running):
            if seq.paused is not None:
                self.finish(seq, FinishReason.ERROR, error, ErrorCode.PIPELINE_FAILED)
