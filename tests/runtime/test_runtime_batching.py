"""Continuous batching: many sessions per decode call, and multi-token windows (speculative verify shape).

llama.cpp is not batch-invariant, so exactness is split vs unsplit over the SAME batches; a session
decoded alone is only compared on tokens whose top-2 logit margin is clear.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import (
    allowed_split,
    batched_greedy,
    decode_logits,
    prompt_tokens,
    refused_as_the_rules_say,
    tiny_spec,
    top2_margin,
    window,
)

from skippy.runtime.chain import LocalChain
from skippy.testing.tiny_families import FAMILY_SPECS
from skippy.testing.tiny_models import FAMILIES

# Different lengths (one past the tiny gemma3's 32-token window); some ask for every position's logits.
PROMPTS = [prompt_tokens(n, seed=10 + n) for n in (7, 19, 40, 3)]
OUTPUTS = ["all", "all", "last", "all"]
STEPS = 16
CLEAR = 0.5
FAMILIES_WITH_EXPERTS = {f for f in FAMILIES if FAMILY_SPECS[f].n_expert}
FAMILIES_WITH_RECURRENCE = {f for f in FAMILIES if FAMILY_SPECS[f].attention_period}


@pytest.mark.parametrize("split_points", [[3], [1, 5], [2, 4], [4]], ids=lambda s: "split" + "-".join(map(str, s)))
@pytest.mark.parametrize("family", FAMILIES)
def test_four_sessions_batched_split_equals_unsplit(
    family: str, split_points: list[int], tiny_model: Callable[..., Path],
    unsplit_chain: Callable[[str], LocalChain], open_chain: Callable[..., LocalChain],
) -> None:
    if refused_as_the_rules_say(open_chain, tiny_model(family), split_points):
        return
    chain = open_chain(tiny_spec(tiny_model(family)), split_points)
    assert chain.final.spec.lane_count == 4
    ref_tokens, ref_logits = batched_greedy(unsplit_chain(family), PROMPTS, OUTPUTS, STEPS)
    tokens, logits = batched_greedy(chain, PROMPTS, OUTPUTS, STEPS)
    for i, (prompt, kind) in enumerate(zip(PROMPTS, OUTPUTS)):
        assert logits[i].shape == ((len(prompt) if kind == "all" else 1) + STEPS, chain.final.n_vocab)
        assert np.array_equal(logits[i], ref_logits[i]), f"session {i}: max |diff| {np.abs(logits[i] - ref_logits[i]).max()}"
    assert tokens == ref_tokens
    assert len({tuple(t) for t in tokens}) == 4  # four different continuations, not one copied
    assert all(s.active_sessions == [] for s in chain.stages)


# Not the MoE family: a router's pick flips with the batch, and a flipped expert moves even clear margins.
@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in FAMILIES_WITH_EXPERTS])
def test_batched_equals_alone_where_the_margin_is_clear(
    family: str, tiny_model: Callable[..., Path],
    unsplit_chain: Callable[[str], LocalChain], open_chain: Callable[..., LocalChain],
) -> None:
    """Split chain, 4 sessions batched vs the unsplit model decoding each session alone (same tokens fed)."""
    chain = open_chain(tiny_spec(tiny_model(family)), allowed_split(tiny_model(family), [2, 4], [4]))
    tokens, logits = batched_greedy(chain, PROMPTS, ["last"] * 4, STEPS)
    full = unsplit_chain(family)
    checked = 0
    for i, prompt in enumerate(PROMPTS):
        alone = [decode_logits(full, [window(7, 0, prompt, "last")])[0]]
        for step, token in enumerate(tokens[i]):
            alone.append(decode_logits(full, [window(7, len(prompt) + step, [token])])[0])
        full.release(7)
        alone_logits = np.concatenate(alone)
        clear = top2_margin(logits[i]) > CLEAR
        assert np.array_equal(alone_logits.argmax(1)[clear], logits[i].argmax(1)[clear]), f"session {i}"
        # not bitwise, but the same computation: the logits stay close everywhere
        assert np.abs(alone_logits - logits[i]).max() < CLEAR
        checked += int(clear.sum())
    assert checked >= 16, "too few clear-margin tokens for the comparison to mean anything"


@pytest.mark.parametrize("family", FAMILIES)
def test_multi_token_windows_split_equals_unsplit(
    family: str, tiny_model: Callable[..., Path],
    unsplit_chain: Callable[[str], LocalChain], open_chain: Callable[..., LocalChain],
) -> None:
    """Verify-shaped windows: k draft tokens on an existing session, logits at every offset, mixed with
    a 1-token window of another session; then a rejected draft is overwritten (pos_start inside KV)."""
    a, b = prompt_tokens(36, seed=20), prompt_tokens(9, seed=21)
    draft1, draft2, draft3 = prompt_tokens(5, seed=22), prompt_tokens(3, seed=23), prompt_tokens(4, seed=24)
    batches = [
        [window(0, 0, a, "last"), window(1, 0, b, "last")],
        [window(0, 36, draft1), window(1, 9, [5])],  # k=5 verify + a decode step
        [window(1, 10, draft3), window(0, 38, draft2)],  # 2 of 5 accepted: session 0 rewinds to 38
        [window(0, 41, draft1[:1])],  # one session alone, straight after
    ]
    lengths = [(36, 9), (41, 10), (41, 14), (42, 14)]

    def run(chain: LocalChain) -> list[list[np.ndarray]]:
        out = []
        try:
            for batch, (len0, len1) in zip(batches, lengths):
                out.append(decode_logits(chain, batch))
                for stage in chain.stages:
                    assert (stage.session_length(0), stage.session_length(1)) == (len0, len1)
        finally:
            chain.release(0)
            chain.release(1)
        return out

    expected = run(unsplit_chain(family))
    got = run(open_chain(tiny_spec(tiny_model(family)), allowed_split(tiny_model(family), [1, 3], [4])))
    for step, (e_batch, g_batch) in enumerate(zip(expected, got)):
        for e, g in zip(e_batch, g_batch):
            assert e.shape == g.shape
            if family in FAMILIES_WITH_RECURRENCE and len(batches[step]) > 1:
                # windows of different lengths run one by one on a hybrid's non-final stage (its ubatches
                # would regroup the rows): the same computation, other ubatches (llama.cpp's batch variance)
                assert np.abs(e - g).max() < 1e-3 and np.array_equal(e.argmax(1), g.argmax(1)), step
                continue
            assert np.array_equal(e, g), f"batch {step}: max |diff| {np.abs(e - g).max()}"
    assert expected[1][0].shape[0] == 5 and expected[2][1].shape[0] == 3


def test_output_rows_follow_window_order(unsplit_chain: Callable[[str], LocalChain]) -> None:
    """Rows are laid out window by window; only the asked-for offsets come back."""
    chain = unsplit_chain("llama")
    try:
        rows = chain.decode([window(0, 0, [5, 6, 7, 8], (1, 3)), window(1, 0, [9, 10, 11], ()),
                             window(2, 0, [12, 13], (0,))])
        assert rows == [[1, 3], [], [7]]
    finally:
        for sid in range(3):
            chain.release(sid)
