"""A sampler chain rebuilt on another process continues exactly: `SamplerChain.restore` (a replayed session).

No model: the chains sample synthetic logit rows through llama.cpp's own samplers (as `sample_with_grammar`
does). A chain that sampled n tokens and a fresh chain restored with those tokens and its draw count give
the same tokens from then on: seeded temperature draws, penalties' history, and a truncation that leaves a
single candidate (llama.cpp's dist sampler still draws once then: the count is per apply).
"""

from __future__ import annotations

import llama_cpp as L
import numpy as np
import pytest

from skippy.runtime.errors import RuntimeUsageError
from skippy.runtime.grammar_sampler import Candidates
from skippy.runtime.sampling import SamplerChain, SamplingParams

N_VOCAB = 64


def _sample(chain: SamplerChain, logits: np.ndarray) -> int:
    """What `SamplerChain.sample` does with a decode row: one chain apply, the token accepted, a draw counted."""
    candidates = Candidates(logits)
    candidates.apply(chain.ptr)
    token = candidates.selected()
    L.llama_sampler_accept(chain.ptr, token)
    chain.draws += chain.dist is not None
    return token


def _rows(n: int, seed: int, peaked: bool = False) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = [rng.normal(0, 2, N_VOCAB).astype(np.float32) for _ in range(n)]
    if peaked:  # every other row leaves one candidate past min_p
        for row in rows[::2]:
            row[int(rng.integers(N_VOCAB))] += 40.0
    return rows


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, seed=1234),
    SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=7, repeat_penalty=1.3, frequency_penalty=0.2),
    SamplingParams(temperature=1.0, min_p=0.5, seed=99),
    SamplingParams(temperature=0.0, repeat_penalty=1.3),
], ids=["temperature", "penalties-topk-topp", "min-p-single-candidate", "greedy-penalties"])
def test_restored_chain_continues_like_the_original(params: SamplingParams) -> None:
    rows = _rows(60, 5, peaked=params.min_p > 0)
    original = SamplerChain(params, N_VOCAB)
    history = [_sample(original, row) for row in rows[:30]]
    restored = SamplerChain(params, N_VOCAB)
    restored.restore(history, original.draws)
    fresh = SamplerChain(params, N_VOCAB)  # no restore: the control
    try:
        assert restored.draws == original.draws == (30 if params.temperature > 0 else 0)
        after = [(_sample(original, row), _sample(restored, row), _sample(fresh, row)) for row in rows[30:]]
        assert [a for a, _, _ in after] == [b for _, b, _ in after]
        if params.temperature > 0 or params.repeat_penalty != 1.0:
            assert [a for a, _, _ in after] != [c for _, _, c in after]  # the state did matter
    finally:
        for chain in (original, restored, fresh):
            chain.close()


def test_restore_refuses_a_bad_history_or_draws_without_a_seeded_draw() -> None:
    chain = SamplerChain(SamplingParams(), N_VOCAB)
    try:
        with pytest.raises(RuntimeUsageError, match="outside the vocabulary"):
            chain.restore([N_VOCAB], 0)
        with pytest.raises(RuntimeUsageError, match="greedy"):
            chain.restore([], 3)
    finally:
        chain.close()
