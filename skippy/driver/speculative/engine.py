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
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from skippy.driver.scheduler import Drafter, PlannedWindow
from skippy.driver.sequence import Sequence as SchedSequence
from skippy.driver.speculative import Proposer, ProposerFactory
from skippy.driver.speculative.policy import SpeculationPolicy
from skippy.driver.speculative.window import CostModelWindow, WindowPolicy, WindowStats
from skippy.protocol.stats import SpeculativeStats
from skippy.runtime.stage_params import MAX_DRAFT_TOKENS


@dataclass
class SpeculationTotals:
    """Every verify window since startup (for /metrics and tests)."""

    windows: int = 0
    proposed: int = 0
    accepted: int = 0
    full_accepts: int = 0
    early_rejects: int = 0
    tail_rejects: int = 0
    stale_windows: int = 0  # chained windows discarded because the chain broke before them
    stale_rows: int = 0
    proposed_by_source: Counter[str] = field(default_factory=Counter)  # "own" | "global" | native_mtp | ...
    accepted_by_source: Counter[str] = field(default_factory=Counter)

    def add_source(self, source: str, proposed: int, accepted: int) -> None:
        self.proposed_by_source[source] += proposed
        self.accepted_by_source[source] += accepted

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
    stale_windows: int = 0
    stale_rows: int = 0
    shadow: list[int] = field(default_factory=list)  # a draft not sent (k = 0), checked against plain decoding
    depth: int = 1  # verify windows in flight at once (the policy's choice, at most Speculation.depth)
    chained_rows: int = 0  # rows of chained windows sent (stale_rows of them came back stale)
    source: str = ""  # where the latest proposal came from: a CrossRequestProposer's "own" | "global", else the name


