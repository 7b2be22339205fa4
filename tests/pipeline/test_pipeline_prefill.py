"""One prompt's prefill chunks are pipelined across stages: chunk k+1 leaves stage 0 while chunk k is
still downstream, so a long prompt pays the hop delay about once, not once per chunk.

Shown with counters, not wall-clock: the driver's most chunks of one session in flight at once, and
the stages' receive/send timestamps the batches carry back (stage 0 sent chunk k+1 before stage 1
finished chunk k). The output stays exactly the unsplit replay of the same batches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from pipeline_helpers import Pipeline, random_prompt, reference_generate, run, running_driver

from skippy.protocol import Predictions
from skippy.testing.reference_runs import replay_op_log

PROMPT_TOKENS = 112
CHUNK = 16  # 7 chunks


def test_chunks_of_one_prompt_overlap_across_stages(tiny_model: Callable[..., Path],
                                                     make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=2, ctx_size=256)
    prompt = random_prompt(PROMPT_TOKENS, 77, 400)
    flags = ("--openai-prefill-chunk-policy", "fixed", "--openai-prefill-chunk-size", str(CHUNK),
             "--downstream-wire-delay-ms", "30")
    seen: list[Predictions] = []

    async def body() -> tuple[list[int], list, int]:
        async with running_driver(pipe, *flags, max_iterations=1) as driver:
            original = driver.on_predictions

            def record(msg: Predictions) -> None:
                seen.append(msg)
                original(msg)

            driver.on_predictions = record  # type: ignore[method-assign]
            tokens, final = await asyncio.wait_for(driver.submit(prompt, max_tokens=6).collect(), 60)
            assert final.finish_reason == "length"
            return tokens, list(driver.recorder), driver.stats.max_session_in_flight

    tokens, op_log, most_in_flight = run(body())
    chunks = [w for kind, batch in op_log if kind == "batch" for w in batch if w[1] < PROMPT_TOKENS]
    assert [w[1] for w in chunks] == list(range(0, PROMPT_TOKENS, CHUNK))
    assert most_in_flight >= 2  # with only one micro-batch allowed, the prompt's chunks still overlapped
    # stage 0 put chunk k+1 on the wire before stage 1 had finished chunk k, for some k
    batches = sorted((m for m in seen if m.timings), key=lambda m: m.batch_id)[: len(chunks)]
    overlaps = sum(1 for a, b in zip(batches, batches[1:]) if b.timings[0].sent_at < a.timings[-1].sent_at)
    assert overlaps >= 1, [(m.batch_id, [(t.stage_id, t.recv_at, t.sent_at) for t in m.timings]) for m in batches]
    chain = pipe.reference_chain()
    try:
        replayed = replay_op_log(chain, op_log)
    finally:
        chain.close()
    assert tokens == next(iter(replayed.values()))[:6] == reference_generate(pipe, [prompt], 6)[0]


def test_one_micro_batch_in_flight_prefills_a_prompt_in_one_chunk(tiny_model: Callable[..., Path],
                                                                  make_pipeline: Callable[..., Pipeline]) -> None:
    """Default chunk flags: with one micro-batch in flight (stages sharing cores) chunks cannot overlap, so a
    200-token prompt goes in one chunk (the ramp's max, 384); with two, the ramp starts at 128 as before."""
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=2, ctx_size=512)
    prompt = random_prompt(200, 78, 400)

    async def chunk_starts(max_iterations: int) -> list[int]:
        async with running_driver(pipe, max_iterations=max_iterations) as driver:
            await asyncio.wait_for(driver.submit(prompt, max_tokens=2).collect(), 60)
            return [w[1] for kind, batch in driver.recorder if kind == "batch" for w in batch if w[1] < len(prompt)]

    assert run(chunk_starts(1)) == [0]
    assert run(chunk_starts(2)) == [0, 128]
