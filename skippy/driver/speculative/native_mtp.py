"""Native-MTP proposals at stage 0: the drafts the final stage's NextN block returned with the last prediction.

The final stage drafts up to `native_mtp.max_draft_tokens` after each window's last sample (skippy.runtime.mtp)
and they ride back in `SessionPrediction.mtp_draft`; the driver hands them to the session's proposer
(`receive`), which proposes them for the next verify window while they still continue the committed history
(no token committed since). The composite plan (`extension`; effective_strategy `native-mtp+ngram-cache`)
appends an n-gram cache tail of up to `extension.max_tokens` continuing history + the MTP prefix.

Plan fields:
- `min_draft_tokens`: fewer MTP drafts than this are not proposed (0: any).
- `reject_cooldown_tokens` N: after a window in which an MTP draft was rejected, the next N committed tokens
  get no MTP drafts (the n-gram tail still drafts from the history alone).
- `suppress_cooldown_drafts`: during that cooldown the tail is suppressed too, down to at most
  `suppress_cooldown_draft_limit` tokens (0: no drafts at all while cooling down).
"""

from __future__ import annotations

from collections.abc import Sequence

from skippy.config.speculative import NativeMtpConfig, SpeculativeDecodeConfig
from skippy.driver.speculative.ngram_cache import NgramCacheProposer

__all__ = ["NativeMtpProposer", "NativeMtpProposerFactory"]


class NativeMtpProposer:
    """One session's MTP drafts (and optional n-gram tail)."""

    def __init__(self, config: NativeMtpConfig, tail: NgramCacheProposer | None = None, tail_max: int = 0) -> None:
        self.config = config
        self.tail = tail
        self.tail_max = tail_max
        self.committed = 0  # tokens of history
        self.pending: list[int] = []  # the last MTP drafts, continuing history[:anchor]
        self.anchor = -1
        self.cooldown = 0  # committed tokens left without MTP drafts (reject_cooldown_tokens)
        self.in_flight = 0  # MTP drafts in the last proposal (to tell an MTP rejection from a tail one)
        self.received = 0  # MTP drafts received in all (native_mtp metrics)

    def extend(self, tokens: Sequence[int]) -> None:
        self.committed += len(tokens)
        self.cooldown = max(0, self.cooldown - len(tokens))
        if self.tail is not None:
            self.tail.extend(tokens)

    def receive(self, drafts: Sequence[int]) -> None:
        """The final stage's MTP drafts after the last committed token."""
        self.pending = list(drafts)[: self.config.max_draft_tokens]
        self.anchor = self.committed
        self.received += len(self.pending)

    def verified(self, proposed: int, accepted: int) -> None:
        """A window of `proposed` drafts came back with `accepted` of them accepted."""
        if accepted < min(self.in_flight, proposed) and self.config.reject_cooldown_tokens > 0:
            self.cooldown = self.config.reject_cooldown_tokens + accepted + 1  # counted from after this window

    def propose(self, max_tokens: int) -> list[int]:
        mtp = self.pending if self.anchor == self.committed else []
        if self.cooldown > 0 or len(mtp) < max(1, self.config.min_draft_tokens):
            mtp = []
        mtp = mtp[:max_tokens]
        self.in_flight = len(mtp)
        tail_max = min(self.tail_max, max_tokens - len(mtp))
        if self.cooldown > 0 and self.config.suppress_cooldown_drafts:
            tail_max = min(tail_max, self.config.suppress_cooldown_draft_limit)
        tail = self.tail.continue_draft(mtp, tail_max) if self.tail is not None and tail_max > 0 else []
        return mtp + tail

    def close(self) -> None:
        self.pending = []


class NativeMtpProposerFactory:
    """`native_mtp.enabled` (with `extension`: an n-gram cache tail): one NativeMtpProposer per session."""

    runs_llama = False

    def __init__(self, plan: SpeculativeDecodeConfig) -> None:
        self.plan = plan
        self.name = "native-mtp+ngram-cache" if plan.extension is not None else "native-mtp"

    def for_session(self, session_id: int) -> NativeMtpProposer:
        ngram, extension = self.plan.ngram, self.plan.extension
        if ngram is None or extension is None:
            return NativeMtpProposer(self.plan.native_mtp)
        tail = NgramCacheProposer(ngram.min_ngram, ngram.max_ngram, ngram.max_proposal_tokens)
        return NativeMtpProposer(self.plan.native_mtp, tail, extension.max_tokens)

    def close(self) -> None:
        pass
