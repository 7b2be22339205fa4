"""Verify-window sizes at stage 0: how many draft tokens k the next window of one session carries.

A window is rows [last committed, d1..dk]; the final stage returns accepted + 1 tokens (k + 1 on a full
accept). `WindowStats` is one session's record of its windows (counts, wasted rows, k trace) and its
acceptance estimate alpha; a `WindowPolicy` maps (stats, active sessions) to k, 0 meaning "decode
normally this step". Policies hold no per-session state, so one policy serves every session.

Policies:
- `FixedWindow(k)`: always k (--openai-speculative-window).
- `SimpleAdaptiveWindow(start, min_k, max_k)`: a grow/shrink rule (--openai-adaptive-speculative-window),
  applied to the last window's k, proposed n, accepted a: a >= n - 1 (full accept, or only the last draft
  rejected) -> k + 1; a < n - 1 (an earlier draft rejected) -> k - 1; a window cut short by a stop -> k;
  clamped to [min_k, max_k].
- `CostModelWindow(cost_ms, hop_ms, hops, max_k)`: argmax over k of tokens per ms (see its docstring).

alpha is a ratio of EWMAs over the draft tokens the final stage actually tested (geometric model: each
draft is accepted with probability alpha until the first rejection; drafts after it are never tested):
  S <- DECAY*S + accepted;  T <- DECAY*T + tested, tested = accepted + (1 if a draft was rejected);
  alpha = S/T, starting from the prior S/T = ALPHA_PRIOR with T = PRIOR_WEIGHT tested tokens.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

ALPHA_PRIOR = 0.5  # alpha before any window
PRIOR_WEIGHT = 2.0  # the prior counts as this many tested draft tokens
DECAY = 0.7  # weight of older evidence per observed window (~3 windows of memory)
AGED_AFTER = 32  # served batches of other row counts after which a row count's own price counts half


@dataclass
class WindowStats:
    """One session's verify windows. Counters: early = the first draft rejected, tail = some drafts
    accepted, then one rejected (wider than the grow rule's "only the last draft rejected")."""

    alpha: float = ALPHA_PRIOR  # acceptance estimate, S/T above
    weight: float = PRIOR_WEIGHT  # T: tested draft tokens behind alpha, decayed
    windows: int = 0
    proposed: int = 0  # draft tokens sent
    accepted: int = 0  # draft tokens accepted
    full_accepts: int = 0
    early_rejects: int = 0
    tail_rejects: int = 0
    stops: int = 0  # windows cut short by a stop token or the length limit, not by a rejection
    wasted_rows: int = 0  # rows computed, then thrown away: proposed - accepted
    k_start: int = 0  # k trace (the policy's k per window; 0 until the first window)
    k_last: int = 0
    k_min: int = 0
    k_max: int = 0
    last_proposed: int = 0  # the last window's outcome (SimpleAdaptiveWindow reads it)
    last_accepted: int = 0
    last_stop: bool = False
    accepted_per_pos: list[int] = field(default_factory=list)  # [i]: windows whose draft i was accepted
    pos_accepted: list[float] = field(default_factory=list)  # [i]: draft i accepted, decayed per window
    pos_tested: list[float] = field(default_factory=list)  # [i]: draft i tested (drafts 0..i-1 accepted), decayed

    def observe(self, proposed: int, accepted: int, *, k: int | None = None, stop: bool = False) -> None:
        """A window came back: `proposed` drafts sent, the first `accepted` of them accepted. `k` is the
        window the policy chose (>= proposed when the proposer had fewer; default proposed); `stop`: the
        final stage stopped at a stop token or the length limit rather than at a rejection."""
        _check(proposed, accepted)
        k = proposed if k is None else k
        if k < proposed:
            raise ValueError(f"window k {k} smaller than proposed {proposed}")
        self.windows += 1
        self.proposed += proposed
        self.accepted += accepted
        self.wasted_rows += proposed - accepted
        per_pos = self.accepted_per_pos
        per_pos.extend([0] * (accepted - len(per_pos)))
        for position in range(accepted):
            per_pos[position] += 1
        rejected = accepted < proposed and not stop
        if stop:
            self.stops += 1
        elif not rejected:
            self.full_accepts += 1
        elif accepted == 0:
            self.early_rejects += 1
        else:
            self.tail_rejects += 1
        self.k_start = k if self.windows == 1 else self.k_start
        self.k_min = k if self.windows == 1 else min(self.k_min, k)
        self.k_max = max(self.k_max, k)
        self.k_last = k
        self.last_proposed, self.last_accepted, self.last_stop = proposed, accepted, stop
        self._update_alpha(accepted, accepted + rejected)
        self._update_positions(accepted, accepted + rejected)

    def observe_shadow(self, proposed: int, accepted: int) -> None:
        """A draft that was not sent (k was 0), checked against what plain decoding then committed: moves
        alpha only, so a policy that stopped speculating can start again once drafts match."""
        _check(proposed, accepted)
        self._update_alpha(accepted, accepted + (accepted < proposed))
        self._update_positions(accepted, accepted + (accepted < proposed))

    def position_alpha(self, k: int) -> list[float]:
        """alpha_0..alpha_{k-1}: P(draft i accepted | drafts before it accepted), each the decayed counts at
        position i shrunk towards alpha: (A_i + W * alpha) / (T_i + W), W = PRIOR_WEIGHT."""
        acc, tested = self.pos_accepted, self.pos_tested
        return [((acc[i] if i < len(acc) else 0.0) + PRIOR_WEIGHT * self.alpha)
                / ((tested[i] if i < len(tested) else 0.0) + PRIOR_WEIGHT) for i in range(k)]

    def _update_positions(self, accepted: int, tested: int) -> None:
        # A_i <- DECAY*A_i + [i < accepted];  T_i <- DECAY*T_i + [i < tested]
        for counts, hits in ((self.pos_accepted, accepted), (self.pos_tested, tested)):
            counts.extend([0.0] * (tested - len(counts)))
            for i in range(len(counts)):
                counts[i] = DECAY * counts[i] + (i < hits)

    def _update_alpha(self, accepted: int, tested: int) -> None:
        s = DECAY * self.alpha * self.weight + accepted  # S: accepted drafts, decayed
        t = DECAY * self.weight + tested  # T: tested drafts, decayed
        if t > 0:
            self.alpha, self.weight = s / t, t

    @property
    def accept_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted(self) -> float:
        return self.accepted / self.windows if self.windows else 0.0


def _check(proposed: int, accepted: int) -> None:
    if not 0 <= accepted <= proposed or proposed < 1:
        raise ValueError(f"need 0 <= accepted {accepted} <= proposed {proposed} and proposed >= 1")


class WindowPolicy(Protocol):
    def choose(self, stats: WindowStats, active_sessions: int) -> int: ...


@dataclass(frozen=True)
class FixedWindow:
    k: int = 4

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"window {self.k} < 0")

    def choose(self, stats: WindowStats, active_sessions: int) -> int:
        return self.k


