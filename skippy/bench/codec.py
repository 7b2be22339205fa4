"""`skippy bench codec`: the protocol codec on one decode step's messages, cold and warm, medians in us.

Cold: each call follows a 48 MB sweep that evicts the caches, as llama.cpp's compute does between a
stage's messages; warm: the same calls back to back. The messages are a decode step's at Gemma 3 270M
widths: a 1-row x 640 batch with one stage timing, and predictions with two.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from skippy.protocol import Batch, Predictions, SessionPrediction, StageTiming, Window, decode, encode

SWEEP_FLOATS = 12_000_000  # 48 MB


def median_us(fn: Callable[[], object], calls: int, sweep: np.ndarray | None) -> float:
    """Median of `calls` timed calls of `fn`, in us; with `sweep`, each call after summing it (cold caches)."""
    times = []
    for _ in range(calls):
        if sweep is not None:
            sweep.sum()
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return sorted(times)[calls // 2] / 1e3


def run_codec_bench(calls: int) -> int:
    sweep = np.ones(SWEEP_FLOATS, np.float32)
    now = time.time()
    batch = Batch(17, (Window(3, 120, 1, (0,)),), np.zeros((1, 640), np.float32),
                  (StageTiming("stage0", now, 2.9, 0.0, now),))
    preds = Predictions(17, (SessionPrediction(3, (1234,)),), (StageTiming("stage0", now, 2.9, 0.0, now),
                                                                StageTiming("stage1", now, 11.0, 0.0, now)), (), True)
    batch_frames, pred_frames = [bytes(f) for f in encode(batch)], [bytes(f) for f in encode(preds)]
    cases: list[tuple[str, Callable[[], object]]] = [
        ("encode batch (1 row x 640)", lambda: encode(batch)),
        ("decode batch", lambda: decode(batch_frames, n_embd=640)),
        ("encode predictions (2 stage timings)", lambda: encode(preds)),
        ("decode predictions", lambda: decode(pred_frames)),
    ]
    print(f"{'one decode step, Gemma 3 270M widths':40s} {'cold us':>8s} {'warm us':>8s}")
    for name, fn in cases:
        print(f"{name:40s} {median_us(fn, calls, sweep):8.1f} {median_us(fn, calls, None):8.1f}")
    return 0


def add_to(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("codec", help="the protocol codec on one decode step's messages, cold and warm caches")
    p.add_argument("--calls", type=int, default=300, help="timed calls per message and cache state (median reported)")
    p.set_defaults(run=lambda a: run_codec_bench(a.calls))
