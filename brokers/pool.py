"""The broker's pipeline replicas: Status polling, readiness, admission capacity and routing.

Every `poll_interval_s` the pool asks each pipeline's stage 0 for its Status.  A pipeline is ready
when its Status says ready and stage 0 answered within `status_timeout_s`.  The pool's capacity is
the sum over ready pipelines of their per-pipeline concurrency (`AdmissionOptions.per_pipeline` of
each Status's lane_count). A request goes to the least loaded ready pipeline, or, with several, to the one
that was sent its prompt's beginning before unless that one is AFFINITY_SLACK requests busier
(brokers.prefix_routing: each replica's prefix cache is its own).
After every refresh it calls `on_change`; when a stage 0 that was
answering goes silent it calls `on_silent(link, reason)` (its requests are stranded) and
reconnects that link.  Readiness transitions are logged (`pipeline_ready`, `pipeline_unavailable`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import zmq.asyncio

from brokers.link import OnEvents, PipelineLink
from brokers.prefix_routing import PrefixAffinity
from skippy.config import AdmissionOptions
from skippy.log import get_logger
from skippy.protocol import WireVerdict

__all__ = ["AFFINITY_SLACK", "PipelinePool"]

AFFINITY_SLACK = 2  # requests in flight a replica holding a prompt's prefix may have beyond the least loaded


class PipelinePool:
    def __init__(self, ctx: zmq.asyncio.Context, endpoints: Sequence[str], admission: AdmissionOptions, *,
                 stage0_ids: Sequence[str | None] | None = None, on_events: OnEvents,
                 on_change: Callable[[], None], on_silent: Callable[[PipelineLink, str], None],
                 poll_interval_s: float = 0.5, status_timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not endpoints:
            raise ValueError("a broker needs at least one pipeline")
        self.ctx = ctx
        self.endpoints = list(endpoints)
        self.stage0_ids = list(stage0_ids) if stage0_ids is not None else [None] * len(self.endpoints)
        self.admission = admission
        self.poll_interval_s = poll_interval_s
        self.status_timeout_s = status_timeout_s
        self.clock = clock
        self.links: list[PipelineLink] = []
        self.changed = asyncio.Condition()
        self.log = get_logger()
        self._on_events, self._on_change, self._on_silent = on_events, on_change, on_silent
        self._seen: dict[PipelineLink, tuple[bool, bool]] = {}  # (answering, ready) at the last refresh
        self.affinity = PrefixAffinity()
        self._poller: asyncio.Task[None] | None = None
        self._notifiers: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self.links = [PipelineLink(self.ctx, endpoint, stage0_id=stage0, on_events=self._on_events,
                                   on_status=lambda _link: self.refresh(), status_timeout_s=self.status_timeout_s,
                                   clock=self.clock, on_lost=lambda link, why: self._on_silent(link, why))
                      for endpoint, stage0 in zip(self.endpoints, self.stage0_ids)]
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def close(self) -> None:
        tasks = [t for t in (self._poller, *self._notifiers) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for link in self.links:
            link.close()

    # -- state ---------------------------------------------------------------------------------
    def ready_links(self) -> list[PipelineLink]:
        return [link for link in self.links if link.ready()]

    @property
    def ready(self) -> bool:
        return any(link.ready() for link in self.links)

    def limit(self, link: PipelineLink) -> int:
        """Permits this pipeline contributes while ready."""
        return self.admission.per_pipeline(link.status.lane_count) if link.status is not None else 0

    @property
    def total_concurrency(self) -> int:
        return sum(self.limit(link) for link in self.ready_links())

    @property
    def ctx_size(self) -> int:
        """The smallest context of the ready pipelines (0 when none is ready)."""
        return min((link.status.ctx_size for link in self.ready_links() if link.status is not None), default=0)

    def wire(self) -> WireVerdict | None:
        """The activation wire's startup verdict of the first ready pipeline (each stage 0 certifies its own)."""
        return next((link.status.wire for link in self.ready_links() if link.status is not None), None)

    def dead_stage(self) -> str | None:
        return next((link.dead_stage() for link in self.links if not link.ready()), None)

    def unavailable_reason(self) -> str:
        return next((link.unavailable_reason() for link in self.links if not link.ready()), "no pipeline is ready")

    def route(self, prompt: Sequence[int] = ()) -> PipelineLink | None:
        """The ready pipeline with the fewest requests in flight, preferring one below its own limit; with several,
        the one holding the most of `prompt`'s beginning instead, when below its limit and within AFFINITY_SLACK."""
        def load(link: PipelineLink) -> int:
            return len(link.inflight)

        ready = self.ready_links()
        least = min(ready, key=lambda link: (load(link) >= self.limit(link), load(link)), default=None)
        if least is None or len(ready) == 1:
            return least
        blocks = self.affinity.blocks_of(prompt)
        warm = self.affinity.best(blocks, [link for link in ready if load(link) < self.limit(link)], load)[0]
        chosen = warm if warm is not None and load(warm) <= load(least) + AFFINITY_SLACK else least
        self.affinity.record(chosen, blocks)
        return chosen

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Wait (bounded) until `predicate()` holds; re-checked after every refresh."""
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(predicate), timeout_s)

    # -- refreshing ----------------------------------------------------------------------------
    def refresh(self) -> None:
        for link in self.links:
            was_answering, was_ready = self._seen.get(link, (False, False))
            answering, ready = link.answering(), link.ready()
            self._seen[link] = (answering, ready)
            if (answering, ready) != (was_answering, was_ready):
                self.log.info("pipeline_ready" if ready else "pipeline_unavailable", pipeline=link.endpoint,
                              reason=None if ready else link.unavailable_reason())
            if was_answering and not answering:
                self.affinity.forget(link)  # whatever it held is gone if it comes back
                self._on_silent(link, f"{link.unavailable_reason()} (no status for {self.status_timeout_s:g} s)")
                link.reconnect()  # what was queued toward the silent stage 0 is dropped
        self._on_change()
        task = asyncio.get_running_loop().create_task(self._notify())
        self._notifiers.add(task)
        task.add_done_callback(self._notifiers.discard)

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def _poll(self) -> None:
        while True:
            for link in self.links:
                await link.poll()
            self.refresh()
            await asyncio.sleep(self.poll_interval_s)  # the status period, not a synchronisation
