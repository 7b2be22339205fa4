"""The lanes share one KV pool: stage 0 admits into it, waits when it is full, preempts when decoding outgrows it.

Real pipelines of the tiny llama (stage 1 a process, stage 0's driver here) with a pool of one context (512 cells)
for several lanes: a lane's former share would be 512 / lanes. Each test replays the driver's op log on the
unsplit model (the same pool) and must get bitwise the same tokens, so whatever admission, preemption and
eviction did, every stage computed what the model computes for those operations.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline_helpers import REQUEST_TIMEOUT_S, Pipeline, random_prompt, run, running_driver

from skippy.driver.driver import Driver
from skippy.launcher import default_kv_cache
from skippy.protocol import TokenEvents
from skippy.testing.reference_runs import check_against_alone, greedy_with_margins, replay_op_log

CTX = POOL = 512
VOCAB = 200  # tiny models' token ids are drawn below it
MIN_MARGIN = 0.5


def _pipe(make_pipeline: Callable[..., Pipeline], tiny_model: Callable[..., Path], lanes: int,
          **extra: Any) -> Pipeline:
    return make_pipeline(tiny_model("llama"), [3], lane_count=lanes, ctx_size=CTX,
                         extra={"kv_pool_cells": POOL, **extra})


async def _in_order(driver: Driver, requests: Sequence[tuple[list[int], int]]) -> list[tuple[int, TokenEvents]]:
    """Submit every (prompt, max_tokens) at once; every event as (request index, event), in arrival order."""
    handles = [driver.submit(prompt, max_tokens=n) for prompt, n in requests]
    order: list[tuple[int, TokenEvents]] = []

    async def watch(i: int) -> None:
        async for event in handles[i]:
            order.append((i, event))

    await asyncio.wait_for(asyncio.gather(*(watch(i) for i in range(len(handles)))), REQUEST_TIMEOUT_S)
    return order


def _tokens(order: list[tuple[int, TokenEvents]], i: int) -> list[int]:
    return [t for j, event in order if j == i for t in event.tokens]


def _final(order: list[tuple[int, TokenEvents]], i: int) -> TokenEvents:
    return next(event for j, event in order if j == i and event.final)


def _check_replay(pipe: Pipeline, op_log: list[Any], sessions: dict[int, list[int]]) -> None:
    chain = pipe.reference_chain()
    try:
        replayed = replay_op_log(chain, op_log)
    finally:
        chain.close()
    assert {sid: replayed[sid] for sid in sessions} == sessions


def test_one_long_request_uses_what_idle_lanes_do_not_hold(tiny_model: Callable[..., Path],
                                                           make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = _pipe(make_pipeline, tiny_model, lanes=4)  # a lane's former share: 128 cells
    prompt = random_prompt(450, 1, VOCAB)

    async def body() -> tuple[list[int], TokenEvents, int, list[Any], float | None]:
        async with running_driver(pipe) as driver:
            handle = driver.submit(prompt, max_tokens=40)
            sid = driver.table.waiting[0].session_id
            tokens, final = await asyncio.wait_for(handle.collect(), REQUEST_TIMEOUT_S)
            pool = driver.telemetry.registry.get_sample_value("skippy_driver_kv_pool_cells")
            return tokens, final, sid, list(driver.recorder), pool

    tokens, final, sid, op_log, pool = run(body())
    assert (final.finish_reason, len(tokens), pool) == ("length", 40, POOL)
    sized = [e for e in pipe.events("stage1") if e.get("event") == "context_sized"]
    assert sized and (sized[0]["ctx_size"], sized[0]["kv_pool_cells"]) == (CTX, POOL)
    _check_replay(pipe, op_log, {sid: tokens})


def test_a_request_waits_for_cells_and_runs_once_they_free(tiny_model: Callable[..., Path],
                                                           make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = _pipe(make_pipeline, tiny_model, lanes=4)
    first, second = random_prompt(300, 2, VOCAB), random_prompt(300, 3, VOCAB)

    async def body() -> tuple[list[tuple[int, TokenEvents]], list[Any], int]:
        async with running_driver(pipe) as driver:
            order = await _in_order(driver, [(first, 60), (second, 20)])
            return order, list(driver.recorder), len(driver.table)

    order, op_log, live = run(body())
    assert [(_final(order, i).finish_reason, len(_tokens(order, i))) for i in (0, 1)] == [("length", 60), ("length", 20)]
    # the second's 300 cells were free only once the first had ended: it waited, and nothing failed
    first_done = next(k for k, (i, event) in enumerate(order) if i == 0 and event.final)
    second_starts = next(k for k, (i, event) in enumerate(order) if i == 1 and event.tokens)
    assert first_done < second_starts, order
    assert live == 0


def test_decoding_sessions_that_outgrow_the_pool_preempt_the_youngest(tiny_model: Callable[..., Path],
                                                                       make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = _pipe(make_pipeline, tiny_model, lanes=2)
    prompts = [random_prompt(200, 4, VOCAB), random_prompt(200, 5, VOCAB)]  # both admitted: 2 x ~232 cells
    max_tokens = 250  # together they grow to 900 positions: more than the pool

    async def body() -> tuple[list[tuple[int, TokenEvents]], list[int], list[Any], float | None]:
        async with running_driver(pipe) as driver:
            handles = [driver.submit(p, max_tokens=max_tokens) for p in prompts]
            sessions = [seq.session_id for seq in driver.table.waiting]
            order: list[tuple[int, TokenEvents]] = []

            async def watch(i: int) -> None:
                async for event in handles[i]:
                    order.append((i, event))

            await asyncio.wait_for(asyncio.gather(watch(0), watch(1)), REQUEST_TIMEOUT_S)
            preempted = driver.telemetry.registry.get_sample_value("skippy_driver_preemptions_total")
            return order, sessions, list(driver.recorder), preempted

    order, sessions, op_log, preempted = run(body())
    assert preempted is not None and preempted >= 1
    got = [_tokens(order, i) for i in (0, 1)]
    assert [(_final(order, i).finish_reason, len(got[i])) for i in (0, 1)] == [("length", max_tokens)] * 2
    _check_replay(pipe, op_log, dict(zip(sessions, got)))
    # the preempted one replayed its prompt and tokens and went on where it was: as the model alone would
    chain = pipe.reference_chain()
    try:
        for prompt, tokens in zip(prompts, got):
            alone, margins = greedy_with_margins(chain, prompt, max_tokens)
            _, problem = check_against_alone(tokens, alone, margins, MIN_MARGIN)
            assert problem is None, problem
    finally:
        chain.close()


def test_prefix_cache_entries_take_no_cells_of_the_pool(tiny_model: Callable[..., Path],
                                                        make_pipeline: Callable[..., Pipeline]) -> None:
    # the entries may hold more than the pool (1 GiB): they are kept outside it
    pipe = _pipe(make_pipeline, tiny_model, lanes=2, kv_cache={**default_kv_cache(2), "max_bytes": 1 << 30})
    first, second = random_prompt(300, 6, VOCAB), random_prompt(420, 7, VOCAB)

    async def body() -> tuple[list[tuple[list[int], TokenEvents]], list[int], list[Any], dict[str, int]]:
        async with running_driver(pipe) as driver:
            results, sessions = [], []
            # the first's prompt and reply stay as entries (~300 cells' copies) while the second's 421 cells run
            for prompt in (first, second, first):
                handle = driver.submit(prompt, max_tokens=8)
                sessions.append(driver.table.waiting[0].session_id)
                results.append(await asyncio.wait_for(handle.collect(), REQUEST_TIMEOUT_S))
            return results, sessions, list(driver.recorder), dict(driver.prefix.counters)

    results, sessions, op_log, counters = run(body())
    assert [(final.finish_reason, len(tokens)) for tokens, final in results] == [("length", 8)] * 3
    assert counters.get("evictions", 0) == 0 and counters["hits"] == 1  # the first prompt, sent again, restored
    _check_replay(pipe, op_log, {sid: tokens for sid, (tokens, _) in zip(sessions, results)})
