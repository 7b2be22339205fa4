"""The default speculation policy (skippy.driver.speculative.policy): k from per-position acceptance, the load
and the calibrated C(rows), 0 when the expected gain is below MIN_GAIN; the pipeline depth from the share of
stale rows; the per-position acceptance estimate it reads (WindowStats.position_alpha)."""

from __future__ import annotations

import pytest

from skippy.config.speculative import NgramConfig, NgramKind
from skippy.driver.speculative.engine import Speculation
from skippy.driver.speculative.policy import MIN_GAIN, SHARED_MAX_K, SHARED_MIN_GAIN, SpeculationPolicy
from skippy.driver.speculative.suffix import SuffixProposerFactory
from skippy.driver.speculative.window import PRIOR_WEIGHT, CostModelWindow, WindowStats

FLAT = [0.0] + [10.0] * 40  # a decode costs 10 ms whatever its rows (memory-bound)
STEEP = [0.0] + [10.0 * r for r in range(1, 41)]  # every row costs the same again (compute-bound)


def stats_after(windows: list[tuple[int, int]]) -> WindowStats:
    stats = WindowStats()
    for proposed, accepted in windows:
        stats.observe(proposed, accepted)
    return stats


def policy(cost: list[float] | None, hop_ms: float = 0.0, hops: int = 2, max_depth: int = 2,
           micro_batches: int = 2) -> SpeculationPolicy:
    """Defaults: 2 stages on 2 hosts, a micro-batch in flight on each."""
    window = CostModelWindow(cost, hop_ms, hops, 8) if cost is not None else None
    return SpeculationPolicy(8, max_depth=max_depth, cost=window, micro_batches=micro_batches)


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
    p = policy([0.0] + [10.0] * 9)  # measured up to 9 rows (max_k + 1)
    assert p.choose(good, 2) == 8  # one session to a micro-batch: 9 rows
    assert p.allocate([good, good], 4) == [4, 3]  # two: 2 + 7 rows
    assert p.choose(good, 32) == 0  # 16 sessions to a micro-batch: beyond the table, not priced on a guess


def test_stages_sharing_cores_pay_the_wire_at_any_load() -> None:
    good = stats_after([(4, 4)] * 6)
    compute_bound = [0.0] + [10.0 * r for r in range(1, 41)]
    slow_wire = {"hop_ms": 100.0, "micro_batches": 1}  # one micro-batch in flight: nothing hides the wire
    assert policy(compute_bound, **slow_wire).choose(good, 8) > 0
    assert policy(compute_bound, hop_ms=100.0).choose(good, 8) == 0  # 2 micro-batches: the wire is hidden
    assert policy(compute_bound, **slow_wire).depth(good, 2, 8, 0, 0) == 2  # nothing overlaps the wire either


def test_sessions_are_priced_per_micro_batch() -> None:
    good = stats_after([(8, 8)] * 6)
    table = [0.0] + [10.0] * 9  # 9 rows measured
    assert sum(policy(table, micro_batches=1).allocate([good] * 4, 4)) == 5  # 4 sessions in one batch: 4 + 5 rows
    assert sum(policy(table, micro_batches=2).allocate([good] * 2, 4)) == 7  # 2 to each micro-batch: 2 + 7 rows


