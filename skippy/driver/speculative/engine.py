"""Stage 0's speculative decoding: a proposer and window statistics per session, one window policy.

Per decode step of a session: k = policy(stats, active sessions), capped by the token budget and
MAX_DRAFT_TOKENS; the proposer drafts up to k tokens; the scheduler sends `[last, d1..dk]` as one
verify window. When the final stage's accepted + 1 tokens come back, the outcome is classified
(full accept, early reject, tail reject), the stats and the acceptance estimate move, and the
committed tokens extend the proposer's history. Rejected rows need no message: the next window
starts at the first uncommitted position and every stage trims its KV there.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from skippy.driver.speculative import Proposer, ProposerFactory
from skippy.driver.speculative.window import CostModelWindow, WindowPolicy, WindowStats
from skippy.runtime.stage_runtime import MAX_DRAFT_TOKENS


@dataclass
class SpeculationTotals:
    """Every verify window since startup (for /metrics and tests)."""

    windows: int = 0
    proposed: int = 0
    accepted: int = 0
    full_accepts: int = 0
    early_rejects: int = 0
    tail_rejects: int = 0

    def add(self, proposed: int, accepted: int) -> None:
        self.windows += 1
        self.proposed += proposed
        self.accepted += accepted
        if accepted == proposed:
            self.full_accepts += 1
        elif accepted == 0:
            self.early_rejects += 1
        else:
            self.tail_rejects += 1


@dataclass
class SessionSpeculation:
    proposer: Proposer
    stats: WindowStats = field(default_factory=WindowStats)
    proposer_calls: int = 0
    proposer_us: float = 0.0
    k: int = 0  # the policy's window for the draft in flight
    shadow: list[int] = field(default_factory=list)  # a draft not sent (k = 0), checked against plain decoding


class Speculation:
    """`calibrate`: the cost-model policy wanted; `policy` serves until the pipeline's C(rows) is measured."""

    def __init__(self, factory: ProposerFactory, policy: WindowPolicy, max_k: int = MAX_DRAFT_TOKENS, *,
                 calibrate: bool = False) -> None:
        self.factory = factory
        self.policy = policy
        self.max_k = min(max_k, MAX_DRAFT_TOKENS)
        self.calibrate = calibrate
        self.sessions: dict[int, SessionSpeculation] = {}
        self.totals = SpeculationTotals()
        self.hop_ms: float | None = None  # EWMA of the measured per-hop delay

    def use_cost_model(self, cost_ms: list[float], hops: int, hop_ms: float) -> None:
        """Switch to the cost-model window once C(rows) is measured (hops per round trip, delay per hop)."""
        self.hop_ms = hop_ms
        self.policy = CostModelWindow(cost_ms, hop_ms, hops, self.max_k)

    def observe_hops(self, hop_ms: Sequence[float]) -> None:
        """Per-hop delays measured on a batch's way through the stages; the cost model follows them."""
        if not hop_ms:
            return
        mean = sum(hop_ms) / len(hop_ms)
        self.hop_ms = mean if self.hop_ms is None else 0.8 * self.hop_ms + 0.2 * mean
        if isinstance(self.policy, CostModelWindow):
            self.policy.hop_ms = max(self.hop_ms, 0.0)

    @property
    def name(self) -> str:
        return self.factory.name

    def start(self, session_id: int, prompt: Sequence[int]) -> None:
        proposer = self.factory.for_session(session_id)
        proposer.extend(prompt)
        self.sessions[session_id] = SessionSpeculation(proposer)

    def draft(self, session_id: int, budget: int, active_sessions: int) -> list[int]:
        """Draft tokens for the session's next window (at most budget - 1: the window's first row is the last token)."""
        spec = self.sessions.get(session_id)
        if spec is None:
            return []
        k = min(self.policy.choose(spec.stats, active_sessions), self.max_k, budget - 1)
        start = time.perf_counter()
        # k = 0: plain decoding this step, but a one-token shadow draft keeps alpha honest
        drafted = spec.proposer.propose(max(k, 1))[: max(k, 1)]
        spec.proposer_us += (time.perf_counter() - start) * 1e6
        spec.proposer_calls += 1
        spec.k = k
        spec.shadow = drafted if k <= 0 else []
        return drafted if k > 0 else []

    def committed(self, session_id: int, proposed: int, returned: int, committed: Sequence[int]) -> None:
        """A window of `proposed` drafts came back with `returned` tokens (accepted + 1); `committed` of them
        were kept (fewer when a stop token or the length limit ended the request)."""
        spec = self.sessions.get(session_id)
        if spec is None:
            return
        if proposed > 0:
            stop = len(committed) < returned  # a stop token or the length limit cut the window
            spec.stats.observe(proposed, returned - 1, k=max(spec.k, proposed), stop=stop)
            self.totals.add(proposed, returned - 1)
        elif spec.shadow and committed:
            spec.stats.observe_shadow(1, int(spec.shadow[0] == committed[0]))
            spec.shadow = []
        spec.proposer.extend(committed)

    def summary(self, session_id: int) -> dict[str, Any] | None:
        """The session's statistics for its request summary (None when it did not speculate)."""
        spec = self.sessions.get(session_id)
        if spec is None:
            return None
        summary = {k: round(v, 4) if isinstance(v, float) else v for k, v in dataclasses.asdict(spec.stats).items()}
        summary.update(proposer=self.name, proposer_calls=spec.proposer_calls,
                       proposer_us_per_call=round(spec.proposer_us / max(1, spec.proposer_calls), 1))
        return summary

    def release(self, session_ids: Sequence[int]) -> None:
        """Free finished sessions' proposers (in the thread that runs the proposers)."""
        for session_id in session_ids:
            spec = self.sessions.pop(session_id, None)
            if spec is not None:
                spec.proposer.close()

    def close(self) -> None:
        self.release(list(self.sessions))
        self.factory.close()