class Speculation:
    """`calibrate`: the cost-model policy wanted; `policy` serves until the pipeline's C(rows) is measured."""

    def __init__(self, factory: ProposerFactory, policy: WindowPolicy, max_k: int = MAX_DRAFT_TOKENS, *,
                 calibrate: bool = False, depth: int = 1, min_k: int = 1, runahead: int = 0) -> None:
        self.factory = factory
        self.policy = policy
        self.max_k = min(max_k, MAX_DRAFT_TOKENS)
        self.min_k = max(1, min(min_k, self.max_k))  # verify_window.min_tokens: fewer drafts decode plainly
        self.depth = depth  # verify windows of one session in flight at once (pipeline_depth)
        self.runahead = runahead  # verify_window.runahead_max_tokens: proposed tokens in flight at most (0: no cap)
        self.calibrate = calibrate
        self.sessions: dict[int, SessionSpeculation] = {}
        self.totals = SpeculationTotals()
        self.hop_ms: float | None = None  # EWMA of the measured per-hop delay
        self.mtp_draft_max = 0  # native MTP: drafts every window asks the final stage for (native_mtp.max_draft_tokens)

    def use_cost_model(self, cost_ms: list[float], hops: int, hop_ms: float, micro_batches: int = 1) -> None:
        """Switch to the cost-model window once C(rows) is measured (hops per round trip, delay per hop, the
        micro-batches the driver keeps in flight)."""
        self.hop_ms = hop_ms
        cost = CostModelWindow(cost_ms, hop_ms, hops, self.max_k)
        if isinstance(self.policy, SpeculationPolicy):
            self.policy.cost, self.policy.micro_batches = cost, max(micro_batches, 1)
        else:
            self.policy = cost

    def observe_batch(self, rows: int, compute_ms: float) -> None:
        """A decode batch (no prefill rows) of `rows` rows took `compute_ms` on all stages: C(rows) follows it."""
        cost = self.policy.cost if isinstance(self.policy, SpeculationPolicy) else self.policy
        if isinstance(cost, CostModelWindow):
            cost.observe(rows, compute_ms)

    def observe_hops(self, hop_ms: Sequence[float]) -> None:
        """Per-hop delays measured on a batch's way through the stages; the cost model follows them."""
        if not hop_ms:
            return
        mean = sum(hop_ms) / len(hop_ms)
        self.hop_ms = mean if self.hop_ms is None else 0.8 * self.hop_ms + 0.2 * mean
        cost = self.policy.cost if isinstance(self.policy, SpeculationPolicy) else self.policy
        if isinstance(cost, CostModelWindow):
            cost.hop_ms = max(self.hop_ms, 0.0)

    @property
    def name(self) -> str:
        return self.factory.name

    def start(self, session_id: int, prompt: Sequence[int]) -> None:
        proposer = self.factory.for_session(session_id)
        proposer.extend(prompt)
        self.sessions[session_id] = SessionSpeculation(proposer)

    def draft_all(self, session_ids: list[int], budget: int, active_sessions: int,
                  room: dict[int, int] | None = None, riders: int = 0) -> dict[int, tuple[list[int], int]]:
        """`draft` for each session, by session id; the policy sizes the windows of the batch together, each at
        most the session's `room` (drafts its request can still commit: max_tokens left - 1), on top of the
        `riders`, prompt rows the batch also carries."""
        ks: dict[int, int] = {}
        if isinstance(self.policy, SpeculationPolicy):
            known = [sid for sid in session_ids if sid in self.sessions]
            caps = [(room or {}).get(sid, self.max_k) for sid in known]
            chosen = self.policy.allocate([self.sessions[sid].stats for sid in known], active_sessions, caps, riders)
            ks = {sid: max(0, min(k, cap)) for sid, k, cap in zip(known, chosen, caps)}
        return {sid: self.draft(sid, budget, active_sessions, ks.get(sid)) for sid in session_ids}

    def draft(self, session_id: int, budget: int, active_sessions: int, k: int | None = None) -> tuple[list[int], int]:
        """(proposal, k) for the session's next window: k drafts for it (at most budget - 1: the window's
        first row is the last token) and, with depth > 1, the proposal's continuation for the windows
        chained behind it (each a guessed head + k drafts). k = 0: decode plainly this step. `k`: the policy's
        window for it, chosen with the rest of its batch (else the policy chooses it alone)."""
        spec = self.sessions.get(session_id)
        if spec is None:
            return [], 0
        k = min(self.policy.choose(spec.stats, active_sessions) if k is None else k, self.max_k)
        k = max(k, self.min_k) if k > 0 else 0
        k = k if k <= budget - 1 else 0
        spec.depth = self._depth(spec, k, active_sessions)
        start = time.perf_counter()
        # k = 0: plain decoding this step, but a one-token shadow draft keeps alpha honest
        want = spec.depth * (k + 1) - 1 if k > 0 else 1
        want = min(want, self.runahead) if self.runahead > 0 else want
        proposal = spec.proposer.propose(want)[:want]
        spec.source = getattr(spec.proposer, "last_source", self.name)
        spec.proposer_us += (time.perf_counter() - start) * 1e6
        spec.proposer_calls += 1
        if len(proposal) < self.min_k:  # too short for a window (min_tokens): decode plainly, keep it as a shadow
            k = 0
        spec.k = k
        spec.shadow = proposal if k <= 0 else []
        return (proposal, k) if k > 0 else ([], 0)

    def _depth(self, spec: SessionSpeculation, k: int, active_sessions: int) -> int:
        """The session's pipeline depth: the policy's (from its share of stale rows), else the plan's."""
        if isinstance(self.policy, SpeculationPolicy):
            return min(self.depth, self.policy.depth(spec.stats, k, active_sessions, spec.chained_rows, spec.stale_rows))
        return self.depth

    def _session_depth(self, session_id: int) -> int:
        spec = self.sessions.get(session_id)
        return spec.depth if spec is not None else self.depth

    async def drafter(self, ready: list[int], budget: int, decoding: int, in_runtime: Callable[..., Awaitable[Any]],
                      room: dict[int, int] | None = None, riders: int = 0) -> Drafter | None:
        """Drafts for the `ready` sessions the next plan can decode; the plan trims each to the rows its budget
        has left. A draft model runs llama.cpp, so its drafts are made in the runtime thread (`in_runtime`);
        n-gram drafts (microseconds) on the loop: the hand-off cost stage 0 a thread round trip on every step."""
        if not ready:
            return None
        drafts: dict[int, tuple[list[int], int]] = (
            await in_runtime(self.draft_all, ready, budget, decoding, room, riders) if self.factory.runs_llama
            else self.draft_all(ready, budget, decoding, room, riders))

        def window(seq: SchedSequence, rows_left: int) -> list[int]:
            proposal, k = drafts.get(seq.session_id, ([], 0))
            return self.window_drafts(seq, proposal, k, rows_left)
        return window

    def window_drafts(self, seq: SchedSequence, proposal: list[int], k: int, rows_left: int) -> list[int]:
        """This window's drafts out of `proposal`; the rest waits in `seq.chain` for chained windows."""
        this = proposal[: max(0, min(k, rows_left - 1))]
        seq.chain = proposal[len(this):] if self._session_depth(seq.session_id) > 1 and this else []
        seq.chain_pos, seq.chain_k = seq.length + 1 + len(this), k
        return this

    def chained(self, seq: SchedSequence, rows_left: int) -> PlannedWindow | None:
        """The next window of a session with windows in flight: `[guessed bonus, next k drafts]` at the
        chain's position, or None (depth reached, nothing proposed, no room)."""
        if seq.in_flight >= self._session_depth(seq.session_id) or not seq.chain or rows_left < 1:
            return None
        k = max(0, min(seq.chain_k, rows_left - 1, len(seq.chain) - 1))
        spec = self.sessions.get(seq.session_id)
        if spec is not None:
            spec.chained_rows += 1 + k
        head, draft, rest = seq.chain[0], tuple(seq.chain[1 : 1 + k]), seq.chain[1 + k :]
        window = PlannedWindow(seq, seq.chain_pos, np.array([head, *draft], np.int32), tuple(range(1 + k)), draft,
                               head, seq.epoch, rest[0] if rest else None, seq.attempt)
        seq.chain, seq.chain_pos = rest, seq.chain_pos + 1 + k
        return window

    def committed(self, session_id: int, proposed: int, returned: int, committed: Sequence[int]) -> None:
        """A window of `proposed` drafts came back with `returned` tokens (accepted + 1); `committed` of them
        were kept (fewer when a stop token or the length limit ended the request)."""
        spec = self.sessions.get(session_id)
        if spec is None:
            return
        verified = getattr(spec.proposer, "verified", None)  # a native-MTP proposer's reject cooldown
        if proposed > 0:  # draft tokens by source: a native-MTP prefix, then its n-gram tail (or the proposer's)
            mtp = min(getattr(spec.proposer, "in_flight", 0), proposed)
            accepted = returned - 1
            if mtp:
                self.totals.add_source("native_mtp", mtp, min(accepted, mtp))
            if proposed > mtp:
                tail = "ngram_extension" if mtp or verified is not None else spec.source
                self.totals.add_source(tail, proposed - mtp, max(0, accepted - mtp))
        if verified is not None and proposed > 0:
            verified(proposed, returned - 1)
        if proposed > 0:
            stop = len(committed) < returned  # a stop token or the length limit cut the window
            spec.stats.observe(proposed, returned - 1, k=max(spec.k, proposed), stop=stop)
            self.totals.add(proposed, returned - 1)
        elif spec.shadow and committed:
            spec.stats.observe_shadow(1, int(spec.shadow[0] == committed[0]))
            spec.shadow = []
        spec.proposer.extend(committed)

    def receive_mtp(self, session_id: int, drafts: Sequence[int]) -> None:
        """The final stage's native-MTP drafts after the session's last committed token (after `committed`)."""
        spec = self.sessions.get(session_id)
        receive = getattr(spec.proposer, "receive", None) if spec is not None else None
        if receive is not None:
            receive(drafts)

    def stale(self, session_id: int, rows: int) -> None:
        """A chained window of `rows` rows came back after its chain broke: computed for nothing."""
        spec = self.sessions.get(session_id)
        if spec is not None:
            spec.stale_windows += 1
            spec.stale_rows += rows
        self.totals.stale_windows += 1
        self.totals.stale_rows += rows

    def summary(self, session_id: int) -> dict[str, Any] | None:
        """The session's statistics for its request summary (None when it did not speculate)."""
        spec = self.sessions.get(session_id)
        if spec is None:
            return None
        summary = {k: round(v, 4) if isinstance(v, float) else v for k, v in dataclasses.asdict(spec.stats).items()
                   if not k.startswith("pos_")}  # the decayed per-position counts stay internal
        summary.update(proposer=self.name, proposer_calls=spec.proposer_calls, stale_windows=spec.stale_windows,
                       stale_rows=spec.stale_rows, depth=spec.depth,
                       proposer_us_per_call=round(spec.proposer_us / max(1, spec.proposer_calls), 1))
        global_drafts = getattr(spec.proposer, "global_drafts", None)  # a CrossRequestProposer's
        if global_drafts is not None:
            summary["global_drafts"] = global_drafts
        return summary

    def stats(self, session_id: int) -> SpeculativeStats | None:
        """The session's numbers for its client (TokenEvents.stats; None when it did not speculate)."""
        spec = self.sessions.get(session_id)
        if spec is None:
            return None
        s = spec.stats
        return SpeculativeStats(s.windows, s.proposed, s.accepted, s.full_accepts, s.early_rejects, s.tail_rejects,
                                s.stops, s.wasted_rows, round(s.alpha, 4), s.k_start, s.k_last, s.k_min, s.k_max,
                                spec.proposer_calls, round(spec.proposer_us / max(1, spec.proposer_calls), 1),
                                spec.stale_windows, spec.stale_rows, tuple(s.accepted_per_pos))

    def release(self, session_ids: Sequence[int]) -> None:
        """Free finished sessions' proposers (in the thread that runs the proposers)."""
        for session_id in session_ids:
            spec = self.sessions.pop(session_id, None)
            if spec is not None:
                spec.proposer.close()

    def close(self) -> None:
        self.release(list(self.sessions))
        self.factory.close()
