"""Reference runs for pipeline tests: replay a driver's batches on an unsplit model, greedy runs with margins.

llama.cpp is not batch-invariant, so a pipeline's tokens are only bitwise comparable with an unsplit
model that decodes the *same batches*. `replay_op_log` re-runs a driver's `OpLog` (every batch and
release exactly as the stages applied them, recorded when a test installs one) on a `LocalChain`
and returns the tokens sampled per session. Batches carry their prefix cache operations (restore,
evict, record), so the chain's own prefix cache (a RuntimeSpec with the same `prefix_entries`) makes
the same cache decisions on the same batches. `greedy_with_margins` runs one prompt alone and also
returns each step's top-2 logit margin, so a batched-vs-alone comparison can stop where the margin
is too thin to be meaningful. `mtp_greedy` decodes greedily verifying the final stage's native-MTP
drafts (docs/mtp.md), for comparison with plain decoding.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from skippy.driver.batches import WindowRecord
from skippy.protocol import KeptPrefix
from skippy.runtime.chain import LocalChain
from skippy.runtime.sampling import SamplingParams
from skippy.runtime.windows import DecodeResult, SessionWindow
from skippy.stage.final_sampling import Frontier, VerifySpec, predict


class OpLog(list[tuple[str, Any]]):
    """A driver OpRecorder that keeps every op in stage order: `driver.recorder = OpLog()` (tests only)."""

    def batch(self, windows: list[WindowRecord]) -> None:
        self.append(("batch", windows))

    def keep(self, kept: tuple[KeptPrefix, ...], evict: tuple[int, ...]) -> None:
        self.append(("keep", (kept, evict)))

    def release(self, session_ids: tuple[int, ...]) -> None:
        self.append(("release", session_ids))


def replay_op_log(
    chain: LocalChain, op_log: Iterable[tuple[str, Any]], sampling: Mapping[int, SamplingParams] | None = None
) -> dict[int, list[int]]:
    """Apply ("batch", windows) / ("keep", (kept, evict)) / ("release", ids) ops to `chain`; returns the tokens
    sampled per session. A "keep" (prefix cache entries kept from sessions about to be released) goes to
    every stage's prefix cache.

    A batch window is `(session_id, pos_start, tokens, outputs, draft, head, (restore, record, evict))`;
    output rows are sampled with the session's sampler (greedy unless `sampling` names one), in batch
    order, by the final stage's own `predict`: a verify window stops at the first sample that differs
    from its draft, a stale chained window samples nothing.
    Sessions still open at the end are released, so the chain can be reused.
    """
    produced: dict[int, list[int]] = {}
    frontier: Frontier = {}
    configured: set[int] = set()
    open_sessions: set[int] = set()
    for kind, payload in op_log:
        if kind == "batch":
            windows = [
                SessionWindow(int(sid), int(pos), len(tokens), tuple(outputs), np.asarray(tokens, np.int32), *cache)
                for sid, pos, tokens, outputs, _, _, cache in payload
            ]
            verify = [VerifySpec(tuple(draft), head) for *_, draft, head, _ in payload]
            for w in windows:
                if sampling and w.session_id in sampling and w.session_id not in configured:
                    chain.final.configure_session(w.session_id, sampling[w.session_id])
                    configured.add(w.session_id)
                open_sessions.add(w.session_id)
            result = DecodeResult(None, chain.decode(windows))
            for prediction in predict(chain.final, windows, result, verify, frontier):
                produced.setdefault(prediction.session_id, []).extend(prediction.tokens)
        elif kind == "keep":
            for stage in chain.stages:
                if stage.prefix is not None:
                    stage.prefix.keep(*payload)
        elif kind == "release":
            for sid in payload:
                chain.release(int(sid))
                frontier.pop(int(sid), None)
                open_sessions.discard(int(sid))
                configured.discard(int(sid))
        else:
            raise ValueError(f"unknown op_log entry kind {kind!r}")
    for sid in open_sessions:
        chain.release(sid)
    return produced


def greedy_with_margins(
    chain: LocalChain, prompt: Sequence[int], max_tokens: int, *, session_id: int = 0
) -> tuple[list[int], list[float]]:
    """Greedy continuation of `prompt` decoded alone; per token, the top-2 logit margin it was chosen by.

    The prompt is prefilled in one window (it must fit n_batch), then one token per step.
    """
    tokens = np.asarray(prompt, np.int32)
    out: list[int] = []
    margins: list[float] = []
    try:
        rows = chain.decode([SessionWindow(session_id, 0, len(tokens), (len(tokens) - 1,), tokens)])
        pos = len(tokens)
        for _ in range(max_tokens):
            logits = chain.final.logits(rows[0][0])
            top2 = np.partition(logits, -2)[-2:]
            token = int(np.argmax(logits))
            out.append(token)
            margins.append(float(top2[1] - top2[0]))
            if len(out) == max_tokens:
                break
            rows = chain.decode([SessionWindow(session_id, pos, 1, (0,), np.array([token], np.int32))])
            pos += 1
        return out, margins
    finally:
        chain.release(session_id)


def clear_prefix(margins: Sequence[float], min_margin: float) -> int:
    """How many leading tokens were chosen by a top-2 margin of at least `min_margin`."""
    for i, margin in enumerate(margins):
        if margin < min_margin:
            return i
    return len(margins)


def check_against_alone(got: Sequence[int], alone: Sequence[int], margins: Sequence[float],
                        min_margin: float) -> tuple[int, str | None]:
    """Compare a batched run's tokens with an alone run's, as far as the comparison means something.

    Every token before the first thin-margin position must agree (the brief's rule). Past it the
    runs are still compared while they agree (the contexts are then identical, so a disagreement is
    only allowed where the alone run's margin was below `min_margin`); the first allowed disagreement
    ends the comparison, since the two continuations diverge from there.
    Returns (positions compared, None) or (position, a description of the disagreement).
    """
    for i, (a, b) in enumerate(zip(got, alone)):
        if a != b:
            if margins[i] >= min_margin:
                return i, f"token {i}: batched {a} != alone {b} although the alone margin is {margins[i]:.3f}"
            return i, None
    return min(len(got), len(alone)), None


class MtpRun(NamedTuple):
    """A greedy run that verified native-MTP drafts: its tokens, and per verify window (in order) the drafts
    it sent and how many of them the final stage accepted."""

    tokens: list[int]
    drafts: list[tuple[int, ...]]
    accepted: list[int]

    @property
    def drafted(self) -> int:
        return sum(len(d) for d in self.drafts)


def mtp_greedy(chain: LocalChain, prompt: Sequence[int], steps: int, n_draft: int, session_id: int = 0) -> MtpRun:
    """Greedy decoding whose every window verifies the final stage's native-MTP drafts (skippy.runtime.mtp),
    as a pipeline does: `[last, d1..dk]` with logits on every row."""
    final = chain.final
    tokens = np.asarray(prompt, np.int32)
    window = SessionWindow(session_id, 0, len(tokens), (len(tokens) - 1,), tokens)
    out = list(predict(final, [window], DecodeResult(None, chain.decode([window])))[0].tokens)
    pos, run = len(tokens), MtpRun([], [], [])
    try:
        while len(out) < steps:
            drafts = final.mtp_draft(session_id, out[-1], pos, n_draft)
            rows = np.asarray([out[-1], *drafts], np.int32)
            window = SessionWindow(session_id, pos, len(rows), tuple(range(len(rows))), rows)
            result = DecodeResult(None, chain.decode([window]))
            got = predict(final, [window], result, [VerifySpec(draft=drafts)])[0].tokens
            run.drafts.append(tuple(drafts))
            run.accepted.append(len(got) - 1)
            out += got
            pos += len(got)
    finally:
        chain.release(session_id)
    run.tokens.extend(out[:steps])
    return run