@dataclass(frozen=True)
class SimpleAdaptiveWindow:
    """The grow/shrink rule (module docstring); `start` is clamped into [min_k, max_k]."""

    start: int = 4
    min_k: int = 1
    max_k: int = 16

    def __post_init__(self) -> None:
        if not 1 <= self.min_k <= self.max_k:
            raise ValueError(f"need 1 <= min_k {self.min_k} <= max_k {self.max_k}")

    def choose(self, stats: WindowStats, active_sessions: int) -> int:
        if stats.windows == 0:
            k = self.start
        elif stats.last_stop:
            k = stats.k_last
        elif stats.last_accepted >= stats.last_proposed - 1:  # full accept / last draft rejected: grow
            k = stats.k_last + 1
        else:  # an earlier draft rejected: shrink
            k = stats.k_last - 1
        return min(max(k, self.min_k), self.max_k)


def tau(alpha: float, k: int) -> float:
    # tau: expected tokens committed per window of k drafts = sum_{i<=k} alpha^i = (1 - alpha^(k+1)) / (1 - alpha)
    a = min(max(alpha, 0.0), 1.0)
    return k + 1.0 if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


class CostModelWindow:
    """k in 0..max_k maximising tokens per ms: tau(k) / (C(rows) + hops * hop_ms).

    C(r): ms of one pipeline decode with r rows, from `cost_ms` (a sequence indexed by rows, index 0
    unused, NaN = not measured; or a mapping rows -> ms). Rows not measured are interpolated linearly
    between their measured neighbours; beyond the table, extrapolated from the last measured row with the
    table's mean slope (last - first) / (rows between): the curve is a sawtooth, a single step between two
    row counts can be several times the mean slope (measured: docs/measurements.md, 'Decode cost by rows'),
    so the last segment's slope would price extra rows as steps.

    One session: rows = k + 1. With n > 1 sessions active, assume each sends a window of the same k into
    one decode of n(k+1) rows, committing n * tau(k) tokens: the cap is the argmax of
    tau(k) / (C(n(k+1)) + hops * hop_ms) (per-session cost C(n(k+1)) / n), and k = min(single, cap).
    As n grows, the fixed hop term weighs less against the rows' cost and the cap falls.
    `hop_ms` may be updated as the measured round trip changes. Ties go to the smaller k.

    Calibration decodes one fresh sequence; served batches attend over every session's KV cells (the cache is
    unified), so each of their rows costs more, and more the longer the contexts; other work on the host
    moves every price. `observe(rows, ms)` takes a served decode batch's measured compute (every stage's,
    the final stage's verification included); prices are calibration times a factor, C(r) = C_cal(r) * g(r):
    - f, served against calibrated: EWMA over every served batch of ms / C_cal(r). Other work on the host, a
      noisy minute, the contexts' length move it, and every price with it by the same factor, which leaves the
      choice between windows as it was (only the wire's share changes). A row count not served takes g = f,
      below 1 too: a calibration that ran in a slow minute (measured: 0.42-0.69x of what served batches then
      took) priced every window never served at twice its cost and the policy never drafted at c = 8. (An
      excess per row below 0, the model before, did price 24-row batches at a third of calibration, a factor
      that grows with the rows: 0.72-0.88x at c = 8-16.)
    - A row count served has its own ratio, EWMA of its batches' ms / C_cal(r), which calibration's shape may
      have got wrong (measured: 8 sessions' batches of 11-17 rows took 2.3-2.8x the 8-row batch where
      calibration said 1.3-1.9x); its weight halves every `AGED_AFTER` batches of other row counts since it was
      last served (g blends into f), so one dear spell does not price a window out for good.
    A price that was too low is so corrected by the batches it chose, and bounds every larger batch's from
    below. `error` is the EWMA of how far each price missed the batch it priced (relative): a gain smaller
    than that is within the model's own error (the policy asks for more). An excess added per row instead (the
    earlier model) multiplied one noisy 1-row step by a window's rows: +27 ms on a 27 ms step priced an 8-row
    window at 3.6x its calibration and the policy stopped drafting.
    """

    def __init__(self, cost_ms: Sequence[float] | Mapping[int, float], hop_ms: float, hops: int, max_k: int) -> None:
        items = cost_ms.items() if isinstance(cost_ms, Mapping) else enumerate(cost_ms)
        known = sorted((int(r), float(c)) for r, c in items if r >= 1 and not math.isnan(c))
        if not known:
            raise ValueError("cost table has no measured row")
        if max_k < 0 or hops < 0 or hop_ms < 0:
            raise ValueError(f"need max_k, hops, hop_ms >= 0 (got {max_k}, {hops}, {hop_ms})")
        self._rows = [r for r, _ in known]
        self._ms = [c for _, c in known]
        span = self._rows[-1] - self._rows[0]
        self._slope = (self._ms[-1] - self._ms[0]) / span if span else 0.0
        self._table: dict[int, float] = {}
        self.hop_ms, self.hops, self.max_k = hop_ms, hops, max_k
        self.speed = 1.0  # f: EWMA of served batch ms / C_cal(rows), every row count
        self.error = 0.0  # EWMA of |served ms - C(rows)| / C(rows): how far prices miss what batches then take
        self.observed = 0  # served batches observed
        self.served: dict[int, tuple[float, int]] = {}  # rows -> (EWMA ms / C_cal(rows), `observed` when last served)

    def calibrated_table(self) -> dict[int, float]:
        """The rows calibration measured and their ms."""
        return dict(zip(self._rows, self._ms))

    def observe(self, rows: int, ms: float, weight: float = 0.1) -> None:
        """A served decode batch of `rows` rows took `ms` of compute over all stages."""
        calibrated = self.calibrated(rows) if rows >= 1 else 0.0
        if calibrated <= 0 or not math.isfinite(ms) or ms <= 0:
            return
        ratio = ms / calibrated
        # how far the model's price was off: a window has to beat plain decoding by more than this (the policy)
        predicted = self.cost(rows)
        miss = abs(ms - predicted) / max(predicted, 1e-9) if self.observed else 0.0
        self.error = miss if self.observed == 1 else (1 - weight) * self.error + weight * miss
        self.speed = ratio if self.observed == 0 else (1 - weight) * self.speed + weight * ratio
        last = self.served.get(rows)
        self.observed += 1
        self.served[rows] = (ratio if last is None else (1 - 2 * weight) * last[0] + 2 * weight * ratio, self.observed)

    def _price(self, rows: int) -> float:
        ratio, seen = self.served.get(rows, (self.speed, self.observed))
        w = 0.5 ** ((self.observed - seen) / AGED_AFTER)
        return self.calibrated(rows) * (w * ratio + (1 - w) * self.speed)

    @property
    def measured_rows(self) -> int:
        """The most rows the table measured (beyond it C is extrapolated)."""
        return self._rows[-1]

    def cost(self, rows: int) -> float:
        """C(rows) in ms of a served batch (class docstring); never below a served smaller row count's."""
        return max([self._price(rows), *(self._price(r) for r in self.served if r < rows)])

    def calibrated(self, rows: int) -> float:
        """C_cal(rows): measured, interpolated, or extrapolated as in the class docstring."""
        if rows not in self._table:
            rs, ms = self._rows, self._ms
            i = bisect.bisect_left(rs, rows)
            if i < len(rs) and rs[i] == rows:
                c = ms[i]
            elif 0 < i < len(rs):  # between two measured rows
                c = ms[i - 1] + (ms[i] - ms[i - 1]) * (rows - rs[i - 1]) / (rs[i] - rs[i - 1])
            else:  # before the first or after the last measured row
                j = 0 if i == 0 else len(rs) - 1
                c = ms[j] + self._slope * (rows - rs[j])
            self._table[rows] = max(c, 0.0)
        return self._table[rows]

    def best_k(self, alpha: float, sessions: int = 1) -> int:
        # rate(k) = tau(k) / (C(n(k+1)) + hops*hop): tokens per ms, n sessions each with window k
        wire = self.hops * self.hop_ms
        n = max(sessions, 1)
        rates = [tau(alpha, k) / max(self.cost(n * (k + 1)) + wire, 1e-9) for k in range(self.max_k + 1)]
        return max(range(len(rates)), key=lambda k: (rates[k], -k))

    def choose(self, stats: WindowStats, active_sessions: int) -> int:
        k = self.best_k(stats.alpha)
        return min(k, self.best_k(stats.alpha, active_sessions)) if active_sessions > 1 else k


