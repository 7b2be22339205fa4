"""Launching micro-batches: stage 0's own layers in its runtime thread, then the wire to stage 1.

`BatchLauncher` owns what a batch needs between planning and its predictions coming back: the
batch ids, the record of every batch in flight, stage 0's compute, and the downstream link (its
credits and wire condition). `complete` hands a returned batch's record to the driver, except for a
batch launched by `round_trip` (the speculation calibration's sweeps, skippy.driver.verify_costs): its
predictions go to the one awaiting them, and never reach the driver's post-processing. An
`OpRecorder`, when a test installs one, sees every batch and release in stage order so the run can
be replayed on the unsplit model; nothing is kept otherwise.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from skippy.driver.prefix_index import CacheOps
from skippy.driver.scheduler import PlannedWindow
from skippy.log import get_logger
from skippy.protocol import KeptPrefix, Predictions, PrefixRef, StageTiming, Window
from skippy.runtime.windows import SessionWindow
from skippy.stage.final_sampling import VerifySpec
from skippy.stage.links import DownstreamLink
from skippy.stage.worker import RuntimeWorker

# session, pos_start, tokens, outputs, draft, head, (restore, record, evict) (see skippy.protocol.Window)
WindowRecord = tuple[int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...], int | None,
                     tuple[PrefixRef | None, tuple[PrefixRef, ...], tuple[int, ...]]]


class OpRecorder(Protocol):
    def batch(self, windows: list[WindowRecord]) -> None: ...
    def keep(self, kept: tuple[KeptPrefix, ...], evict: tuple[int, ...]) -> None: ...
    def release(self, session_ids: tuple[int, ...]) -> None: ...


@dataclass
class InFlight:
    plan: list[PlannedWindow]
    compute_ms: float
    credit_wait_ms: float = 0.0
    sent: asyncio.Future[float] | None = None
    waiter: asyncio.Future[Predictions] | None = None  # set by `BatchLauncher.round_trip`: its predictions go there
    ahead: int = 0  # batches in flight when this one was launched (it may queue behind them at every stage)

    @property
    def rows(self) -> int:
        return sum(len(pw.tokens) for pw in self.plan)

    def write_ms(self) -> float:
        """Time the batch took to go onto the socket (0 until known)."""
        sent = self.sent
        return sent.result() if sent is not None and sent.done() and sent.exception() is None else 0.0


@dataclass
class DriverStats:
    iterations: int = 0
    max_rows: int = 0
    max_sessions: int = 0
    max_in_flight: int = 0
    max_session_in_flight: int = 0  # most windows of one session in flight at once (pipelined prefill/verify)
    hop_ms: deque[list[float]] = field(default_factory=lambda: deque(maxlen=4096))
    compute_ms: dict[str, float] = field(default_factory=dict)  # per stage, summed over batches

    def count(self, entry: InFlight, in_flight: int) -> None:
        self.iterations += 1
        self.max_rows = max(self.max_rows, entry.rows)
        self.max_sessions = max(self.max_sessions, len(entry.plan))
        self.max_in_flight = max(self.max_in_flight, in_flight)
        self.max_session_in_flight = max(self.max_session_in_flight, *(pw.seq.in_flight for pw in entry.plan))

    def observe(self, msg: Predictions) -> None:
        self.hop_ms.append([(b.recv_at - a.sent_at) * 1e3 for a, b in zip(msg.timings, msg.timings[1:])])
        for t in msg.timings:
            self.compute_ms[t.stage_id] = self.compute_ms.get(t.stage_id, 0.0) + t.compute_ms


class BatchLauncher:
    def __init__(self, worker: RuntimeWorker, downstream: DownstreamLink | None, stage_id: str) -> None:
        self.worker = worker
        self.downstream = downstream
        self.stage_id = stage_id
        self.inflight: dict[int, InFlight] = {}
        self.stats = DriverStats()
        self.recorder: OpRecorder | None = None
        self.log = get_logger()
        self._ids = itertools.count(1)
        self.epoch = 0  # bumped by `forget`: a launch that straddles it is stale
        self.forgotten: set[int] = set()  # batches dropped by `forget` since `forget(reset=True)`
        self.mtp_draft_max = 0  # native MTP: drafts each window with outputs asks the final stage for (docs/mtp.md)

    def forget(self, *, reset: bool = False) -> None:
        """Drop every batch in flight (a later stage died, or came back): what comes back for them, and any
        launch still computing or waiting for a credit, is stale. `reset`: start a new record of them."""
        if reset:
            self.forgotten = set()
        self.epoch += 1
        self.forgotten.update(self.inflight)
        self.inflight.clear()

    def _stale(self, batch_id: int, epoch: int) -> bool:
        """True (and `batch_id` forgotten) when `forget` ran since the launch began at `epoch`."""
        if epoch == self.epoch:
            return False
        self.forgotten.add(batch_id)
        self.log.info("stale_launch", batch_id=batch_id)
        return True

    async def launch(self, plan: list[PlannedWindow], ops: Sequence[CacheOps] = (), *,
                     waiter: asyncio.Future[Predictions] | None = None) -> Predictions | None:
        """Run stage 0's layers on `plan` (with each window's prefix cache `ops`) and send the result on.
        A single-stage pipeline has its predictions at once and returns them, and so does a batch
        none of whose windows is left to send (all missed a restore); otherwise they arrive later on
        stage 0's PULL. Raises what the runtime raises (the caller fails the plan's requests). A
        `waiter` gets the batch's predictions instead of the driver (`round_trip`)."""
        batch_id, epoch = next(self._ids), self.epoch
        for pw in plan:
            pw.seq.in_flight += 1
            if pw.is_prefill:
                pw.seq.prefilled = pw.pos_start + len(pw.tokens)
                if not pw.seq.replay_committed:  # the prompt's chunks, for a replay to repeat
                    pw.seq.chunk_ends[:] = [*(e for e in pw.seq.chunk_ends if e <= pw.pos_start), pw.seq.prefilled]
        cache = list(ops) or [CacheOps()] * len(plan)
        windows = [SessionWindow(pw.seq.session_id, pw.pos_start, len(pw.tokens), pw.outputs, pw.tokens, *c)
                   for pw, c in zip(plan, cache)]
        if self.recorder is not None:
            self.recorder.batch([(w.session_id, w.pos_start, tuple(pw.tokens.tolist()), w.outputs, pw.draft, pw.head,
                                  (c.restore, c.record, c.evict)) for w, pw, c in zip(windows, plan, cache)])
        mtp = [self.mtp_draft_max if pw.outputs else 0 for pw in plan]
        computed = await self.worker.compute(windows, None, [VerifySpec(pw.draft, pw.head, k) for pw, k in zip(plan, mtp)])
        if self._stale(batch_id, epoch):  # its sessions paused meanwhile: nothing of it may reach a stage
            return None
        wire = tuple(Window(w.session_id, w.pos_start, w.n_tokens, w.outputs, pw.draft, pw.head, *c,
                            input_tokens=tuple(pw.tokens.tolist()) if self.mtp_draft_max else (), mtp_draft_max=k)
                     for w, pw, c, k in zip(windows, plan, cache, mtp) if w.session_id not in computed.missed)
        if self.downstream is None or not wire:
            self._register(batch_id, InFlight(plan, computed.compute_ms, waiter=waiter))
            timing = StageTiming(self.stage_id, computed.started_at, computed.compute_ms, 0.0, time.time())
            return Predictions(batch_id, computed.predictions, (timing,), computed.missed)
        sent, wait_ms = await self.downstream.forward_while(
            lambda: epoch == self.epoch, batch_id, wire, computed.hidden, self.stage_id, computed.started_at,
            computed.compute_ms, missed=computed.missed)
        if sent is None:  # forgotten while it waited for a credit: not sent
            self._stale(batch_id, epoch)
            return None
        # in flight from here: the batch holds a credit (predictions cannot arrive before this returns)
        self._register(batch_id, InFlight(plan, computed.compute_ms, wait_ms, sent, waiter))
        return None

    async def round_trip(self, plan: list[PlannedWindow]) -> Predictions:
        """Launch `plan` and await its predictions; they are this call's, not the driver's."""
        waiter: asyncio.Future[Predictions] = asyncio.get_running_loop().create_future()
        done = await self.launch(plan, waiter=waiter)
        if done is not None:  # answered at once (a single stage)
            self.complete(done.batch_id, done)
        return await waiter

    def _register(self, batch_id: int, entry: InFlight) -> None:
        entry.ahead = len(self.inflight)
        self.inflight[batch_id] = entry
        self.stats.count(entry, len(self.inflight))

    def complete(self, batch_id: int, msg: Predictions | None = None) -> InFlight | None:
        """Forget batch `batch_id`, back with its predictions `msg` or failed (no `msg`): its record, for the
        driver to post-process or fail. None when it was not in flight (logged, when `msg` came for it) or
        when a `round_trip` awaits it: that call has `msg` now, or fails at once."""
        entry = self.inflight.pop(batch_id, None)
        if entry is None:
            if msg is not None:
                self.log.warning("unknown_batch", batch_id=batch_id)
            return None
        if entry.waiter is None:
            return entry
        if not entry.waiter.done():  # (a round trip that timed out is gone)
            if msg is not None:
                entry.waiter.set_result(msg)
            else:
                entry.waiter.set_exception(RuntimeError(f"batch {batch_id} failed downstream"))
        return None

    def record_release(self, session_ids: tuple[int, ...], kept: tuple[KeptPrefix, ...] = (),
                       evict: tuple[int, ...] = ()) -> None:
        if self.recorder is not None:
            if kept or evict:
                self.recorder.keep(kept, evict)
            self.recorder.release(session_ids)
