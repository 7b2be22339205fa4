"""A returned batch reaches its requests, and the one way a request ends at stage 0.

`Delivery.predictions` takes a batch's predictions off the launcher's record, feeds the speculation engine
what the batch cost and what it accepted, turns them into committed tokens (`postprocess`) and puts each
request's events on its handle. `finish` ends a request once (its stats, its prompt kept in the prefix
index when it ended well, its telemetry and `request_done` line); `fail`, `fail_batch` and `fail_live` end
requests with an error. Built from the driver's parts and a `wake` callback for its schedule loop: it
holds no driver.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from skippy.driver.batches import BatchLauncher
from skippy.driver.postprocess import Outcome, postprocess
from skippy.driver.prefix_index import PrefixIndex
from skippy.driver.sequence import Sequence, SequenceTable
from skippy.driver.speculative.engine import Speculation
from skippy.driver.telemetry import DriverTelemetry
from skippy.protocol import ErrorCode, FinishReason, Predictions
from skippy.protocol.stats import RequestStats

__all__ = ["Delivery"]


class Delivery:
    def __init__(self, table: SequenceTable, launcher: BatchLauncher, prefix: PrefixIndex,
                 speculation: Speculation | None, telemetry: DriverTelemetry, log: Any, ctx_size: int,
                 wake: Callable[[], None]) -> None:
        """`wake`: the schedule loop looks again (a batch came back, a lane came free)."""
        self.table = table
        self.launcher = launcher
        self.prefix = prefix
        self.speculation = speculation
        self.telemetry = telemetry
        self.log = log
        self.ctx_size = ctx_size
        self.wake = wake

    def predictions(self, msg: Predictions) -> None:
        entry = self.launcher.complete(msg.batch_id, msg)
        if entry is None:  # not in flight, or the launcher's own round trip (calibration)
            return
        self.launcher.stats.observe(msg)
        hops = self.launcher.stats.hop_ms[-1]
        if self.speculation is not None and not any(pw.is_prefill for pw in entry.plan):
            if entry.ahead == 0:  # else its hops include waiting behind those batches (seconds behind prefill chunks)
                self.speculation.observe_hops(hops)
            self.speculation.observe_batch(entry.rows, sum(t.compute_ms for t in msg.timings))
        outcomes = postprocess(entry, msg, self.ctx_size)
        # the schedule loop wakes first: the next batch is launched before the requests' consumers and the
        # telemetry of this one run (they are not on the token's critical path)
        self.wake()
        for outcome in outcomes:
            self._deliver(outcome)
        # what was in flight is counted now: by the time the observation runs the next batch is in flight too
        asyncio.get_running_loop().call_soon(self.telemetry.iteration, entry, msg, hops, len(self.launcher.inflight) + 1)

    def _deliver(self, outcome: Outcome) -> None:
        self.telemetry.outcome(outcome)
        if self.speculation is not None and outcome.stale_rows:
            self.speculation.stale(outcome.seq.session_id, outcome.stale_rows)
        if self.speculation is not None and outcome.committed:
            self.speculation.committed(outcome.seq.session_id, outcome.proposed, outcome.returned, outcome.committed)
            self.speculation.receive_mtp(outcome.seq.session_id, outcome.mtp_draft)
        if outcome.chain_miss:  # a stage lacked the prefix it restores: prefill it all again
            self.prefix.chain_miss(outcome.seq)
        for event in outcome.events:
            outcome.seq.handle.put(event)
        if outcome.finish is not None:
            self.finish(outcome.seq, outcome.finish, outcome.error)

    def finish(self, seq: Sequence, reason: FinishReason, error: str | None = None,
               code: ErrorCode | None = None) -> None:
        speculative = self.speculation.summary(seq.session_id) if self.speculation is not None else None
        stats = RequestStats(self.speculation.stats(seq.session_id) if self.speculation is not None else None,
                             self.prefix.stats(seq))
        if self.table.finish(seq, reason, error, code, stats):
            self.prefix.finish(seq, keep=reason in (FinishReason.STOP, FinishReason.LENGTH))
            self.telemetry.finished(seq, reason, error, speculative)
            self.log.info("request_done", **seq.summary(reason, error), speculative=speculative)
            self.wake()

    def fail(self, seqs: list[Sequence], error: str, code: ErrorCode | None = None) -> None:
        for seq in seqs:
            seq.in_flight = 0
            self.finish(seq, FinishReason.ERROR, error, code)

    def fail_batch(self, batch_id: int | None, session_ids: tuple[int, ...], error: str) -> None:
        """A stage reported `error` for a batch and sessions: fail their requests."""
        entry = self.launcher.complete(batch_id) if batch_id is not None else None
        if entry is None and batch_id in self.launcher.forgotten:
            self.log.warning("stale_batch_error", batch_id=batch_id, error=error)  # forgotten when a stage died
            return
        named = [s for s in self.table.live() if s.session_id in session_ids and s.paused is None]
        self.fail([*(pw.seq for pw in entry.plan), *named] if entry else named, error)

    def fail_live(self, error: str, code: ErrorCode | None = None) -> None:
        """Every live request fails (the process failed); nothing stays in flight."""
        self.fail(self.table.live(), error, code)
        self.launcher.inflight.clear()
