"""Verify-window sizes (skippy.driver.speculative.window): per-session WindowStats, and the fixed,
simple-adaptive (the reference's grow/shrink rule) and cost-model policies.

The cost model is checked against an argmax computed here independently (numpy.interp over the issue's
Gemma 3 270M curve), and for the directions the model implies: more acceptance or a slower hop -> larger
k, more active sessions -> no larger k, and k following alpha both ways as windows are observed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from skippy.driver.speculative.window import (
    AGED_AFTER,
    ALPHA_PRIOR,
    DECAY,
    PRIOR_WEIGHT,
    CostModelWindow,
    FixedWindow,
    SimpleAdaptiveWindow,
    WindowPolicy,
    WindowStats,
    calibrate_cost,
    calibration_rows,
    tau,
)

# issue 9: one full-model decode with logits on every row, Gemma 3 270M on a 2-vCPU Xeon
GEMMA_MS = {1: 23.0, 2: 25.0, 4: 32.0, 5: 49.0, 8: 52.0, 9: 68.0, 12: 63.0, 13: 78.0, 16: 75.0, 17: 92.0}
MAX_K = 16  # rows k + 1 <= 17 stay inside the measured table
HOPS = 2


def reference_best_k(alpha: float, hop_ms: float) -> int:
    """argmax_k tau(k) / (C(k+1) + hops*hop), from the issue's formula; ties to the smaller k."""
    rows = np.array(sorted(GEMMA_MS))
    ms = np.array([GEMMA_MS[r] for r in rows])
    best, best_rate = 0, -1.0
    for k in range(MAX_K + 1):
        t = k + 1.0 if alpha == 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)
        rate = t / (float(np.interp(k + 1, rows, ms)) + HOPS * hop_ms)
        if rate > best_rate * (1 + 1e-12):
            best, best_rate = k, rate
    return best


def gemma(hop_ms: float = 20.0) -> CostModelWindow:
    return CostModelWindow(GEMMA_MS, hop_ms=hop_ms, hops=HOPS, max_k=MAX_K)


def stats_with(alpha: float) -> WindowStats:
    return WindowStats(alpha=alpha)


# ---- WindowStats


def test_stats_classify_full_early_tail_and_count_wasted_rows() -> None:
    s = WindowStats()
    s.observe(4, 4)  # full accept
    s.observe(4, 0)  # first draft rejected
    s.observe(4, 2)  # two accepted, then a rejection
    s.observe(3, 2)  # last draft rejected: still a tail reject here
    assert (s.windows, s.full_accepts, s.early_rejects, s.tail_rejects, s.stops) == (4, 1, 1, 2, 0)
    assert (s.proposed, s.accepted, s.wasted_rows) == (15, 8, 7)
    assert s.accept_rate == pytest.approx(8 / 15) and s.mean_accepted == pytest.approx(2.0)


def test_stats_stop_is_neither_accept_nor_reject_and_tests_only_accepted_drafts() -> None:
    s = WindowStats()
    s.observe(5, 2, stop=True)
    assert (s.stops, s.full_accepts, s.early_rejects, s.tail_rejects, s.wasted_rows) == (1, 0, 0, 0, 3)
    # 2 drafts tested, both accepted: alpha rises
    assert s.alpha == pytest.approx((DECAY * ALPHA_PRIOR * PRIOR_WEIGHT + 2) / (DECAY * PRIOR_WEIGHT + 2))


def test_stats_k_trace_records_start_last_min_max_of_the_chosen_window() -> None:
    s = WindowStats()
    assert (s.k_start, s.k_last, s.k_min, s.k_max) == (0, 0, 0, 0)
    for k in (4, 6, 2, 5):
        s.observe(min(k, 3), 1, k=k)  # the proposer had at most 3 drafts
    assert (s.k_start, s.k_last, s.k_min, s.k_max) == (4, 5, 2, 6)
    assert s.proposed == 3 + 3 + 2 + 3
    s2 = WindowStats()
    s2.observe(3, 3)  # k defaults to proposed
    assert (s2.k_start, s2.k_last, s2.k_min, s2.k_max) == (3, 3, 3, 3)


@pytest.mark.parametrize(("proposed", "accepted", "k"), [(0, 0, None), (3, 4, None), (3, -1, None), (4, 2, 3)])
def test_stats_refuse_impossible_windows(proposed: int, accepted: int, k: int | None) -> None:
    with pytest.raises(ValueError):
        WindowStats().observe(proposed, accepted, k=k)


