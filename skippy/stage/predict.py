"""Final-stage sampling of a decoded batch: one token (and logprobs if asked) per output row."""

from __future__ import annotations

from skippy.protocol import SessionPrediction
from skippy.runtime.stage_runtime import DecodeResult, SessionWindow, StageRuntime


def predict(runtime: StageRuntime, windows: list[SessionWindow], result: DecodeResult) -> tuple[SessionPrediction, ...]:
    """Sample every output row of the last decode with its session's sampler, in window order."""
    predictions = []
    for w, rows in zip(windows, result.output_rows):
        if not rows:
            continue
        tokens = [runtime.sample(w.session_id, r) for r in rows]
        logprobs = [runtime.logprobs(w.session_id, r, t) for r, t in zip(rows, tokens)]
        predictions.append(SessionPrediction(w.session_id, tuple(tokens), tuple(lp for lp in logprobs if lp is not None)))
    return tuple(predictions)
