"""A split chain is the unsplit llama.cpp model, bitwise: prompt logits at every position and greedy decoding.

Split sets on the 6-layer tiny models: 1-layer first stage ([1]), even halves ([3]), 1-layer final
stage ([5]), a 3-way split with 1-layer ends ([1, 5]), a 3-way split at the gemma3 global layers
([2, 4]), a 1-layer stage holding only gemma3's global layer 2 ([2, 3]: its slice has no SWA layer),
one stage per layer, and a cut at 4 (the one SmolLM3 allows). A split a family's rules refuse
(skippy.runtime.families) must be refused at load, naming the rule. The 48-token prompt runs past the
tiny gemma3's 32-token sliding window.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import SWA, greedy_run, prompt_tokens, refused_as_the_rules_say, tiny_spec, top2_margin

from skippy.runtime.chain import LocalChain, layer_ranges
from skippy.testing.tiny_models import FAMILIES

SPLITS = [[1], [3], [5], [1, 5], [2, 4], [2, 3], [1, 2, 3, 4, 5], [4]]
PROMPT = prompt_tokens(48, seed=1)
STEPS = 32

_reference: dict[str, tuple[list[int], np.ndarray, list[int]]] = {}


def reference(family: str, unsplit_chain: Callable[[str], LocalChain]) -> tuple[list[int], np.ndarray, list[int]]:
    """Unsplit: stepwise greedy tokens + all logit rows, and `generate`'s greedy tokens (computed once)."""
    if family not in _reference:
        chain = unsplit_chain(family)
        tokens, logits = greedy_run(chain, PROMPT, STEPS)
        _reference[family] = (tokens, logits, list(chain.generate(PROMPT, STEPS)))
    return _reference[family]


def test_prompt_is_longer_than_the_sliding_window() -> None:
    assert len(PROMPT) > SWA and len(PROMPT) + STEPS <= 128


@pytest.mark.parametrize("split_points", SPLITS, ids=lambda s: "split" + "-".join(map(str, s)))
@pytest.mark.parametrize("family", FAMILIES)
def test_split_equals_unsplit_bitwise(
    family: str, split_points: list[int], tiny_model: Callable[..., Path],
    unsplit_chain: Callable[[str], LocalChain], open_chain: Callable[..., LocalChain],
) -> None:
    if refused_as_the_rules_say(open_chain, tiny_model(family), split_points):
        return
    ref_tokens, ref_logits, ref_generated = reference(family, unsplit_chain)
    assert len(set(ref_generated)) > 8, "degenerate continuation: the comparison would prove little"

    chain = open_chain(tiny_spec(tiny_model(family)), split_points)
    assert [(s.layer_start, s.layer_end) for s in chain.stages] == layer_ranges(6, split_points)
    assert [s.is_first for s in chain.stages] == [True] + [False] * len(split_points)
    assert [s.is_final for s in chain.stages] == [False] * len(split_points) + [True]

    tokens, logits = greedy_run(chain, PROMPT, STEPS)
    assert logits.shape == ref_logits.shape == (len(PROMPT) + STEPS, chain.final.n_vocab)
    bad = [i for i in range(len(logits)) if not np.array_equal(logits[i], ref_logits[i])]
    assert not bad, f"logits differ at positions {bad[:10]} (max |diff| {np.abs(logits - ref_logits).max()})"
    assert tokens == ref_tokens
    assert list(chain.generate(PROMPT, STEPS)) == ref_generated
    assert all(s.active_sessions == [] for s in chain.stages)  # generate released its session everywhere


def test_generate_matches_argmax_of_the_logits(unsplit_chain: Callable[[str], LocalChain]) -> None:
    """`generate`'s greedy tokens are the argmax of the logits, whatever the prefill chunking.

    Chunking changes the batches (llama.cpp is not batch-invariant), so a token may only differ
    where the top-2 margin is small.
    """
    tokens, logits, generated = reference("llama", unsplit_chain)
    assert generated == tokens
    chunked = list(unsplit_chain("llama").generate(PROMPT, STEPS, prefill_chunk=7))
    margins = top2_margin(logits[len(PROMPT) - 1 :])
    first_diff = next((k for k, (a, b) in enumerate(zip(chunked, tokens)) if a != b), None)
    assert first_diff is None or margins[first_diff] < 0.5, (first_diff, chunked, tokens)