def test_alpha_first_update_follows_the_documented_formula() -> None:
    s = WindowStats()
    assert (s.alpha, s.weight) == (ALPHA_PRIOR, PRIOR_WEIGHT)
    s.observe(4, 4)  # S = DECAY*0.5*2 + 4, T = DECAY*2 + 4
    S, T = DECAY + 4, 2 * DECAY + 4
    assert s.alpha == pytest.approx(S / T) and s.weight == pytest.approx(T)
    s.observe(4, 1)  # 1 accepted + 1 rejected tested
    assert s.alpha == pytest.approx((DECAY * S + 1) / (DECAY * T + 2))


def test_alpha_moves_toward_observed_acceptance_both_ways() -> None:
    up = WindowStats()
    seen = [up.alpha]
    for _ in range(30):
        up.observe(4, 4)
        seen.append(up.alpha)
    assert all(b > a for a, b in zip(seen, seen[1:])) and up.alpha > 0.99
    for _ in range(30):
        up.observe(4, 0)
    assert up.alpha < 0.01


def test_alpha_is_per_tested_draft_not_accepted_over_proposed() -> None:
    # 2 of 4 accepted, then a rejection: 3 drafts tested, 2 accepted -> alpha 2/3 (accepted/proposed is 1/2)
    s = WindowStats()
    for _ in range(80):
        s.observe(4, 2)
    assert s.alpha == pytest.approx(2 / 3, abs=1e-6) and s.accept_rate == pytest.approx(0.5)


def test_shadow_observation_moves_alpha_only() -> None:
    s = WindowStats(alpha=0.05)
    for _ in range(10):
        s.observe_shadow(1, 1)
    assert s.alpha > 0.9
    assert (s.windows, s.proposed, s.accepted, s.wasted_rows, s.k_max) == (0, 0, 0, 0, 0)


# ---- FixedWindow


@pytest.mark.parametrize("k", [0, 1, 4, 9])
def test_fixed_window_ignores_stats_and_sessions(k: int) -> None:
    policy: WindowPolicy = FixedWindow(k)
    s = WindowStats()
    assert policy.choose(s, 1) == k
    for _ in range(5):
        s.observe(4, 0)
    assert policy.choose(s, 8) == k


def test_fixed_window_default_is_the_references_4_and_refuses_negative() -> None:
    assert FixedWindow().choose(WindowStats(), 1) == 4
    with pytest.raises(ValueError):
        FixedWindow(-1)


# ---- SimpleAdaptiveWindow


def run_simple(policy: SimpleAdaptiveWindow, outcomes: list[tuple[int, bool]]) -> list[int]:
    """Each outcome: (accepted drafts, stop); the proposer always has k drafts. Returns k before each
    window and after the last."""
    s, ks = WindowStats(), []
    for accepted, stop in outcomes:
        k = policy.choose(s, 1)
        ks.append(k)
        s.observe(k, min(accepted, k), k=k, stop=stop)
    return [*ks, policy.choose(s, 1)]


def test_simple_grows_on_full_accept_and_on_last_draft_reject() -> None:
    p = SimpleAdaptiveWindow(start=4, min_k=1, max_k=16)
    assert run_simple(p, [(99, False)] * 3) == [4, 5, 6, 7]
    assert run_simple(p, [(3, False)]) == [4, 5]  # 3 of 4: only the last draft rejected (TailReject)


@pytest.mark.parametrize("accepted", [0, 1, 2])
def test_simple_shrinks_by_one_on_earlier_reject(accepted: int) -> None:
    assert run_simple(SimpleAdaptiveWindow(4, 1, 16), [(accepted, False)]) == [4, 3]


def test_simple_keeps_k_after_a_stop() -> None:
    assert run_simple(SimpleAdaptiveWindow(4, 1, 16), [(1, True), (0, True)]) == [4, 4, 4]


def test_simple_grows_from_the_chosen_window_when_the_proposer_had_fewer() -> None:
    p, s = SimpleAdaptiveWindow(6, 1, 16), WindowStats()
    s.observe(2, 2, k=p.choose(s, 1))
    assert p.choose(s, 1) == 7


def test_simple_respects_bounds() -> None:
    p = SimpleAdaptiveWindow(start=4, min_k=2, max_k=6)
    assert run_simple(p, [(99, False)] * 10)[-3:] == [6, 6, 6]
    assert run_simple(p, [(0, False)] * 10)[-3:] == [2, 2, 2]
    assert SimpleAdaptiveWindow(start=4, min_k=1, max_k=2).choose(WindowStats(), 1) == 2  # start min(max, 4)
    assert SimpleAdaptiveWindow(start=1, min_k=3, max_k=8).choose(WindowStats(), 1) == 3
    for lo, hi in [(0, 4), (5, 4)]:
        with pytest.raises(ValueError):
            SimpleAdaptiveWindow(4, lo, hi)


# ---- CostModelWindow


