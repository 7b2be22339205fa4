"""Prefill chunk sizes at stage 0 (skippy.driver.prefill.ChunkPlanner): fixed, schedule, adaptive-ramp.

adaptive-ramp rules, with c = stage-0 compute ms of the chunk just observed:
grow by step when wait <= 0.75c and write <= 0.25c; shrink by step when wait > 1.25c or write > 0.75c;
otherwise unchanged; always clamped to [start, max] and to the ceiling target_ms / slowest ms-per-token
stepped down to start + k*step. Every threshold is checked exactly on and just past its boundary
(c = 100 makes 0.25c, 0.75c and 1.25c exact in binary floating point).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from skippy.config import PrefillChunkOptions, PrefillChunkPolicy, parse_serving_args
from skippy.driver.prefill import ChunkObservation, ChunkPlanner, unpipelined
from skippy.launcher import write_local_topology

C = 100.0  # compute ms of every observed chunk below
HIDDEN = ChunkObservation(compute_ms=C, write_ms=0.0, wait_ms=0.0)  # transfer fully hidden: grow
EXPOSED = ChunkObservation(compute_ms=C, write_ms=0.0, wait_ms=10 * C)  # transfer exposed: shrink
MIDDLE = ChunkObservation(compute_ms=C, write_ms=0.5 * C, wait_ms=C)  # neither: unchanged


def ramp(start: int = 128, step: int = 128, maximum: int = 512, target_ms: float = 100.0) -> ChunkPlanner:
    return ChunkPlanner(PrefillChunkOptions(policy=PrefillChunkPolicy.ADAPTIVE_RAMP, adaptive_start=start,
                                            adaptive_step=step, adaptive_max=maximum, adaptive_target_ms=target_ms))


def sizes_after(planner: ChunkPlanner, observations: list[ChunkObservation]) -> list[int]:
    """The size before the first observation, then after each one."""
    out = [planner.size()]
    for obs in observations:
        planner.observe(obs)
        out.append(planner.size())
    return out


# --- fixed ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 64, 256, 1000])
def test_fixed_is_always_chunk_size_whatever_is_observed(chunk_size: int) -> None:
    planner = ChunkPlanner(PrefillChunkOptions(policy=PrefillChunkPolicy.FIXED, chunk_size=chunk_size,
                                               adaptive_start=8, adaptive_step=8, adaptive_max=16))
    observations = [HIDDEN, EXPOSED, MIDDLE, HIDDEN, ChunkObservation(C, 0.0, 0.0, slowest_ms_per_token=50.0)]
    assert sizes_after(planner, observations) == [chunk_size] * (len(observations) + 1)


# --- schedule ------------------------------------------------------------------------------------------------


def test_schedule_chunk_i_takes_entry_i_and_the_last_repeats() -> None:
    planner = ChunkPlanner(PrefillChunkOptions(policy=PrefillChunkPolicy.SCHEDULE, schedule=(128, 256, 384)))
    assert sizes_after(planner, [HIDDEN, EXPOSED, MIDDLE, HIDDEN, HIDDEN]) == [128, 256, 384, 384, 384, 384]


def test_schedule_advances_only_when_a_chunk_is_observed() -> None:
    planner = ChunkPlanner(PrefillChunkOptions(policy=PrefillChunkPolicy.SCHEDULE, schedule=(128, 256, 384)))
    assert [planner.size() for _ in range(3)] == [128, 128, 128]
    planner.observe(EXPOSED)  # observations never change the entries, only which one is next
    assert planner.size() == 256


def test_schedule_of_one_entry_repeats_it() -> None:
    planner = ChunkPlanner(PrefillChunkOptions(policy=PrefillChunkPolicy.SCHEDULE, schedule=(96,)))
    assert sizes_after(planner, [HIDDEN, EXPOSED, MIDDLE]) == [96, 96, 96, 96]


@pytest.mark.parametrize("front", [[], ["--openai-bind-addr", "127.0.0.1:0"]], ids=["no-front", "front"])
def test_schedule_and_ramp_flags_resolve_to_the_planner_options(tmp_path: Path, front: list[str]) -> None:
    """The flags as a user writes them (`128,256,384`) reach the planner as the documented policy,
    with or without the in-process OpenAI front (`skippy up` gives them to stage 0 without it)."""
    topology, configs = write_local_topology(tmp_path, "/unused/model.gguf", 6, [3], lane_count=2)
    base = ["--config", str(configs[0]), "--topology", str(topology), *front]

    options = parse_serving_args([*base, "--openai-prefill-chunk-policy", "schedule",
                                  "--openai-prefill-chunk-schedule", "128,256,384"])
    assert options.prefill.policy == PrefillChunkPolicy.SCHEDULE
    assert sizes_after(ChunkPlanner(options.prefill), [HIDDEN] * 4) == [128, 256, 384, 384, 384]

    options = parse_serving_args([*base, "--openai-prefill-chunk-policy", "adaptive-ramp",
                                  "--openai-prefill-adaptive-start", "64", "--openai-prefill-adaptive-step", "32",
                                  "--openai-prefill-adaptive-max", "128", "--openai-prefill-adaptive-target-ms", "50"])
    prefill = options.prefill
    assert (prefill.policy, prefill.adaptive_start, prefill.adaptive_step, prefill.adaptive_max,
            prefill.adaptive_target_ms) == (PrefillChunkPolicy.ADAPTIVE_RAMP, 64, 32, 128, 50.0)
    assert sizes_after(ChunkPlanner(prefill), [HIDDEN] * 4) == [64, 96, 128, 128, 128]


# --- adaptive-ramp: grow / shrink / unchanged ------------------------------------------------------------------


def test_ramp_starts_at_start() -> None:
    assert ramp(start=128).size() == 128
    assert ramp(start=48, step=16, maximum=64).size() == 48


def test_ramp_grows_by_step_while_hidden_up_to_max() -> None:
    assert sizes_after(ramp(start=128, step=128, maximum=512), [HIDDEN] * 5) == [128, 256, 384, 512, 512, 512]


def test_ramp_growth_stops_at_max_even_off_the_step_grid() -> None:
    assert sizes_after(ramp(start=100, step=64, maximum=200), [HIDDEN] * 3) == [100, 164, 200, 200]


def test_ramp_shrinks_by_step_while_exposed_down_to_start() -> None:
    planner = ramp(start=128, step=128, maximum=512)
    sizes_after(planner, [HIDDEN] * 3)
    assert planner.size() == 512
    assert sizes_after(planner, [EXPOSED] * 5) == [512, 384, 256, 128, 128, 128]


def test_ramp_stays_between_the_thresholds() -> None:
    planner = ramp()
    planner.observe(HIDDEN)
    assert sizes_after(planner, [MIDDLE] * 3) == [256, 256, 256, 256]


@pytest.mark.parametrize(
    ("wait_ms", "write_ms", "change"),
    [
        # grow: wait <= 0.75c and write <= 0.25c
        (0.0, 0.0, +1),
        (75.0, 0.0, +1),  # wait exactly 0.75c
        (0.0, 25.0, +1),  # write exactly 0.25c
        (75.0, 25.0, +1),  # both exactly on the grow boundary
        # unchanged: neither rule
        (75.5, 0.0, 0),  # wait just past 0.75c
        (0.0, 25.5, 0),  # write just past 0.25c
        (75.5, 25.5, 0),
        (125.0, 0.0, 0),  # wait exactly 1.25c is not yet exposed
        (0.0, 75.0, 0),  # write exactly 0.75c is not yet exposed
        (125.0, 75.0, 0),  # both exactly on the shrink boundary
        (100.0, 50.0, 0),
        # shrink: wait > 1.25c or write > 0.75c
        (125.5, 0.0, -1),  # wait just past 1.25c
        (0.0, 75.5, -1),  # write just past 0.75c, although wait is small
        (125.5, 75.5, -1),
        (1000.0, 1000.0, -1),
        (75.0, 76.0, -1),  # wait on the grow side does not save an exposed write
    ],
)
def test_ramp_rule_boundaries(wait_ms: float, write_ms: float, change: int) -> None:
    planner = ramp(start=128, step=128, maximum=512)
    planner.observe(HIDDEN)
    assert planner.size() == 256  # room to move either way
    planner.observe(ChunkObservation(compute_ms=C, write_ms=write_ms, wait_ms=wait_ms))
    assert planner.size() == 256 + change * 128


@pytest.mark.parametrize("compute_ms", [10.0, 40.0, 1000.0])
def test_ramp_thresholds_scale_with_compute(compute_ms: float) -> None:
    def after(wait_ms: float, write_ms: float) -> int:
        planner = ramp(start=64, step=64, maximum=256)
        planner.observe(HIDDEN)  # 128
        planner.observe(ChunkObservation(compute_ms=compute_ms, write_ms=write_ms, wait_ms=wait_ms))
        return planner.size()

    assert after(0.5 * compute_ms, 0.2 * compute_ms) == 192
    assert after(compute_ms, 0.5 * compute_ms) == 128
    assert after(1.5 * compute_ms, 0.0) == 64
    assert after(0.0, 0.8 * compute_ms) == 64


def test_ramp_can_go_up_and_down_repeatedly() -> None:
    observations = [HIDDEN, HIDDEN, EXPOSED, MIDDLE, HIDDEN, HIDDEN, HIDDEN, EXPOSED, EXPOSED, EXPOSED, EXPOSED]
    assert sizes_after(ramp(start=128, step=128, maximum=512), observations) == [
        128, 256, 384, 256, 256, 384, 512, 512, 384, 256, 128, 128]


# --- adaptive-ramp: ceiling from the slowest stage -------------------------------------------------------------


@pytest.mark.parametrize(
    ("ms_per_token", "ceiling"),
    [
        (0.25, 384),  # 100 / 0.25 = 400 tokens -> stepped down to 128 + 2*128
        (100 / 512, 512),  # exactly on the grid: 512 = 128 + 3*128
        (100 / 511, 384),  # one token short of the grid point steps down
        (100 / 383, 256),
        (100 / 384, 384),
        (100 / 256, 256),
        (100 / 255, 128),
        (1.0, 128),  # predicts 100 tokens, below start: the ceiling never goes below start
        (50.0, 128),  # predicts 2 tokens
        (0.01, 640),  # predicts 10000 tokens: max still applies
    ],
)
def test_ramp_ceiling_from_slowest_ms_per_token(ms_per_token: float, ceiling: int) -> None:
    planner = ramp(start=128, step=128, maximum=640, target_ms=100.0)
    fast = ChunkObservation(compute_ms=C, write_ms=0.0, wait_ms=0.0, slowest_ms_per_token=ms_per_token)
    sizes = sizes_after(planner, [fast] * 8)
    assert max(sizes) == ceiling
    assert sizes[-1] == ceiling  # grows up to the ceiling and stays there
    assert all(s == 128 or (s - 128) % 128 == 0 or s == 640 for s in sizes)


def test_ramp_ceiling_uses_the_target() -> None:
    planner = ramp(start=100, step=50, maximum=1000, target_ms=30.0)
    # 30 ms / 0.1 ms per token = 300 tokens = 100 + 4*50
    fast = ChunkObservation(compute_ms=C, write_ms=0.0, wait_ms=0.0, slowest_ms_per_token=0.1)
    assert sizes_after(planner, [fast] * 6) == [100, 150, 200, 250, 300, 300, 300]


def test_ramp_ceiling_lowers_a_size_already_above_it() -> None:
    planner = ramp(start=128, step=128, maximum=640, target_ms=100.0)
    sizes_after(planner, [HIDDEN] * 4)
    assert planner.size() == 640
    # the slowest stage now needs 0.3125 ms/token: 320 tokens -> ceiling 128 + 128 = 256, even on a "grow" step
    slow = ChunkObservation(compute_ms=C, write_ms=0.0, wait_ms=0.0, slowest_ms_per_token=0.3125)
    planner.observe(slow)
    assert planner.size() == 256
    # ... and an "unchanged" step keeps it at the ceiling
    planner.observe(ChunkObservation(compute_ms=C, write_ms=0.5 * C, wait_ms=C, slowest_ms_per_token=0.3125))
    assert planner.size() == 256


def test_ramp_ceiling_persists_until_a_new_timing_arrives() -> None:
    planner = ramp(start=128, step=128, maximum=640, target_ms=100.0)
    planner.observe(ChunkObservation(compute_ms=C, write_ms=0.0, wait_ms=0.0, slowest_ms_per_token=0.3125))  # ceiling 256
    # observations without a timing (None or 0) keep the last ceiling
    assert sizes_after(planner, [HIDDEN, ChunkObservation(C, 0.0, 0.0, slowest_ms_per_token=0.0), HIDDEN]) == [
        256, 256, 256, 256]
    # a faster slowest stage raises the ceiling; growth resumes one step at a time from where it was
    fast = ChunkObservation(compute_ms=C, write_ms=0.0, wait_ms=0.0, slowest_ms_per_token=0.01)
    assert sizes_after(planner, [fast] * 4) == [256, 384, 512, 640, 640]


def test_ramp_without_timings_has_no_ceiling_but_max() -> None:
    planner = ramp(start=128, step=128, maximum=1024, target_ms=1.0)  # a tiny target matters only with timings
    assert sizes_after(planner, [HIDDEN] * 8)[-1] == 1024


def test_ramp_shrink_below_a_ceiling_still_stops_at_start() -> None:
    planner = ramp(start=128, step=128, maximum=640, target_ms=100.0)
    slow_exposed = ChunkObservation(compute_ms=C, write_ms=0.0, wait_ms=10 * C, slowest_ms_per_token=10.0)
    assert sizes_after(planner, [slow_exposed] * 3) == [128, 128, 128, 128]


def test_without_overlap_a_prompt_prefills_in_the_ramps_largest_chunks() -> None:
    """One micro-batch in flight (stages sharing cores, or one stage): chunks cannot overlap, so the ramp starts at
    its maximum; a policy or a ramp the user chose with a flag stays as given."""
    default = PrefillChunkOptions()
    planner = ChunkPlanner(unpipelined(default))
    assert planner.size() == default.adaptive_max
    planner.observe(EXPOSED)  # an exposed transfer does not shrink it below its start
    assert planner.size() == default.adaptive_max
    chosen = PrefillChunkOptions(adaptive_start=128, given=("--openai-prefill-adaptive-start",))
    assert unpipelined(chosen) == chosen
    fixed = PrefillChunkOptions(policy=PrefillChunkPolicy.FIXED, chunk_size=64)
    assert unpipelined(fixed) == fixed