def calibration_rows(max_rows: int, batch_rows: int, step: int = 8) -> list[int]:
    """Rows calibration measures: every count 1..max_rows (one session's windows), then every `step` rows up to
    `batch_rows` (several sessions' windows in one batch; between two of them C is interpolated)."""
    return list(range(1, max_rows + 1)) + list(range((max_rows // step + 1) * step, batch_rows + 1, step))


def sweep_rows(max_rows: int, extra_rows: Sequence[int] = ()) -> list[int]:
    """One calibration sweep's row counts, in order: 1..max_rows, then the extra rows beyond it."""
    return list(range(1, max_rows + 1)) + sorted(r for r in set(extra_rows) if r > max_rows)


def calibrate_cost(measure: Callable[[int], float], max_rows: int, repeats: int = 3,
                   extra_rows: Sequence[int] = ()) -> list[float]:
    """C table for CostModelWindow: [0.0, C(1), .., C(max_rows)] and C at each of `extra_rows` (rows between
    left NaN: not measured), each the median of `repeats` calls of measure(rows) (ms of one decode with that
    many logits rows). Rows are swept `repeats` times in turn (1..max_rows and the extra rows, then again) so a
    slow drift of the host spreads over all rows instead of a few."""
    if max_rows < 1 or repeats < 1:
        raise ValueError(f"need max_rows >= 1 and repeats >= 1 (got {max_rows}, {repeats})")
    sweep = sweep_rows(max_rows, extra_rows)
    samples: list[list[float]] = [[] for _ in range(sweep[-1] + 1)]
    for _ in range(repeats):
        for rows in sweep:
            samples[rows].append(float(measure(rows)))
    return [0.0] + [statistics.median(s) if s else math.nan for s in samples[1:]]