def test_tau_limits() -> None:
    assert tau(0.0, 7) == 1.0
    assert tau(1.0, 7) == 8.0
    assert tau(0.5, 2) == pytest.approx(1.75)
    assert tau(1 - 1e-9, 7) == pytest.approx(8.0, rel=1e-6)


def test_cost_interpolates_missing_rows_and_extrapolates_with_the_mean_slope() -> None:
    m = gemma()
    assert m.cost(1) == 23.0 and m.cost(16) == 75.0
    assert m.cost(3) == pytest.approx(28.5) and m.cost(10) == pytest.approx(68 - 5 / 3)
    slope = (92.0 - 23.0) / 16
    assert m.cost(20) == pytest.approx(92.0 + 3 * slope)
    as_list = [math.nan] * 18
    for r, c in GEMMA_MS.items():
        as_list[r] = c
    m2 = CostModelWindow(as_list, hop_ms=20.0, hops=HOPS, max_k=MAX_K)
    assert [m2.cost(r) for r in range(1, 40)] == [m.cost(r) for r in range(1, 40)]
    below = CostModelWindow({4: 30.0, 8: 50.0}, hop_ms=0.0, hops=1, max_k=4)
    assert below.cost(2) == pytest.approx(20.0)  # before the first row: same mean slope (5 ms/row)


def test_cost_model_refuses_an_empty_table() -> None:
    with pytest.raises(ValueError):
        CostModelWindow([0.0, math.nan], hop_ms=0.0, hops=1, max_k=4)


@pytest.mark.parametrize("hop_ms", [0.0, 20.0])
@pytest.mark.parametrize("alpha", [0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99, 1.0])
def test_cost_model_picks_the_formulas_argmax(alpha: float, hop_ms: float) -> None:
    assert gemma(hop_ms).choose(stats_with(alpha), 1) == reference_best_k(alpha, hop_ms)


def test_cost_model_high_alpha_picks_a_larger_window_than_low_alpha() -> None:
    m = gemma(20.0)
    low, high = m.choose(stats_with(0.3), 1), m.choose(stats_with(0.9), 1)
    assert high > low >= 1
    assert high + 1 in (4, 8, 12, 16)  # the curve's sweet spots


def test_cost_model_alpha_zero_decodes_normally() -> None:
    assert reference_best_k(0.0, 20.0) == 0  # tau = 1 for every k: the cheapest row count wins
    assert gemma(20.0).choose(stats_with(0.0), 1) == 0
    assert gemma(0.0).choose(stats_with(0.0), 1) == 0


def test_cost_model_slower_hop_never_shrinks_the_window() -> None:
    fast, slow = gemma(0.0), gemma(20.0)
    pairs = [(fast.choose(stats_with(a), 1), slow.choose(stats_with(a), 1)) for a in np.linspace(0.01, 0.99, 50)]
    assert all(s >= f for f, s in pairs)
    assert any(s > f for f, s in pairs)
    assert fast.choose(stats_with(0.8), 1) < slow.choose(stats_with(0.8), 1)


def test_cost_model_hop_can_be_updated_in_place() -> None:
    m = gemma(0.0)
    before = m.choose(stats_with(0.8), 1)
    m.hop_ms = 20.0
    assert m.choose(stats_with(0.8), 1) == reference_best_k(0.8, 20.0) > before


@pytest.mark.parametrize("hop_ms", [0.0, 20.0])
def test_cost_model_caps_the_window_with_many_sessions(hop_ms: float) -> None:
    m = gemma(hop_ms)
    for alpha in np.linspace(0.0, 1.0, 21):
        one = m.choose(stats_with(float(alpha)), 1)
        for n in (2, 4, 8, 16):
            assert m.choose(stats_with(float(alpha)), n) <= one
    assert m.choose(stats_with(0.9), 8) < m.choose(stats_with(0.9), 1)


def test_cost_model_k_moves_both_ways_with_observed_windows() -> None:
    m, s = gemma(20.0), WindowStats()
    trace = []
    for accepted_all in [True] * 8 + [False] * 20:
        k = m.choose(s, 1)
        trace.append(k)
        if k:
            s.observe(k, k if accepted_all else 0, k=k)
        else:
            s.observe_shadow(1, 0)
    peak = trace.index(max(trace))
    assert trace[0] < max(trace) and trace[-1] < max(trace)
    assert trace[: peak + 1] == sorted(trace[: peak + 1]) and trace[peak:] == sorted(trace[peak:], reverse=True)
    assert trace[-1] == 0  # stopped speculating ...
    for _ in range(10):
        s.observe_shadow(1, 1)  # ... until unsent drafts match what plain decoding committed
    assert m.choose(s, 1) > 0


# ---- calibrate_cost