def test_a_batch_gives_its_draft_rows_to_the_sessions_whose_drafts_are_accepted() -> None:
    good, bad = stats_after([(8, 8)] * 6), stats_after([(4, 0)] * 6)
    memory_bound = [0.0] + [10.0 + r for r in range(1, 33)]  # measured to 32 rows, as startup calibration does
    p = policy(memory_bound, micro_batches=1)
    assert p.allocate([good] + [bad] * 7, 8) == [8, 0, 0, 0, 0, 0, 0, 0]  # 16 rows: (8 + ~8) / 26 ms vs 8 / 18 ms
    assert p.choose(good, 8) == 3  # alike, the 8 sessions share the 24 rows the table allows past theirs
    assert p.allocate([bad] * 8, 8) == [0] * 8
    assert p.allocate([good, good], 2, caps=[2, 0]) == [2, 0]  # no drafts past what a request can still commit
    steps = [0.0] + [10.0 * -(-r // 4) for r in range(1, 33)]  # rows cost in steps of 4 (repacked gemm on CPU)
    ks = policy(steps, micro_batches=1).allocate([good] * 3, 3)
    assert (3 + sum(ks)) % 4 == 0 and sum(ks) > 0  # the rows fill the step they pay for


def test_a_session_alone_drafts_up_to_max_k_one_among_several_up_to_the_shared_cap() -> None:
    good = stats_after([(16, 16)] * 8)
    table = [0.0] + [10.0 + r for r in range(1, 33)]  # memory-bound: long windows pay
    wide = SpeculationPolicy(16, cost=CostModelWindow(table, 0.0, 2, 16), micro_batches=1)
    assert wide.allocate([good], 1) == [16]
    assert max(wide.allocate([good, good], 2)) == SHARED_MAX_K < 16
    uncalibrated = SpeculationPolicy(16, micro_batches=1)  # before C(rows) is measured, the same caps
    assert uncalibrated.choose(good, 1) == 16 and uncalibrated.choose(good, 2) == SHARED_MAX_K


def test_the_engine_sizes_a_batch_together_within_what_each_request_can_commit() -> None:
    ngram = NgramConfig(kind=NgramKind.SUFFIX, min_ngram=2, max_ngram=8, max_proposal_tokens=8)
    speculation = Speculation(SuffixProposerFactory(ngram), SpeculationPolicy(8, max_depth=1), 8, calibrate=True)
    speculation.use_cost_model([0.0] + [10.0 + r for r in range(1, 33)], 2, 0.0, micro_batches=2)
    assert isinstance(speculation.policy, SpeculationPolicy) and speculation.policy.micro_batches == 2
    loop = [1, 2, 3, 4, 5, 6, 7] * 6  # a history the suffix proposer continues
    for sid in (1, 2):
        speculation.start(sid, loop)
        speculation.sessions[sid].stats = stats_after([(8, 8)] * 6)
    drafts = speculation.draft_all([1, 2], 512, 2, room={1: 3, 2: 0})
    assert drafts[2] == ([], 0)  # its request has no token left to draft for
    proposal, k = drafts[1]
    assert k == 3 and proposal[:3] == [1, 2, 3]
    cost = speculation.policy.cost
    assert cost is not None
    for _ in range(10):
        speculation.observe_batch(2, 12.0)  # plain batches of the two sessions, at calibration's price
    speculation.observe_batch(8, 500.0)  # a served batch: its row count's price, and a floor for larger ones
    assert cost.cost(8) == 500.0 and cost.cost(9) >= 500.0 and cost.cost(2) < 15.0
    assert speculation.draft_all([1, 2], 512, 2, room={1: 3, 2: 0})[1][1] == 0  # rows now dear: plain decoding


def test_a_gain_within_the_cost_models_own_error_is_not_taken() -> None:
    """One session whose windows promise ~11% (a 2-row window for 1.8 single rows, every longer one compute-bound)
    drafts while prices hold; once served batches miss their prices by ~20% (a noisy host), that is no gain."""
    table = {1: 10.0, 2: 18.0, **{r: 10.0 * r for r in range(3, 33)}}
    p = SpeculationPolicy(8, max_depth=1, cost=CostModelWindow(table, 0.0, 2, 8), micro_batches=1)
    sure = stats_after([(8, 8)] * 20)
    assert p.allocate([sure], 1) == [1]  # the calibrated table alone: a marginal gain, taken
    assert p.cost is not None and p.cost.error == 0.0
    for i in range(40):
        p.cost.observe(2, 18.0 * (1.25 if i % 2 else 0.8))  # served 2-row batches, +-20% around the price
    assert 0.15 < p.cost.error < 0.3
    assert p.allocate([sure], 1) == [0]  # within the model's error: plain decoding


def test_several_sessions_draft_only_for_a_gain_that_pays_what_desynchronising_them_costs() -> None:
    """The b1 table of a 2-stage SmolLM2 (ms by rows, calibration): at 16 sessions with near-certain drafts it
    promises ~5% for 14-16 draft rows, below SHARED_MIN_GAIN (drafting unsynchronises sessions whose prompts
    then prefill one by one: not priced by C(rows)); a session alone, or a wire that makes windows pay far more,
    still drafts."""
    table = {1: 32.2, 2: 38.3, 3: 47.0, 4: 52.8, 5: 73.3, 6: 86.6, 7: 94.9, 8: 91.1, 9: 113.6, 16: 153.5, 24: 224.2,
             32: 288.8}
    sure = stats_after([(8, 8)] * 20)
    p = SpeculationPolicy(8, max_depth=1, cost=CostModelWindow(table, 0.0, 2, 8), micro_batches=1)
    assert p.allocate([sure] * 16, 16) == [0] * 16
    assert MIN_GAIN < SHARED_MIN_GAIN
    assert sum(p.allocate([sure], 1)) > 0  # one session's windows: 1.5x and more
    slow_wire = SpeculationPolicy(8, max_depth=1, cost=CostModelWindow(table, 100.0, 2, 8), micro_batches=1)
    assert sum(slow_wire.allocate([sure] * 4, 4)) > 0  # 200 ms of wire a step: a window saves whole round trips
    thin = stats_after([(4, 0)] * 3)  # before calibration every step costs 1: 8 drafts promise ~6% more tokens
    uncalibrated = SpeculationPolicy(8, micro_batches=1)
    assert uncalibrated.choose(thin, 1) == 8 and uncalibrated.choose(thin, 2) == 0  # the same rule


def test_drafts_are_priced_on_top_of_the_prompt_rows_riding_in_the_batch() -> None:
    """A prompt chunk in the same batch takes the cheap rows: drafts then pay compute-bound prices (or rows
    calibration never measured), where on decode rows alone they were nearly free."""
    good = stats_after([(8, 8)] * 6)
    knee = [0.0] + [10.0 if r <= 16 else 10.0 * (r - 15) for r in range(1, 41)]  # free to 16 rows, then 10 ms a row
    p = policy(knee, micro_batches=1)
    assert sum(p.allocate([good] * 4, 4)) == 12  # 4 decode rows: the drafts fill the free rows
    assert p.allocate([good] * 4, 4, riders=16) == [0] * 4  # 4 + 16 rows: every draft row costs a row's compute
    assert p.allocate([good] * 4, 4, riders=128) == [0] * 4  # past the measured rows: not priced on a guess
