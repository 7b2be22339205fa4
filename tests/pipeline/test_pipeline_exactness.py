"""1-, 2- and 3-stage pipelines (even and uneven splits) give the unsplit llama.cpp model's greedy tokens.

Requests go one at a time, so every batch the pipeline decodes is exactly a batch of the unsplit
`LocalChain.generate` run (llama.cpp is not batch-invariant; same batches -> bitwise equal). The
reference runs the same prompts in the same order on a fresh chain with the stages' lanes, context
size and thread count.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pipeline_helpers import Pipeline, generate_each, random_prompt, reference_generate, run, running_driver

from skippy.runtime.tokenizer import Tokenizer

TINY_PROMPT_LENGTHS = (5, 33, 70)  # 70 > the tiny gemma3's sliding window (32)
TINY_MAX_TOKENS = 12

TINY_CASES = [
    ("llama", []),
    ("llama", [1]),
    ("llama", [4]),
    ("llama", [3]),
    ("llama", [1, 5]),
    ("llama", [2, 3]),
    ("gemma3", [3]),
    ("gemma3", [1, 4]),
    ("qwen2", [2, 5]),
]


def _check_pipeline(pipe: Pipeline, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    async def body() -> list[list[int]]:
        async with running_driver(pipe) as driver:
            return await generate_each(driver, prompts, max_tokens)

    got = run(body())
    codes = pipe.stop()
    assert all(code == 0 for code in codes.values()), codes
    return got


TINY_IDS = [f"{family}-{'_'.join(map(str, splits)) or 'unsplit'}" for family, splits in TINY_CASES]


@pytest.mark.parametrize(("family", "splits"), TINY_CASES, ids=TINY_IDS)
def test_tiny_split_matches_unsplit(tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline],
                                    family: str, splits: list[int]) -> None:
    pipe = make_pipeline(tiny_model(family), splits, lane_count=2, ctx_size=128)
    assert len(pipe.stages.procs) == len(splits)  # stage 0 is the driver in this process
    n_vocab = 400
    prompts = [random_prompt(n, seed, n_vocab) for seed, n in enumerate(TINY_PROMPT_LENGTHS)]
    expected = reference_generate(pipe, prompts, TINY_MAX_TOKENS)
    got = _check_pipeline(pipe, prompts, TINY_MAX_TOKENS)
    assert got == expected
    assert any(len(set(t)) > 1 for t in expected), "degenerate reference: every continuation repeats one token"


GEMMA_TEXTS = (
    "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
)


@pytest.mark.gemma
@pytest.mark.parametrize("splits", [[9], [5, 13]], ids=["split9", "split5-13"])
def test_gemma_split_matches_unsplit(gemma_path: Path, make_pipeline: Callable[..., Pipeline],
                                     splits: list[int]) -> None:
    pipe = make_pipeline(gemma_path, splits, lane_count=2, ctx_size=128)
    assert pipe.n_layer == 18
    _check_texts(pipe)


def _check_texts(pipe: Pipeline, max_tokens: int = 16) -> None:
    """GEMMA_TEXTS through the pipeline give the unsplit model's greedy tokens."""
    reference = pipe.reference_chain()
    try:
        tokenizer = Tokenizer(reference.stages[0].model)
        prompts = [tokenizer.encode(text) for text in GEMMA_TEXTS]
        expected = [list(reference.generate(p, max_tokens)) for p in prompts]
    finally:
        reference.close()
    assert _check_pipeline(pipe, prompts, max_tokens) == expected


QWEN_CASES = [("qwen05b_path", [12], 24), ("qwen05b_path", [6, 18], 24), ("qwen15b_path", [14], 28),
              ("qwen15b_path", [7, 21], 28)]


@pytest.mark.gemma
@pytest.mark.parametrize(("model", "splits", "n_layer"), QWEN_CASES,
                         ids=[f"{m[:7]}-{'_'.join(map(str, s))}" for m, s, _ in QWEN_CASES])
def test_qwen_coder_split_matches_unsplit(request: pytest.FixtureRequest, make_pipeline: Callable[..., Pipeline],
                                          model: str, splits: list[int], n_layer: int) -> None:
    """Real weights (Qwen2.5-Coder-0.5B and -1.5B-Instruct, Q4_K_M, untied output) at even and uneven splits."""
    pipe = make_pipeline(request.getfixturevalue(model), splits, lane_count=2, ctx_size=128)
    assert pipe.n_layer == n_layer
    _check_texts(pipe)


@pytest.mark.gemma
def test_smollm2_split_matches_unsplit(smollm2_path: Path, make_pipeline: Callable[..., Pipeline]) -> None:
    """SmolLM2 (llama architecture, 30 layers, Q4_1) split in half."""
    pipe = make_pipeline(smollm2_path, [15], lane_count=2, ctx_size=128)
    assert pipe.n_layer == 30
    _check_texts(pipe)
