"""Finished sessions forgotten on every stage: in stage 0's runtime and proposers, then downstream.

`SessionReleases.flush` releases what the sequence table finished since the last flush, with the prompts
the prefix index keeps as cache entries (and the entries it evicts), in stage 0's runtime thread and then
in one ReleaseSessions to stage 1 (also sent with no session when the prefix index gave entries' cells back to the
KV pool: skippy.driver.cell_pool); `now` releases given sessions at once (the calibration session's). Built
from the driver's parts; `downstream` is set once stage 1 is connected (None: a single stage).
"""

from __future__ import annotations

from collections.abc import Callable

from skippy.driver.batches import BatchLauncher
from skippy.driver.prefix_index import PrefixIndex
from skippy.driver.sequence import SequenceTable
from skippy.driver.speculative.engine import Speculation
from skippy.protocol import KeptPrefix, ReleaseSessions
from skippy.stage.links import DownstreamLink
from skippy.stage.worker import RuntimeWorker

__all__ = ["SessionReleases"]


class SessionReleases:
    def __init__(self, worker: RuntimeWorker, table: SequenceTable, prefix: PrefixIndex, launcher: BatchLauncher,
                 speculation: Speculation | None, on_released: Callable[[tuple[int, ...]], None] = lambda ids: None,
                 ) -> None:
        """`on_released`: told the sessions each flush released on every stage (the KV pool's account)."""
        self.worker = worker
        self.on_released = on_released
        self.table = table
        self.prefix = prefix
        self.launcher = launcher
        self.speculation = speculation
        self.downstream: DownstreamLink | None = None

    async def now(self, session_ids: tuple[int, ...]) -> None:
        """Forget sessions on every stage now (the calibration session)."""
        await self.worker.call(self._release, session_ids)
        if self.downstream is not None:
            self.downstream.enqueue(ReleaseSessions(session_ids))

    async def flush(self) -> None:
        ids = self.table.take_releases()
        if not ids and not self.prefix.evictions_pending:
            return
        keep, evict = self.prefix.take_kept()  # finished prompts + replies kept as prefix cache entries
        await self.worker.call(self._release, ids, keep, evict)
        self.prefix.release(ids)
        self.on_released(ids)
        self.launcher.record_release(ids, keep, evict)
        if self.downstream is not None:
            self.downstream.enqueue(ReleaseSessions(ids, keep, evict))

    def _release(self, session_ids: tuple[int, ...], keep: tuple[KeptPrefix, ...] = (), evict: tuple[int, ...] = ()) -> None:
        """Runtime thread: forget finished sessions in stage 0's runtime and their proposers."""
        self.worker.release(session_ids, keep, evict)
        if self.speculation is not None:
            self.speculation.release(session_ids)
