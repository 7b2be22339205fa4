"""A 16k-token prompt through a 2-stage pipeline while another session decodes (a tiny llama with a 32k trained
context, and the default model, Qwen2.5-Coder-0.5B, split at 12; each with its whole 32k context served): the long
prompt completes with bitwise the tokens its unsplit replay gives,
and it stalls the other stream by about one chunk per stage: between two of the decoding session's rows stage 0
schedules at most (STAGES + 1) x CHUNK tokens of the long prompt (the chunks that fill the pipeline while the
session's token makes its round trip, and one more when the token comes back while the next chunk is being
launched; chunked prefill interleaved with decode rows, the stall in wall time that round trip's cost, measured
by `skippy bench prefill`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from pipeline_helpers import REQUEST_TIMEOUT_S, Pipeline, random_prompt, run, running_driver, session_of

from skippy.testing.reference_runs import replay_op_log

LONG = 16_384
CHUNK = 512
STAGES = 2
FLAGS = ("--openai-prefill-chunk-policy", "fixed", "--openai-prefill-chunk-size", str(CHUNK))


def test_a_16k_prompt_interleaves_with_a_decoding_stream_and_equals_its_replay(
        tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline]) -> None:
    check_long_prompt(make_pipeline(tiny_model("llama", n_ctx_train=32768), [3], lane_count=2, ctx_size=32768),
                      REQUEST_TIMEOUT_S)


@pytest.mark.gemma
@pytest.mark.timeout(1500)
def test_a_16k_prompt_on_the_default_model_interleaves_and_equals_its_replay(
        qwen05b_path: Path, make_pipeline: Callable[..., Pipeline]) -> None:
    # ~130 tokens/s here: the prompt's prefill takes minutes, its replay on the unsplit model as long again
    check_long_prompt(make_pipeline(qwen05b_path, [12], lane_count=2, ctx_size=32768), 900.0)


def check_long_prompt(pipe: Pipeline, timeout_s: float) -> None:
    long_prompt, short_prompt = random_prompt(LONG, 7, 400), random_prompt(12, 8, 400)

    async def body() -> tuple[int, int, list[int], list[int], list]:
        async with running_driver(pipe, *FLAGS) as driver:
            short = driver.submit(short_prompt, max_tokens=2000)
            short_session = session_of(driver, short.request_id)
            short_events = aiter(short)
            first = await asyncio.wait_for(anext(short_events), timeout_s)  # decoding before the long one comes
            assert first.tokens, first
            long = driver.submit(long_prompt, max_tokens=8)
            long_session = session_of(driver, long.request_id)
            long_tokens, long_final = await asyncio.wait_for(long.collect(), timeout_s)
            assert long_final.finish_reason == "length", long_final
            driver.cancel(short.request_id)
            return short_session, long_session, long_tokens, list(first.tokens), list(driver.recorder)

    short_session, long_session, long_tokens, _, op_log = run(body(), timeout_s + 60)
    pipe.stop()
    batches = [payload for kind, payload in op_log if kind == "batch"]
    prefill = [len(w[2]) for b in batches for w in b if w[0] == long_session and len(w[2]) > 1]
    assert sum(prefill) == LONG and max(prefill) <= CHUNK, prefill  # the whole prompt, in chunks of at most CHUNK
    # the stall: long-prompt tokens scheduled between two consecutive rows of the decoding session
    stalls, since = [], 0
    for batch in batches:
        since += sum(len(w[2]) for w in batch if w[0] == long_session and len(w[2]) > 1)
        if any(w[0] == short_session for w in batch):
            stalls.append(since)
            since = 0
    assert len(stalls) > LONG // (STAGES * CHUNK), "the decoding session was not interleaved with the prefill"
    assert max(stalls) <= (STAGES + 1) * CHUNK, stalls
    chain = pipe.reference_chain()
    try:
        replayed = replay_op_log(chain, op_log)
    finally:
        chain.close()
    assert replayed[long_session] == long_tokens