def test_calibrate_cost_takes_the_median_of_interleaved_sweeps() -> None:
    calls: list[int] = []
    outliers = {(2, 1): 500.0}  # (rows, sweep) -> a slow sample

    def measure(rows: int) -> float:
        sweep = calls.count(rows)
        calls.append(rows)
        return outliers.get((rows, sweep), 10.0 + rows + sweep)

    table = calibrate_cost(measure, max_rows=4, repeats=3)
    assert calls == [1, 2, 3, 4] * 3
    assert len(table) == 5 and table[0] == 0.0
    assert table[1:] == [12.0, 14.0, 14.0, 15.0]  # rows 2: median(12, 500, 14), not the mean 175.3
    assert CostModelWindow(table, hop_ms=0.0, hops=1, max_k=3).cost(2) == 14.0


def test_calibration_measures_every_row_of_a_window_then_every_8_of_a_batch() -> None:
    assert calibration_rows(9, 32) == [*range(1, 10), 16, 24, 32]
    assert calibration_rows(4, 4) == [1, 2, 3, 4] and calibration_rows(8, 20) == [*range(1, 9), 16]
    seen: list[int] = []
    table = calibrate_cost(lambda rows: seen.append(rows) or 2.0 * rows, max_rows=3, repeats=2, extra_rows=[8, 2])
    assert seen == [1, 2, 3, 8] * 2  # extra rows within 1..max_rows are measured once per sweep
    assert table[:4] == [0.0, 2.0, 4.0, 6.0] and table[8] == 16.0 and all(math.isnan(c) for c in table[4:8])
    window = CostModelWindow(table, 0.0, 2, 8)
    assert window.measured_rows == 8 and window.cost(5) == pytest.approx(10.0)  # interpolated


def test_served_batches_scale_the_calibrated_cost_and_correct_its_shape() -> None:
    window = CostModelWindow([0.0] + [10.0 * r for r in range(1, 33)], 0.0, 2, 8)
    window.observe(8, 96.0)  # a served batch of 8 rows at 1.2x calibration: the host is slower now
    assert window.cost(16) == pytest.approx(192.0) and window.calibrated(16) == pytest.approx(160.0)
    assert window.cost(8) == pytest.approx(96.0)  # served at that many rows: its own price
    for _ in range(200):
        window.observe(4, 40.0)  # the host is as fast as at calibration again: the factor decays back
    assert window.speed == pytest.approx(1.0, abs=1e-6) and window.cost(16) == pytest.approx(160.0)
    window.observe(16, 400.0)  # dearer than the model said: the batches that row count chose correct it
    assert window.cost(16) == pytest.approx(400.0)
    window.observe(16, 300.0)
    assert 300.0 < window.cost(16) < 400.0
    assert window.cost(20) == window.cost(16) < window.cost(32)  # more rows never cheaper
    for _ in range(AGED_AFTER * 8):
        window.observe(4, 40.0)  # 16 rows not served for long: its price blends back into the host's factor
    assert window.cost(16) == pytest.approx(160.0, rel=0.01)
    cheaper = CostModelWindow([0.0] + [10.0 * r for r in range(1, 33)], 0.0, 2, 8)
    cheaper.observe(8, 40.0)  # calibrated in a slow minute: every row count is cheaper alike, the shape kept
    assert cheaper.speed == 0.5 and cheaper.cost(24) == pytest.approx(120.0) and cheaper.cost(8) == 40.0
    window.observe(0, 5.0)
    window.observe(4, math.nan)  # nothing to learn from
    assert window.observed == 203 + AGED_AFTER * 8


def test_a_slow_spell_on_one_row_steps_leaves_the_window_as_it_was() -> None:
    """The measured table of a 2-stage SmolLM2 (ms by rows); one-row steps served at twice their price (a
    busy minute) raise every price by that factor, so the best window stays; an excess per row did not."""
    table = [0.0, 27.0, 37.0, 44.0, 52.0, 60.0, 68.0, 76.0, 84.0, 115.0]
    window, calm = CostModelWindow(table, 0.0, 2, 8), CostModelWindow(table, 0.0, 2, 8)
    for _ in range(10):
        window.observe(1, 54.0)
    assert window.cost(1) == pytest.approx(54.0, rel=0.01) and window.cost(8) == pytest.approx(168.0, rel=0.01)
    assert window.best_k(0.9) == calm.best_k(0.9) > 0


def test_calibrate_cost_single_repeat_and_bad_arguments() -> None:
    assert calibrate_cost(lambda rows: 2.0 * rows, max_rows=3, repeats=1) == [0.0, 2.0, 4.0, 6.0]
    for max_rows, repeats in [(0, 3), (3, 0)]:
        with pytest.raises(ValueError):
            calibrate_cost(lambda rows: 1.0, max_rows=max_rows, repeats=repeats)
