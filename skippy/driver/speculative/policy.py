"""The default speculation policy: per session, k and the pipeline depth from measured acceptance, the live
load and the calibrated cost of rows. On unless `--no-speculative` or a plan says "disabled".

Inputs, all measured:
- alpha_i, the acceptance of draft i given drafts 0..i-1 were accepted (WindowStats.position_alpha: decayed
  per-position counts, shrunk towards the session's overall alpha where a position has little evidence);
- n, the sessions decoding (the live load), split by the driver over m micro-batches in flight (one per group of
  stages that share no core: skippy.config.cpu_sets.stage_groups), b = ceil(n / m) to a micro-batch; each
  brings k + 1 rows, so a micro-batch holds b(k + 1) rows;
- C(rows), ms of one decode of that many rows through the pipeline (skippy.driver.verify_costs at startup, then
  following the served decode batches: CostModelWindow.observe), and the wire's hops x hop_ms (measured live);
- s, the share of a session's chained-window rows that came back stale.

    P_j     = prod_{i<=j} alpha_i                      # draft j is accepted
    tau(k)  = 1 + sum_{j<k} P_j                        # tokens a window of k drafts commits
    rate(k) = tau(k) / (C(b(k+1)) + w)                  # tokens per ms per session
    w       = hops*hop_ms while min(n, m) < stages, else 0  # other micro-batches in flight hide the wire; with
              m = 1 (stages sharing cores) none is, so a slow wire is paid on every step at any load
    k*      = argmax_k rate(k) over k with b(k+1) <= R;  k = 0 when rate(k*)/rate(0) < max(G, 1 + e), G = MIN_GAIN
              for a session alone in its micro-batch, SHARED_MIN_GAIN for one of several (what drafting costs
              them that C(rows) does not price: see the constant)
              (`choose`: as if the b sessions of a micro-batch drafted alike; the engine `allocate`s the
              rows of each micro-batch over its sessions, the best expected tokens per ms of the batch)
    R       = the most rows calibration measured (every row to max_k + 1, then every 8 to a micro-batch's share
              of the lanes, at most 32): beyond it C is a guess, and pricing several sessions' windows with
              an extrapolated (or one-sequence, batch-size) table lost 0.35-0.78x at c = 8 in an earlier
              bench (docs/bench-speculative.md), so the policy does not speculate on a guess
    e       = how far served batches missed their price (CostModelWindow.error, relative, EWMA): a gain within
              the model's error is no gain. Measured: at 16 sessions a decode row cost the head stage ~9.5 ms
              whatever the batch (no fixed part left to share), calibration priced 14 draft rows at a 5% gain,
              and the policy ran 0.78-0.86x plain; at one session windows gain 1.5-2.3x, far outside it
    depth 2 when min(n, m) < stages and (1 - s) * T_step > s * (C(2b(k+1)) - C(b(k+1))): a chained window
            saves a step T_step when its predecessor is fully accepted, and costs its own rows when it is not;
            with a micro-batch on every stage already, a chain only adds rows

Before the pipeline's C(rows) is measured every row costs the same (C = 1, no wire): k is then the
largest k whose gain is >= min_gain(b). While k = 0 the engine still drafts a shadow proposal, checked against
what plain decoding commits, so alpha stays measured and k comes back when drafts start to match.
"""

from __future__ import annotations

from dataclasses import dataclass

from skippy.driver.speculative.window import CostModelWindow, WindowStats

MIN_GAIN = 1.05  # speculate only for >= 5% more tokens per ms than plain decoding (noise margin)
# drafts per session when a micro-batch holds several: measured (Gemma 3 270M, 2 stages on one 2-vCPU host, 8
# sessions of re-emission) windows of up to 16 ran 0.86-0.96x plain where windows of up to 8 ran 0.95-1.00x; a
# session alone gains from 16 (a repeated sub-task: TPOT 1/2.7 of its first run's, against 1/2 with 8)
SHARED_MAX_K = 8
# the gain a micro-batch of several sessions must expect: drafting desynchronises sessions that plain decoding
# keeps in step, so prompts that would have prefilled together prefill one by one inside decode batches, a cost
# C(rows) does not price. Measured (2-vCPU AMD EPYC, SmolLM2 in one stage, chat workloads, c = 8-16): the policy's
# draft rows left decode compute within 1-9% of plain's while prefill cost 2-5% more, and whole cells read
# 0.84-0.96x plain at predicted gains of 5-15%
SHARED_MIN_GAIN = 1.2


def session_max_k(max_k: int, sessions: int) -> int:
    """The most drafts one session of a micro-batch of `sessions` may get: max_k alone, SHARED_MAX_K among several."""
    return max_k if sessions <= 1 else min(max_k, SHARED_MAX_K)


def min_gain(sessions: int) -> float:
    """The expected gain over plain decoding a micro-batch of `sessions` sessions must promise to draft."""
    return MIN_GAIN if sessions <= 1 else SHARED_MIN_GAIN


def window_rows(max_k: int, sessions: int) -> int:
    """The most rows a micro-batch of `sessions` sessions' verify windows holds (a session alone: max_k + 1)."""
    return max(max_k + 1, sessions * (session_max_k(max_k, sessions) + 1))


