"""The one thread that calls a stage's llama.cpp runtime, and the compute every stage does on a batch.

llama.cpp calls block, so each stage process (stage 0's driver included) runs them in one worker
thread, in submission order, while its event loop keeps moving frames. `compute` is a stage's
work on a batch: run its layers; at the final stage, sample every output row.

A decode-sized batch (at most INLINE_MAX_ROWS rows, and expected to take at most INLINE_MAX_MS by the ms
per row measured so far) runs on the event loop's own thread when the runtime thread is idle: handing it over
and back costs two thread wake-ups per stage and token, a noticeable share of a token (and the compute
itself ran faster on the loop's thread; measured: docs/measurements.md, 'Runtime-thread hand-off'). After
it the loop yields once, so what arrived meanwhile (status polls, token events) is served before the next
step (a whole model on one slow core, 25 ms a row, ran inline steps back to back without yielding: tokens
came in one burst at the end and the broker, hearing no status for 2 s, gave the pipeline up). Bigger or
much slower batches (prefill chunks) go to the runtime thread so the loop keeps serving while they run.
The runtime thread is not the default for every slow decode: a second thread calling llama.cpp costs its
own malloc arena and OpenMP team (+48 MiB of a Gemma final stage's RSS, measured in tests/netns).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import numpy as np

from skippy.protocol import KeptPrefix, SessionPrediction
from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.windows import SessionWindow
from skippy.stage.final_sampling import Frontier, VerifySpec, predict

P = ParamSpec("P")
R = TypeVar("R")

INLINE_MAX_ROWS = 32  # a batch this small may run inline (decode, short verify windows)...
INLINE_MAX_MS = 500.0  # ...if it is expected to block the loop this long at most (the broker's status timeout is 2 s)


@dataclass(frozen=True)
class Computed:
    """A stage's result for one batch: activations for the next stage, or the final stage's samples."""

    hidden: np.ndarray | None
    predictions: tuple[SessionPrediction, ...]
    started_at: float  # wall clock (time.time()) when compute began
    compute_ms: float
    missed: tuple[int, ...] = ()  # sessions whose windows were dropped (a prefix cache entry was missing)


class RuntimeWorker:
    def __init__(self, runtime: StageRuntime, thread_name: str) -> None:
        self.runtime = runtime
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        self.frontier: Frontier = {}  # final stage: each session's next input (chained windows check it)
        self._queued = 0  # calls submitted to the runtime thread and not yet finished there
        self._queued_lock = threading.Lock()
        self.ms_per_row = 0.0  # the last batch's compute per row (what an inline batch is expected to take)

    async def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run `fn(*args, **kwargs)` in the runtime thread."""
        with self._queued_lock:
            self._queued += 1
        return await asyncio.wrap_future(self.executor.submit(self._counted, functools.partial(fn, *args, **kwargs)))

    def _counted(self, fn: Callable[[], R]) -> R:
        try:
            return fn()
        finally:
            with self._queued_lock:
                self._queued -= 1

    async def compute(self, windows: list[SessionWindow], hidden: np.ndarray | None = None,
                      verify: Sequence[VerifySpec] = ()) -> Computed:
        """Run the layers; at the final stage sample every window (verify windows as `verify` says)."""
        started_at, start = time.time(), time.perf_counter()
        rows = sum(w.n_tokens for w in windows)
        inline = self.runs_inline(rows)
        if inline:
            out, predictions, missed = self._compute(windows, hidden, verify)
        else:
            out, predictions, missed = await self.call(self._compute, windows, hidden, verify)
        ms = (time.perf_counter() - start) * 1e3
        self.ms_per_row = ms / max(1, rows)
        if inline:
            await asyncio.sleep(0)  # serve what arrived while the loop computed
        return Computed(out, predictions, started_at, ms, missed)

    def runs_inline(self, rows: int) -> bool:
        """A batch of `rows` may compute on the loop's thread: small, expected to be short, nothing queued."""
        return rows <= INLINE_MAX_ROWS and rows * self.ms_per_row <= INLINE_MAX_MS and self.idle()

    def idle(self) -> bool:
        """Nothing queued for the runtime thread: only the loop submits, so it stays idle while we run."""
        with self._queued_lock:
            return self._queued == 0

    def _compute(self, windows: list[SessionWindow], hidden: np.ndarray | None, verify: Sequence[VerifySpec]
                 ) -> tuple[np.ndarray | None, tuple[SessionPrediction, ...], tuple[int, ...]]:
        result = self.runtime.decode(windows, hidden)
        if not self.runtime.is_final:
            return result.hidden, (), result.missed
        return None, predict(self.runtime, windows, result, verify, self.frontier), result.missed

    def release(self, session_ids: Sequence[int], keep: Sequence[KeptPrefix] = (), evict: Sequence[int] = ()) -> int:
        """Forget these sessions (runtime thread only), first evicting and keeping prefix cache entries as
        ReleaseSessions says; returns how many were held."""
        if self.runtime.prefix is not None:
            self.runtime.prefix.keep(keep, evict)
        held = set(self.runtime.active_sessions)
        for session in session_ids:
            self.runtime.release_session(session)
            self.frontier.pop(session, None)
        return len(held.intersection(session_ids))

    def close(self) -> None:
        """Wait for the runtime thread to finish its last call (the runtime's owner closes the runtime)."""
        self.executor.shutdown(wait=True)
