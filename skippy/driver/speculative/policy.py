"""The default speculation policy: per session, k and the pipeline depth from measured acceptance, the live
load and the calibrated cost of rows. On unless `--no-speculative` or a plan says "disabled".

Inputs, all measured:
- alpha_i, the acceptance of draft i given drafts 0..i-1 were accepted (WindowStats.position_alpha: decayed
  per-position counts, shrunk towards the session's overall alpha where a position has little evidence);
- n, the sessions decoding in the next batch (the live load; each brings k + 1 rows, so a batch holds
  n(k + 1) rows);
- C(rows), ms of one decode of that many rows through the pipeline (skippy.driver.calibrate, at startup),
  and the wire's hops x hop_ms (measured live);
- s, the share of a session's chained-window rows that came back stale.

    P_j     = prod_{i<=j} alpha_i                      # draft j is accepted
    tau(k)  = 1 + sum_{j<k} P_j                        # tokens a window of k drafts commits
    rate(k) = tau(k) / (C(n(k+1)) + w)                  # tokens per ms per session
    w       = hops*hop_ms while n < stages, else 0      # n >= stages: other sessions' batches hide the wire
    k*      = argmax_k rate(k) over k with n(k+1) <= R;  k = 0 when rate(k*)/rate(0) < MIN_GAIN
    R       = the most rows calibration measured (max_k + 1): beyond it C is a guess, and pricing several
              sessions' windows with an extrapolated (or one-sequence, batch-size) table lost 0.35-0.78x
              at c = 8 in this session's bench (docs/bench-speculative.md), so the policy does not
              speculate on a guess
    depth 2 when n < stages and (1 - s) * T_step > s * (C(2n(k+1)) - C(n(k+1))): a chained window saves
            a step T_step when its predecessor is fully accepted, and costs its own rows when it is not; with
            n >= stages every stage already has work, so a chain only adds rows

Before the pipeline's C(rows) is measured every row costs the same (C = 1, no wire): k is then the
largest k whose gain is >= MIN_GAIN. While k = 0 the engine still drafts a shadow proposal, checked against
what plain decoding commits, so alpha stays measured and k comes back when drafts start to match.
"""

from __future__ import annotations

from dataclasses import dataclass

from skippy.driver.speculative.window import CostModelWindow, WindowStats

MIN_GAIN = 1.05  # speculate only for >= 5% more tokens per ms than plain decoding (noise margin)


@dataclass
class SpeculationPolicy:
    """`cost`: the calibrated C(rows) and wire (None until calibrated); `max_depth`: the plan's
    verify_window.pipeline_depth, the deepest chain the policy may choose."""

    max_k: int
    max_depth: int = 1
    cost: CostModelWindow | None = None

    def expected_tokens(self, stats: WindowStats, k: int) -> float:
        # tau(k) = 1 + sum_{j<k} prod_{i<=j} alpha_i
        alphas = stats.position_alpha(k)
        tau, p = 1.0, 1.0
        for a in alphas:
            p *= a
            tau += p
        return tau

    def step_ms(self, rows: int, sessions: int = 1) -> float:
        # T(rows) = C(rows) + w; uncalibrated: every step costs 1
        if self.cost is None:
            return 1.0
        wire = self.cost.hops * self.cost.hop_ms if sessions < self.cost.hops else 0.0
        return max(self.cost.cost(rows) + wire, 1e-9)

    def choose(self, stats: WindowStats, active_sessions: int) -> int:
        n = max(active_sessions, 1)
        plain = 1.0 / self.step_ms(n, n)  # rate(0)
        best_k, best_rate = 0, plain
        measured = self.cost.measured_rows if self.cost is not None else n * (self.max_k + 1)
        for k in range(1, min(self.max_k, measured // n - 1) + 1):  # n(k+1) <= R
            rate = self.expected_tokens(stats, k) / self.step_ms(n * (k + 1), n)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k if best_rate >= MIN_GAIN * plain else 0

    def depth(self, stats: WindowStats, k: int, active_sessions: int, chained_rows: int, stale_rows: int) -> int:
        """Windows of this session in flight at once: 2 (up to max_depth) while chaining pays, else 1."""
        if self.max_depth <= 1 or k <= 0 or self.cost is None or active_sessions >= self.cost.hops:
            return 1  # a chain overlaps a session's windows on idle stages: none idle once n >= the stages
        n = max(active_sessions, 1)
        full = 1.0
        for a in stats.position_alpha(k):  # P(all k drafts accepted): the prior of s before chains ran
            full *= a
        prior_rows = 2.0 * (k + 1)
        s = (stale_rows + (1.0 - full) * prior_rows) / (chained_rows + prior_rows)
        step = self.step_ms(n * (k + 1), n)
        extra = self.step_ms(2 * n * (k + 1), n) - step  # the chained window's own rows
        return self.max_depth if (1.0 - s) * step > s * extra else 1
