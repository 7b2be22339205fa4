"""The runtime worker's inline compute: a short decode runs on the event loop's thread, and the loop is served
before the next step; a batch expected to block the loop long goes to the runtime thread (seen: one stage of
the whole model on one slow core, inline steps back to back, its tokens in one burst and its status late)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
from runtime_helpers import N_LAYER, tiny_spec

from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.windows import SessionWindow
from skippy.stage.worker import INLINE_MAX_MS, RuntimeWorker


def test_inline_compute_lets_the_loop_serve_and_slow_batches_go_to_the_thread(tiny_model: Callable[..., Path]) -> None:
    runtime = StageRuntime(tiny_spec(tiny_model("llama"), layer_end=N_LAYER))
    worker = RuntimeWorker(runtime, "runtime-test")
    try:
        async def main() -> tuple[bool, str, str]:
            computing_on: list[str] = []
            original = runtime.decode

            def decode(*args: object) -> object:
                computing_on.append(threading.current_thread().name)
                return original(*args)  # type: ignore[arg-type]

            runtime.decode = decode  # type: ignore[method-assign]
            served = asyncio.Event()
            asyncio.get_running_loop().call_soon(served.set)  # what arrived while the loop computes
            window = SessionWindow(0, 0, 1, (0,), np.array([1], np.int32))
            await worker.compute([window])
            served_before_next_step = served.is_set()
            worker.ms_per_row = 2 * INLINE_MAX_MS  # a row as slow as that: the next decode blocks the loop too long
            await worker.compute([SessionWindow(0, 1, 1, (0,), np.array([2], np.int32))])
            return served_before_next_step, computing_on[0], computing_on[1]

        served, first, second = asyncio.run(main())
        assert served  # the loop ran its callbacks before compute returned to the step loop
        assert first == threading.main_thread().name and second.startswith("runtime-test")
    finally:
        worker.close()
        runtime.close()
