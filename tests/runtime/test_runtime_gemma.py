"""The real Gemma 3 270M split at layer 9 and at 5 and 13 equals the unsplit model bitwise.

Prompt logits at every position, a 32-token greedy continuation, and four sessions decoded in the
same batches as the unsplit model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import batched_greedy, decode_logits, window

from skippy.runtime.chain import LocalChain
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.gemma

TEXT = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village by the sea, there lived"
STEPS = 32


@pytest.fixture(scope="module")
def gemma_base(gemma_path: Path) -> RuntimeSpec:
    return RuntimeSpec(model_path=gemma_path, layer_start=0, layer_end=0, ctx_size=128, n_outputs_max=48)


@pytest.fixture(scope="module")
def gemma_full(gemma_base: RuntimeSpec) -> Iterator[LocalChain]:
    chain = LocalChain(gemma_base)
    yield chain
    chain.close()


@pytest.fixture(scope="module")
def gemma_prompt(gemma_full: LocalChain) -> list[int]:
    prompt = Tokenizer(gemma_full.stages[0].model).encode(TEXT)
    assert 20 < len(prompt) <= 48
    return prompt


@pytest.fixture(scope="module")
def gemma_reference(gemma_full: LocalChain, gemma_prompt: list[int]) -> tuple[np.ndarray, list[int]]:
    logits = decode_logits(gemma_full, [window(0, 0, gemma_prompt)])[0]
    gemma_full.release(0)
    return logits, list(gemma_full.generate(gemma_prompt, STEPS))


@pytest.fixture(scope="module", params=[[9], [5, 13]], ids=["split9", "split5-13"])
def gemma_split(
    request: pytest.FixtureRequest, gemma_base: RuntimeSpec, non_final_probe: Callable[..., None]
) -> Iterator[LocalChain]:
    non_final_probe(gemma_base.lane_count)
    chain = LocalChain(gemma_base, request.param)
    yield chain
    chain.close()


def test_gemma_split_equals_unsplit(
    gemma_split: LocalChain, gemma_prompt: list[int], gemma_reference: tuple[np.ndarray, list[int]]
) -> None:
    ref_logits, ref_tokens = gemma_reference
    assert gemma_split.stages[0].n_vocab == 262144 and len(gemma_split.stages) >= 2
    logits = decode_logits(gemma_split, [window(0, 0, gemma_prompt)])[0]
    gemma_split.release(0)
    assert logits.shape == (len(gemma_prompt), 262144)
    bad = [i for i in range(len(logits)) if not np.array_equal(logits[i], ref_logits[i])]
    assert not bad, f"prompt logits differ at positions {bad} (max |diff| {np.abs(logits - ref_logits).max()})"
    tokens = list(gemma_split.generate(gemma_prompt, STEPS))
    assert tokens == ref_tokens
    assert len(set(ref_tokens)) > 10  # a real continuation, not one token repeated


def test_gemma_batched_sessions_split_equals_unsplit(
    gemma_split: LocalChain, gemma_full: LocalChain, gemma_prompt: list[int]
) -> None:
    prompts = [gemma_prompt[:n] for n in (30, 12, 25, 5)]
    outputs = ["last", "all", "last", "all"]
    ref_tokens, ref_logits = batched_greedy(gemma_full, prompts, outputs, 16)
    tokens, logits = batched_greedy(gemma_split, prompts, outputs, 16)
    assert tokens == ref_tokens
    for i, (a, b) in enumerate(zip(logits, ref_logits)):
        assert np.array_equal(a, b), f"session {i}: max |diff| {np.abs(a - b).max()}"
