"""Sessions: trimming (explicit, and implied by a window's pos_start), release and lane reuse, lane limits."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import SWA, decode_logits, prompt_tokens, tiny_spec, window

from skippy.runtime.chain import LocalChain
from skippy.runtime.errors import RuntimeUsageError

PROMPT = prompt_tokens(20, seed=30)
FIRST = prompt_tokens(20, seed=31)  # decoded one by one after the prompt: positions 20..39
SECOND = prompt_tokens(12, seed=32)  # decoded one by one after the trim point


def lengths(chain: LocalChain, session_id: int) -> list[int]:
    return [stage.session_length(session_id) for stage in chain.stages]


def singles(chain: LocalChain, session_id: int, pos: int, tokens: Sequence[int]) -> list[np.ndarray]:
    return [decode_logits(chain, [window(session_id, pos + i, [t])])[0] for i, t in enumerate(tokens)]


@pytest.fixture(params=["gemma3", "llama"])
def split_chain(request: pytest.FixtureRequest, tiny_model: Callable[..., Path],
                open_chain: Callable[..., LocalChain]) -> LocalChain:
    return open_chain(tiny_spec(tiny_model(request.param)), [2, 4])


@pytest.mark.parametrize("how", ["trim_session", "window_pos_start"])
@pytest.mark.parametrize("trim_to", [25, SWA + 3])
def test_trim_then_redecode_equals_fresh_session(split_chain: LocalChain, how: str, trim_to: int) -> None:
    """Decode to 40, go back to `trim_to`, decode on: the same as a session that never went past it."""
    chain = split_chain
    try:
        decode_logits(chain, [window(0, 0, PROMPT, "last")])
        singles(chain, 0, 20, FIRST)
        assert lengths(chain, 0) == [40, 40, 40]
        if how == "trim_session":
            for stage in chain.stages:
                stage.trim_session(0, trim_to)
            assert lengths(chain, 0) == [trim_to] * 3
        trimmed = singles(chain, 0, trim_to, SECOND)  # with "window_pos_start" the first window trims
        assert lengths(chain, 0) == [trim_to + len(SECOND)] * 3

        # a fresh session, same batch shapes, while session 0 is still alive
        decode_logits(chain, [window(1, 0, PROMPT, "last")])
        singles(chain, 1, 20, FIRST[: trim_to - 20])
        fresh = singles(chain, 1, trim_to, SECOND)
    finally:
        chain.release(0)
        chain.release(1)
    for i, (a, b) in enumerate(zip(trimmed, fresh)):
        assert np.array_equal(a, b), f"position {trim_to + i}: max |diff| {np.abs(a - b).max()}"
    # the trimmed positions really were overwritten: different tokens give different logits
    assert not np.array_equal(trimmed[0], singles_after_first(split_chain, trim_to))


def singles_after_first(chain: LocalChain, trim_to: int) -> np.ndarray:
    """Logits at trim_to when FIRST (not SECOND) continues the session there."""
    try:
        decode_logits(chain, [window(2, 0, PROMPT, "last")])
        return singles(chain, 2, 20, FIRST[: trim_to - 20 + 1])[-1]
    finally:
        chain.release(2)


def test_multi_token_window_inside_kv_trims(split_chain: LocalChain) -> None:
    chain = split_chain
    try:
        decode_logits(chain, [window(0, 0, PROMPT + FIRST, "last")])
        assert lengths(chain, 0) == [40] * 3
        rewritten = decode_logits(chain, [window(0, 30, SECOND[:4])])[0]
        assert lengths(chain, 0) == [34] * 3
        decode_logits(chain, [window(1, 0, PROMPT + FIRST[:10], "last")])
        fresh = decode_logits(chain, [window(1, 30, SECOND[:4])])[0]
    finally:
        chain.release(0)
        chain.release(1)
    assert np.array_equal(rewritten, fresh)


def test_trim_past_the_end_or_of_an_unknown_session_is_a_no_op(unsplit_chain: Callable[[str], LocalChain]) -> None:
    chain = unsplit_chain("llama")
    stage = chain.final
    try:
        decode_logits(chain, [window(0, 0, PROMPT, "last")])
        stage.trim_session(0, 50)
        assert stage.session_length(0) == 20
        stage.trim_session(99, 0)
        assert stage.session_length(99) == 0 and 99 not in stage.active_sessions
        stage.trim_session(0, 0)
        assert stage.session_length(0) == 0 and stage.active_sessions == [0]  # emptied, still holds its lane
    finally:
        chain.release(0)


def test_a_window_may_not_leave_a_gap(unsplit_chain: Callable[[str], LocalChain]) -> None:
    chain = unsplit_chain("llama")
    try:
        decode_logits(chain, [window(0, 0, PROMPT, "last")])
        with pytest.raises(RuntimeUsageError, match=r"session 0: window starts at 21 but only 20 positions"):
            chain.decode([window(0, 21, [5])])
    finally:
        chain.release(0)


def test_released_lanes_are_reusable(split_chain: LocalChain) -> None:
    chain = split_chain
    lane_count = chain.final.spec.lane_count
    assert lane_count == 4
    alone = decode_logits(chain, [window(50, 0, PROMPT)])[0]
    chain.release(50)
    assert lengths(chain, 50) == [0, 0, 0] and all(s.active_sessions == [] for s in chain.stages)

    for round_ in range(3):  # fill every lane, release everything, again
        ids = [100 * (round_ + 1) + i for i in range(lane_count)]
        try:
            out = decode_logits(chain, [window(s, 0, PROMPT[: 10 + i], "last") for i, s in enumerate(ids)])
            assert [len(o) for o in out] == [1] * lane_count
            assert all(sorted(s.active_sessions) == ids for s in chain.stages)
            assert lengths(chain, ids[-1]) == [10 + lane_count - 1] * 3
        finally:
            for sid in ids:
                chain.release(sid)
        for sid in ids:
            assert lengths(chain, sid) == [0, 0, 0]
    # a released session's KV is gone: continuing it is a gap, not a resume
    with pytest.raises(RuntimeUsageError, match="only 0 positions are in KV"):
        chain.decode([window(ids[0], 10, [5])])
    assert all(s.active_sessions == [] for s in chain.stages)
    # a reused lane carries nothing over: same logits as the very first session
    again = decode_logits(chain, [window(51, 0, PROMPT)])[0]
    chain.release(51)
    assert np.array_equal(again, alone)


def test_release_frees_one_lane_for_a_new_session(split_chain: LocalChain) -> None:
    chain = split_chain
    ids = [0, 1, 2, 3]
    try:
        decode_logits(chain, [window(s, 0, PROMPT[:5], "last") for s in ids])
        with pytest.raises(RuntimeUsageError, match="lane_count"):
            chain.decode([window(4, 0, PROMPT[:5], "last")])
        chain.release(2)
        ids = [0, 1, 3, 4]
        decode_logits(chain, [window(4, 0, PROMPT[:5], "last")])
        assert all(sorted(s.active_sessions) == ids for s in chain.stages)
        assert lengths(chain, 2) == [0, 0, 0] and lengths(chain, 4) == [5, 5, 5]
    finally:
        for sid in range(5):
            chain.release(sid)


def test_more_sessions_than_lanes_in_one_batch_is_refused(unsplit_chain: Callable[[str], LocalChain]) -> None:
    chain = unsplit_chain("qwen3")
    n = chain.final.spec.lane_count
    try:
        with pytest.raises(RuntimeUsageError, match=rf"opens {n + 1} new sessions but only {n} of {n} lanes are free "
                           r"\(raise lane_count\)"):
            chain.decode([window(s, 0, PROMPT[:3], "last") for s in range(n + 1)])
    finally:
        for sid in range(n + 1):
            chain.release(sid)


def test_a_refused_batch_leaves_no_sessions_behind(unsplit_chain: Callable[[str], LocalChain]) -> None:
    chain = unsplit_chain("qwen3")
    n = chain.final.spec.lane_count
    try:
        with pytest.raises(RuntimeUsageError, match="lane_count"):
            chain.decode([window(s, 0, PROMPT[:3], "last") for s in range(n + 1)])
        assert chain.final.active_sessions == []
    finally:
        for sid in range(n + 1):
            chain.release(sid)


# -- llama.cpp buffer sizing: these once aborted the process (GGML_ASSERT in output_reserve), so they
# -- are built in a subprocess first.


@pytest.mark.parametrize(("lanes", "layer_end", "n_outputs_max"), [(4, 1, 0), (8, 3, 0), (4, 6, 1), (8, 6, 2)])
def test_stage_builds_for_any_lane_count(lanes: int, layer_end: int, n_outputs_max: int,
                                         non_final_probe: Callable[..., None]) -> None:
    """Non-final stages and final stages asking for fewer output rows than lanes."""
    non_final_probe(lanes, layer_end, n_outputs_max)


def test_n_outputs_max_is_at_least_one_row_per_lane(tiny_model: Callable[..., Path], non_final_probe: Callable[..., None],
                                                    open_chain: Callable[..., LocalChain]) -> None:
    non_final_probe(4, 6, 1)
    chain = open_chain(tiny_spec(tiny_model("llama"), n_outputs_max=1))
    assert chain.final.params.n_outputs_max == 4
    try:
        out = decode_logits(chain, [window(s, 0, PROMPT[:3], "last") for s in range(4)])
        assert [o.shape[0] for o in out] == [1, 1, 1, 1]
        with pytest.raises(RuntimeUsageError, match=r"batch asks for 5 output rows, more than n_outputs_max 4"):
            chain.decode([window(0, 3, [5, 6], "all"), window(1, 3, [5, 6, 7], "all")])
    finally:
        for sid in range(4):
            chain.release(sid)
