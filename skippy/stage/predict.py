"""Final-stage sampling of a decoded batch: tokens (and logprobs if asked) per window.

A plain window yields one token per output row. A verify window (rows `[last committed, d1..dk]`,
logits on every row) is sampled row by row with the session's sampler: row i's sample t_i is
committed and, if it equals the next draft token d_{i+1}, row i+1 is sampled too; the first
mismatch ends the window. So accepted + 1 tokens come back, each drawn from the target
distribution given the committed prefix — sample-and-compare is exact for any sampler, and the
sampler's state (penalties, RNG) advances once per returned token, as in plain decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

from skippy.protocol import SessionPrediction, TokenLogprob
from skippy.runtime.stage_runtime import DecodeResult, SessionWindow, StageRuntime


def predict(runtime: StageRuntime, windows: list[SessionWindow], result: DecodeResult,
            drafts: Sequence[tuple[int, ...]] = ()) -> tuple[SessionPrediction, ...]:
    """Sample every window of the last decode with its session's sampler, in window order."""
    predictions = []
    for i, (w, rows) in enumerate(zip(windows, result.output_rows)):
        if not rows:
            continue
        draft = drafts[i] if i < len(drafts) else ()
        tokens: list[int] = []
        logprobs: list[TokenLogprob] = []
        for j, row in enumerate(rows):
            token = runtime.sample(w.session_id, row)
            tokens.append(token)
            logprob = runtime.logprobs(w.session_id, row, token)
            if logprob is not None:
                logprobs.append(logprob)
            if draft and (j >= len(draft) or token != draft[j]):
                break  # first mismatch (or the bonus token after a full accept): the window ends here
        predictions.append(SessionPrediction(w.session_id, tuple(tokens), tuple(logprobs)))
    return tuple(predictions)
