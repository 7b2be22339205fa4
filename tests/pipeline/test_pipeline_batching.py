"""Eight concurrent requests through a 2- and a 3-stage pipeline: continuous batching is exact.

The driver's `op_log` is every batch and release exactly as the stages applied them; replaying it on
the unsplit model (same lanes, context, n_batch) must give bitwise the same tokens per session. Against
one-at-a-time runs the tokens must agree wherever the alone run's top-2 logit margin is clear, since
llama.cpp is not batch-invariant. The counters show rows really were batched, at the driver and at
every stage process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from pipeline_helpers import Pipeline, Result, generate_concurrently, random_prompt, run, running_driver

from skippy.runtime.tokenizer import Tokenizer
from skippy.testing.reference_runs import check_against_alone, clear_prefix, greedy_with_margins, replay_op_log

LANES = 8
MIN_MARGIN = 0.5


def _check_concurrent(pipe: Pipeline, prompts: Sequence[list[int]], max_tokens: Sequence[int]) -> int:
    """Run the prompts concurrently and check everything; returns how many tokens matched the alone runs."""
    assert len(prompts) == LANES

    async def body() -> tuple[list[Result], list, dict]:
        async with running_driver(pipe) as driver:
            results = await generate_concurrently(driver, prompts, max_tokens)
            stats = {k: getattr(driver.stats, k) for k in ("iterations", "max_rows", "max_sessions")}
            return results, list(driver.recorder), stats

    results, op_log, stats = run(body())
    codes = pipe.stop()
    assert all(code == 0 for code in codes.values()), codes

    for r, n in zip(results, max_tokens):
        assert r.final.finish_reason == "length", r.final
        assert len(r.tokens) == n

    # rows were really batched: several sessions in one micro-batch, at the driver and every stage
    assert stats["max_sessions"] > 1, stats
    assert max(len(op[1]) for op in op_log if op[0] == "batch") == stats["max_sessions"]
    for stage_id in pipe.stage_ids[1:]:
        stopped = pipe.stopped_line(stage_id)
        assert stopped["max_sessions"] > 1, stopped
        assert stopped["errors"] == 0, stopped
        assert stopped["batches"] == stats["iterations"], (stopped, stats)

    # bitwise: the unsplit model decoding the same batches samples the same tokens
    chain = pipe.reference_chain()
    try:
        replayed = replay_op_log(chain, op_log)
    finally:
        chain.close()
    assert {r.session_id: r.tokens for r in results} == replayed

    # against one-at-a-time runs: equal up to the first thin margin, and past it while they agree
    alone_chain = pipe.reference_chain()
    compared = 0
    try:
        for prompt, r, n in zip(prompts, results, max_tokens):
            alone, margins = greedy_with_margins(alone_chain, prompt, n)
            k = clear_prefix(margins, MIN_MARGIN)
            assert r.tokens[:k] == alone[:k], (r.session_id, k, r.tokens, alone, margins)
            n_compared, problem = check_against_alone(r.tokens, alone, margins, MIN_MARGIN)
            assert problem is None, (r.session_id, problem, r.tokens, alone)
            compared += n_compared
    finally:
        alone_chain.close()
    return compared


TINY_PROMPT_LENGTHS = (3, 17, 40, 9, 150, 64, 25, 200)  # 150 and 200 are prefilled in several chunks
TINY_MAX_TOKENS = (24, 16, 30, 20, 12, 24, 18, 10)


@pytest.mark.parametrize(("family", "splits"), [("llama", [3]), ("gemma3", [2, 4])],
                         ids=["llama-2stage", "gemma3-3stage"])
def test_concurrent_requests_match_unsplit_same_batches(
    tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline], family: str, splits: list[int]
) -> None:
    pipe = make_pipeline(tiny_model(family), splits, lane_count=LANES, ctx_size=512)
    prompts = [random_prompt(n, 100 + i, 400) for i, n in enumerate(TINY_PROMPT_LENGTHS)]
    compared = _check_concurrent(pipe, prompts, TINY_MAX_TOKENS)
    # the tiny models' margins are often thin, but batching noise is far smaller: most tokens still agree
    assert compared >= sum(TINY_MAX_TOKENS) // 2, f"only {compared} of {sum(TINY_MAX_TOKENS)} tokens comparable"


GEMMA_TEXTS = (
    "Hello",
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "1, 2, 3, 4, 5,",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown",
    "def add(a, b):\n    return",
    "Water boils at a temperature of",
    "In the beginning",
)
GEMMA_MAX_TOKENS = (12, 8, 16, 10, 8, 12, 10, 14)


def _check_texts_concurrently(pipe: Pipeline) -> None:
    chain = pipe.reference_chain()
    try:
        tokenizer = Tokenizer(chain.stages[0].model)
        prompts = [tokenizer.encode(text) for text in GEMMA_TEXTS]
    finally:
        chain.close()
    compared = _check_concurrent(pipe, prompts, GEMMA_MAX_TOKENS)
    assert compared >= sum(GEMMA_MAX_TOKENS) // 2, f"only {compared} of {sum(GEMMA_MAX_TOKENS)} tokens comparable"


@pytest.mark.gemma
def test_gemma_concurrent_requests_match_unsplit_same_batches(gemma_path: Path,
                                                               make_pipeline: Callable[..., Pipeline]) -> None:
    _check_texts_concurrently(make_pipeline(gemma_path, [5, 13], lane_count=LANES, ctx_size=128))


@pytest.mark.gemma
@pytest.mark.parametrize(("model", "splits"), [("qwen05b_path", [12]), ("qwen15b_path", [9, 19])],
                         ids=["qwen05b-2stage", "qwen15b-3stage"])
def test_qwen_coder_concurrent_requests_match_unsplit_same_batches(
        request: pytest.FixtureRequest, make_pipeline: Callable[..., Pipeline], model: str, splits: list[int]) -> None:
    _check_texts_concurrently(make_pipeline(request.getfixturevalue(model), splits, lane_count=LANES, ctx_size=128))
