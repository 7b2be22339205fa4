"""The default speculation policy (skippy.driver.speculative.policy): k from per-position acceptance, the load
and the calibrated C(rows), 0 when the expected gain is below MIN_GAIN; the pipeline depth from the share of
stale rows; the per-position acceptance estimate it reads (WindowStats.position_alpha)."""

from __future__ import annotations

import pytest

from skippy.driver.speculative.policy import MIN_GAIN, SpeculationPolicy
from skippy.driver.speculative.window import PRIOR_WEIGHT, CostModelWindow, WindowStats

FLAT = [0.0] + [10.0] * 40  # a decode costs 10 ms whatever its rows (memory-bound)
STEEP = [0.0] + [10.0 * r for r in range(1, 41)]  # every row costs the same again (compute-bound)


def stats_after(windows: list[tuple[int, int]]) -> WindowStats:
    stats = WindowStats()
    for proposed, accepted in windows:
        stats.observe(proposed, accepted)
    return stats


def policy(cost: list[float] | None, hop_ms: float = 0.0, hops: int = 2, max_depth: int = 2) -> SpeculationPolicy:
    window = CostModelWindow(cost, hop_ms, hops, 8) if cost is not None else None
    return SpeculationPolicy(8, max_depth=max_depth, cost=window)


def test_position_alpha_is_conditional_and_shrunk_towards_alpha() -> None:
    stats = stats_after([(4, 1)] * 6)  # draft 0 always accepted, draft 1 always rejected, 2.. never tested
    alphas = stats.position_alpha(4)
    assert alphas[0] > 0.75 and alphas[1] < 0.25
    assert alphas[2] == alphas[3] == pytest.approx(stats.alpha)  # no evidence: the overall estimate
    fresh = WindowStats()
    assert fresh.position_alpha(2) == [pytest.approx(fresh.alpha)] * 2
    assert PRIOR_WEIGHT > 0


def test_expected_tokens_stop_at_the_first_position_that_is_always_rejected() -> None:
    stats = stats_after([(4, 1)] * 8)
    p = policy(FLAT)
    assert p.expected_tokens(stats, 1) == pytest.approx(1 + stats.position_alpha(1)[0])
    assert p.expected_tokens(stats, 8) - p.expected_tokens(stats, 1) < 0.5  # behind a rejected position: little


def test_cheap_rows_and_good_drafts_speculate_bad_drafts_decode_plainly() -> None:
    good, bad = stats_after([(8, 8)] * 6), stats_after([(4, 0)] * 6)
    assert policy(FLAT).choose(good, 1) == 8
    assert policy(FLAT).choose(bad, 1) == 0  # expected gain below MIN_GAIN
    assert policy(None).choose(bad, 1) == 0 and policy(None).choose(good, 1) == 8  # before calibration


def test_compute_bound_rows_stop_speculation_unless_the_wire_dominates() -> None:
    middling = stats_after([(4, 2)] * 6)
    assert policy(STEEP).choose(middling, 1) == 0  # each extra row costs as much as the token it may win
    assert policy(STEEP, hop_ms=200.0).choose(middling, 1) > 0  # a 20x slower wire hides the rows
    assert policy(STEEP, hop_ms=200.0).choose(middling, 2) == 0  # 2 sessions on 2 stages: the wire is hidden


def test_more_sessions_in_the_batch_never_raise_k() -> None:
    stats = stats_after([(4, 3)] * 6)
    sawtooth = [0.0] + [10.0 + 2.0 * r for r in range(1, 200)]
    ks = [policy(sawtooth).choose(stats, n) for n in (1, 2, 4, 8, 16)]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1]


def test_the_gain_threshold_is_above_one() -> None:
    assert MIN_GAIN >= 1.0


def test_depth_two_while_chains_pay_one_once_they_come_back_stale() -> None:
    good = stats_after([(4, 4)] * 6)
    p = policy([0.0] + [10.0 + r for r in range(1, 41)], hop_ms=5.0)  # a chained window's rows cost 1 ms each
    assert p.depth(good, 4, 1, chained_rows=0, stale_rows=0) == 2
    assert p.depth(good, 4, 1, chained_rows=100, stale_rows=95) == 1  # measured: chains mostly stale
    assert p.depth(stats_after([(4, 0)] * 6), 4, 1, 0, 0) == 1  # the prior: a full accept is rare
    assert policy(FLAT, hop_ms=20.0, max_depth=1).depth(good, 4, 1, 0, 0) == 1  # the plan's ceiling
    assert policy(FLAT, hops=0).depth(good, 4, 1, 0, 0) == 1  # one stage: nothing to overlap
    assert p.depth(good, 0, 1, 0, 0) == 1
    assert p.depth(good, 4, 2, chained_rows=0, stale_rows=0) == 1  # 2 sessions keep 2 stages busy already


def test_no_speculation_beyond_the_rows_calibration_measured() -> None:
    good = stats_after([(8, 8)] * 6)
    p = policy([0.0] + [10.0] * 9)  # measured up to 9 rows (max_k + 1), as startup calibration does
    assert p.choose(good, 1) == 8 and p.choose(good, 2) == 3  # 2 x 4 rows <= 9
    assert p.choose(good, 8) == 0  # 8 x 2 rows: beyond the table, not priced on a guess