@dataclass
class SpeculationPolicy:
    """`cost`: the calibrated C(rows) and wire (None until calibrated); `max_depth`: the plan's
    verify_window.pipeline_depth, the deepest chain the policy may choose; `micro_batches`: m, the driver's
    micro-batches in flight at most."""

    max_k: int
    max_depth: int = 1
    cost: CostModelWindow | None = None
    micro_batches: int = 1

    def expected_tokens(self, stats: WindowStats, k: int) -> float:
        # tau(k) = 1 + sum_{j<k} prod_{i<=j} alpha_i
        alphas = stats.position_alpha(k)
        tau, p = 1.0, 1.0
        for a in alphas:
            p *= a
            tau += p
        return tau

    def load(self, active_sessions: int) -> tuple[int, int]:
        """(b, sessions to a micro-batch; min(n, m), micro-batches really in flight) for n decoding sessions."""
        n, m = max(active_sessions, 1), max(self.micro_batches, 1)
        return -(-n // m), min(n, m)

    def step_ms(self, rows: int, in_flight: int = 1) -> float:
        # T(rows) = C(rows) + w; uncalibrated: every step costs 1
        if self.cost is None:
            return 1.0
        wire = self.cost.hops * self.cost.hop_ms if in_flight < self.cost.hops else 0.0
        return max(self.cost.cost(rows) + wire, 1e-9)

    def choose(self, stats: WindowStats, active_sessions: int) -> int:
        """k for a session as if every session of its micro-batch drafted like it (`allocate` of b copies)."""
        b, _ = self.load(active_sessions)
        if self.cost is not None:
            return self.allocate([stats] * b, active_sessions)[0]
        plain, best_k, best_rate = 1.0, 0, 1.0  # uncalibrated: every step costs 1, so rate(k) = tau(k)
        for k in range(1, session_max_k(self.max_k, b) + 1):
            rate = self.expected_tokens(stats, k)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k if best_rate >= min_gain(b) * plain else 0

    def allocate(self, batch: list[WindowStats], active_sessions: int, caps: list[int] | None = None,
                 riders: int = 0) -> list[int]:
        """k per session of one micro-batch (`batch`, each session's stats; `active_sessions` decoding in all;
        `caps`, the most drafts each session's request can still commit; `riders`, prompt rows the batch
        carries too): the draft rows that maximise the batch's expected tokens per ms.

            gain(i, j) = P_ij = prod_{l<=j} alpha_il       # tokens session i's draft j adds
            T_E        = T(s) + T(s + p + E) - T(s + p)     # s sessions, p riders, E draft rows: the drafts pay
                                                            # what they add to the batch, on top of its riders
            E*         = argmax_E (s + top_E gain) / T_E    # s + p + E <= R
        P_ij falls with j, so the E largest gains take each session's drafts in order. k = 0 for all when
        the best rate is below max(min_gain(s), 1 + the cost model's error) x the plain rate s / T(s); a
        session of a batch of several drafts at most SHARED_MAX_K. The
        rows' cost is the batch's: one good session among plain ones pays C(s + p + k) - C(s + p), not
        C(s(k + 1)) as if all drafted like it; a batch that a prompt chunk already makes compute-bound (or
        longer than calibration measured) has no cheap rows left for drafts. (The riders' own cost is not
        the drafts' to share: it is paid with or without them.)"""
        if self.cost is None:
            return [self.choose(stats, active_sessions) for stats in batch]
        _, in_flight = self.load(active_sessions)
        s = len(batch)
        gains: list[tuple[float, int, int]] = []  # (-P_ij, j, i): best first, a session's drafts in order
        max_k = session_max_k(self.max_k, s)
        for i, stats in enumerate(batch):
            p = 1.0
            cap = min(max_k, caps[i]) if caps is not None else max_k
            for j, a in enumerate(stats.position_alpha(max(cap, 0))):
                p *= a
                gains.append((-p, j, i))
        gains.sort()
        base, alone = s + riders, self.step_ms(s, in_flight)
        plain = s / alone
        best_e, best_rate, tokens = 0, plain, float(s)
        for e in range(1, min(len(gains), self.cost.measured_rows - base) + 1):  # s + p + E <= R
            tokens -= gains[e - 1][0]
            rate = tokens / (alone + self.step_ms(base + e, in_flight) - self.step_ms(base, in_flight))
            if rate > best_rate:
                best_e, best_rate = e, rate
        ks = [0] * s
        if best_rate >= max(min_gain(s), 1.0 + self.cost.error) * plain:
            for _, _, i in gains[:best_e]:
                ks[i] += 1
        return ks

    def depth(self, stats: WindowStats, k: int, active_sessions: int, chained_rows: int, stale_rows: int) -> int:
        """Windows of this session in flight at once: 2 (up to max_depth) while chaining pays, else 1."""
        b, in_flight = self.load(active_sessions)
        if self.max_depth <= 1 or k <= 0 or self.cost is None or in_flight >= self.cost.hops:
            return 1  # a chain overlaps a session's windows on idle stages: none idle with a micro-batch on each
        full = 1.0
        for a in stats.position_alpha(k):  # P(all k drafts accepted): the prior of s before chains ran
            full *= a
        prior_rows = 2.0 * (k + 1)
        s = (stale_rows + (1.0 - full) * prior_rows) / (chained_rows + prior_rows)
        step = self.step_ms(b * (k + 1), in_flight)
        extra = self.step_ms(2 * b * (k + 1), in_flight) - step  # the chained window's own rows
        return self.max_depth if (1.0 - s) * step > s * extra else 1
