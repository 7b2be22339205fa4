"""Final-stage sampling of a decoded batch: tokens (and logprobs if asked) per window.

A plain window yields one token per output row. A verify window (rows `[last committed, d1..dk]`,
logits on every row) is sampled row by row with the session's sampler: row i's sample t_i is
committed and, if it equals the next draft token d_{i+1}, row i+1 is sampled too; the first
mismatch ends the window. So accepted + 1 tokens come back, each drawn from the target
distribution given the committed prefix — sample-and-compare is exact for any sampler, and the
sampler's state (penalties, RNG) advances once per returned token, as in plain decoding.

A chained verify window's first row guessed the previous window's last sample (`head`). The
`Frontier` (per session: the position and token the next row must carry) tells whether the guess
came true; if not the window is stale: nothing is sampled and it comes back empty.

A window asking for native-MTP drafts (`mtp_draft_max`) gets them after its last sample, from the final
stage's NextN block (`StageRuntime.mtp_draft`), in `SessionPrediction.mtp_draft`: no extra hop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from skippy.protocol import SessionPrediction, TokenLogprob, Window
from skippy.runtime.stage_runtime import StageRuntime
from skippy.runtime.windows import DecodeResult, SessionWindow

Frontier = dict[int, tuple[int, int]]  # session -> (position, token) of its next input row


@dataclass(frozen=True)
class VerifySpec:
    """What a window needs verified beyond plain sampling (empty for a plain window)."""

    draft: tuple[int, ...] = ()
    head: int | None = None
    mtp_draft_max: int = 0  # native-MTP drafts wanted after the window's last sample


def input_tokens(window: Window) -> np.ndarray | None:
    """The rows' token ids when stage 0 sent them (native MTP at the final stage), else None."""
    return np.asarray(window.input_tokens, np.int32) if len(window.input_tokens) == window.n_tokens else None


def predict(runtime: StageRuntime, windows: list[SessionWindow], result: DecodeResult,
            verify: Sequence[VerifySpec] = (), frontier: Frontier | None = None) -> tuple[SessionPrediction, ...]:
    """Sample every window of the last decode with its session's sampler, in window order."""
    frontier = {} if frontier is None else frontier
    predictions = []
    for i, (w, rows) in enumerate(zip(windows, result.output_rows)):
        if not rows:
            continue
        spec = verify[i] if i < len(verify) else VerifySpec()
        if spec.head is not None and frontier.get(w.session_id) != (w.pos_start, spec.head):
            predictions.append(SessionPrediction(w.session_id, ()))  # stale: its guess did not come true
            continue
        tokens: list[int] = []
        logprobs: list[TokenLogprob] = []
        for j, row in enumerate(rows):
            token = runtime.sample(w.session_id, row)
            tokens.append(token)
            logprob = runtime.logprobs(w.session_id, row, token)
            if logprob is not None:
                logprobs.append(logprob)
            verifying = bool(spec.draft) or spec.head is not None
            if verifying and (j >= len(spec.draft) or token != spec.draft[j]):
                break  # first mismatch (or the bonus token after a full accept): the window ends here
        last_row = w.outputs[len(tokens) - 1] if w.outputs else len(tokens) - 1
        frontier[w.session_id] = (w.pos_start + last_row + 1, tokens[-1])
        mtp = runtime.mtp_draft(w.session_id, tokens[-1], w.pos_start + last_row + 1, spec.mtp_draft_max)
        predictions.append(SessionPrediction(w.session_id, tuple(tokens), tuple(logprobs), runtime.draws(w.session_id),
                                             mtp_draft=mtp))
    return tuple(predictions)
