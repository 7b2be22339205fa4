"""The prefix cache across real stage processes (tiny gemma3: sliding-window layers), 2 and 3 stages.

A conversation's history is prefilled once: each turn restores the previous turn's prompt and reply
on every stage and prefills only the rest. Exactness: the driver's op log carries every window's restore,
evict and record, so replaying it on the unsplit model with the same prefix cache (same cache
decisions, same batches) samples bitwise the same tokens. Two sessions restore one prefix in one
batch; entries are evicted under the byte cap and no stage ever holds more than its cap. A stage
that lacks an entry (injected: `SKIPPY_FAULT=prefix.record` keeps none on that stage; at stage 0,
its entries are dropped in-process) makes the request a counted chain miss that prefills from 0,
and its tokens are those of the unsplit model run alone (compared where the top-2 margin is clear).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from pipeline_helpers import REQUEST_TIMEOUT_S, Pipeline, random_prompt, run, running_driver

from skippy.driver.driver import Driver
from skippy.protocol import TokenEvents
from skippy.protocol.stats import PrefixStats
from skippy.runtime.chain import LocalChain
from skippy.testing.reference_runs import check_against_alone, greedy_with_margins, replay_op_log

KV: dict[str, Any] = {"mode": "lookup-record", "min_tokens": 16, "shared_prefix_stride_tokens": 32,
                      "shared_prefix_record_limit": 1}
ENTRIES = 64  # KvCacheConfig's default max_entries
MAX_TOKENS = 6
MIN_MARGIN = 0.5
SPLITS = {"2stage": [3], "3stage": [2, 4]}


def cached_pipeline(make: Callable[..., Pipeline], model: Path, splits: list[int], *, start: bool = True,
                    **kv: Any) -> Pipeline:
    return make(model, splits, lane_count=2, ctx_size=256, extra={"kv_cache": {**KV, **kv}}, start=start)


def replay(pipe: Pipeline, op_log: list[tuple[str, Any]]) -> dict[int, list[int]]:
    """The op log on the unsplit model with a prefix cache of the same shape (no byte cap of its own)."""
    chain = LocalChain(dataclasses.replace(pipe.reference_spec(), prefix_entries=ENTRIES, prefix_max_bytes=0))
    try:
        return replay_op_log(chain, op_log)
    finally:
        chain.close()


async def ask(driver: Driver, prompt: Sequence[int]) -> tuple[int, list[int], PrefixStats]:
    handle = driver.submit(list(prompt), max_tokens=MAX_TOKENS)
    session = driver.table.get(handle.request_id)
    assert session is not None
    tokens, final = await asyncio.wait_for(handle.collect(), REQUEST_TIMEOUT_S)
    assert final.finish_reason == "length", final
    assert final.stats is not None and final.stats.prefix_cache is not None, final
    return session.session_id, tokens, final.stats.prefix_cache


def stage_caches(pipe: Pipeline) -> dict[str, dict[str, Any]]:
    pipe.stop()
    return {sid: pipe.stopped_line(sid)["prefix_cache"] for sid in pipe.stage_ids[1:]}


def check_multi_turn(pipe: Pipeline, n_vocab: int) -> None:
    """Four turns, each the previous prompt + its reply + a new message: every turn after the first
    restores the previous prompt and reply (kept when its session was released; the last reply token
    never ran) on every stage, and the run equals its unsplit replay."""

    async def body() -> tuple[list[tuple[int, list[int], dict[str, float]]], list[int], list[tuple[str, Any]]]:
        async with running_driver(pipe) as driver:
            history, turns, lengths = random_prompt(40, 1, n_vocab), [], []
            for turn in range(4):
                lengths.append(len(history))
                turns.append(await ask(driver, history))
                history = history + turns[-1][1] + random_prompt(20 + 7 * turn, 10 + turn, n_vocab)
            return turns, lengths, list(driver.recorder or ())

    turns, lengths, op_log = run(body())
    assert [t[2].cached_tokens for t in turns] == [0, *(n + MAX_TOKENS - 1 for n in lengths[:-1])]
    assert [t[2].hit for t in turns] == [False, True, True, True]
    assert all(t[2].chain_misses == 0 for t in turns)
    assert replay(pipe, op_log) == {sid: tokens for sid, tokens, _ in turns}
    for stage_id, cache in stage_caches(pipe).items():
        assert cache["restores"] == 3 and cache["misses"] == 0, (stage_id, cache)


@pytest.mark.parametrize("name", list(SPLITS))
def test_multi_turn_chat_restores_the_history_and_equals_the_unsplit_replay(
        name: str, tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline]) -> None:
    check_multi_turn(cached_pipeline(make_pipeline, tiny_model("gemma3"), SPLITS[name]), 400)


@pytest.mark.gemma
def test_gemma_multi_turn_chat_equals_the_unsplit_replay(gemma_path: Path,
                                                         make_pipeline: Callable[..., Pipeline]) -> None:
    check_multi_turn(cached_pipeline(make_pipeline, gemma_path, [9]), 20_000)


@pytest.mark.gemma
@pytest.mark.xfail(reason="a known bug to find: under a full-suite load (2 xdist workers plus benchmarks) turn 3 once"
                          " differed from the unsplit replay in its first token (953 vs 1930); it passes alone",
                   strict=False)
def test_qwen_coder_multi_turn_chat_equals_the_unsplit_replay(qwen05b_path: Path,
                                                              make_pipeline: Callable[..., Pipeline]) -> None:
    check_multi_turn(cached_pipeline(make_pipeline, qwen05b_path, [12]), 20_000)


def test_two_sessions_restore_the_same_prefix_at_once(tiny_model: Callable[..., Path],
                                                      make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = cached_pipeline(make_pipeline, tiny_model("gemma3"), SPLITS["3stage"])
    system = random_prompt(96, 2, 400)

    async def body() -> tuple[list[tuple[int, list[int], dict[str, float]]], list[tuple[str, Any]]]:
        async with running_driver(pipe) as driver:
            await ask(driver, system + random_prompt(32, 3, 400))  # records 128 and the grid point 96
            both = await asyncio.gather(*(ask(driver, system + random_prompt(32, s, 400)) for s in (4, 5)))
            return list(both), list(driver.recorder or ())

    both, op_log = run(body())
    assert [t[2].cached_tokens for t in both] == [96, 96]
    restoring = [sorted(w[0] for w in op[1] if w[6][0] is not None) for op in op_log if op[0] == "batch"]
    assert [r for r in restoring if r][-1] == sorted(t[0] for t in both)  # one batch restored both
    replayed = replay(pipe, op_log)
    assert all(replayed[sid] == tokens for sid, tokens, _ in both)


def test_entries_are_evicted_under_the_byte_cap(tiny_model: Callable[..., Path],
                                                make_pipeline: Callable[..., Pipeline]) -> None:
    cap = 100 * 512  # 100 cells of stage 0 (3 layers + its stop block, 128 bytes each); stage 1's are smaller
    # a llama: restores take the first 60 positions of a longer entry (not across sliding-window layers)
    pipe = cached_pipeline(make_pipeline, tiny_model("llama"), SPLITS["2stage"], max_bytes=cap,
                           shared_prefix_record_limit=0)
    prompts = [random_prompt(60, 20 + i, 400) for i in range(3)]

    async def body() -> tuple[list[dict[str, float]], dict[str, Any], list[tuple[str, Any]]]:
        async with running_driver(pipe) as driver:
            stats = [(await ask(driver, p))[2] for p in prompts]  # 60 cells each: only one fits
            stats.append((await ask(driver, prompts[2] + [5, 6, 7]))[2])  # the one kept
            stats.append((await ask(driver, prompts[0] + [5, 6, 7]))[2])  # evicted: looked up in vain
            assert driver.runtime.prefix is not None
            return stats, driver.runtime.prefix.summary(), list(driver.recorder or ())

    stats, stage0, op_log = run(body())
    # each prompt + reply kept at release supersedes its prompt's entry; the next prompt evicts it
    assert [s.evictions for s in stats[:3]] == [0, 1, 1]
    assert [s.cached_tokens for s in stats[3:]] == [60, 0]
    assert all(s.bytes <= 100 * (512 + 384) for s in stats)  # both stages' cells
    for cache in (stage0, *stage_caches(pipe).values()):
        assert 0 < cache["peak_bytes"] <= min(cap, cache["max_bytes"]), cache
        assert cache["own_evictions"] == 0 and cache["misses"] == 0, cache
    replayed = replay(pipe, op_log)
    assert len(replayed) == 5


@pytest.mark.parametrize(("name", "missing"), [("2stage", 0), ("2stage", 1), ("3stage", 1), ("3stage", 2)],
                         ids=["2stage-at-stage0", "2stage-at-stage1", "3stage-at-middle", "3stage-at-final"])
def test_a_miss_at_one_stage_falls_back_to_a_full_prefill(
        name: str, missing: int, tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = cached_pipeline(make_pipeline, tiny_model("gemma3"), SPLITS[name], start=False)
    for index in range(len(pipe.configs) - 1, 0, -1):  # downstream first; only `missing` keeps no entries
        fault = {"SKIPPY_FAULT": "prefix.record"} if index == missing else {}
        pipe.stages.env = {**os.environ, **fault}
        pipe.stages.start_stage(index)
    first = random_prompt(50, 30, 400)

    async def body() -> tuple[list[int], list[int], TokenEvents, dict[str, Any]]:
        async with running_driver(pipe) as driver:
            _, reply, _ = await ask(driver, first)
            if missing == 0:
                assert driver.runtime.prefix is not None
                await driver.worker.call(driver.runtime.prefix.clear)
            follow = first + reply + random_prompt(25, 31, 400)
            handle = driver.submit(follow, max_tokens=MAX_TOKENS)
            tokens, final = await asyncio.wait_for(handle.collect(), REQUEST_TIMEOUT_S)
            return follow, tokens, final, driver.prefix.snapshot()

    follow, tokens, final, index = run(body())
    assert final.finish_reason == "length", final
    stats = final.stats.prefix_cache if final.stats is not None else None
    assert stats is not None and (stats.chain_misses, stats.cached_tokens) == (1, 0), stats
    assert index["chain_misses"] == 1 and index["hits"] == 1, index
    caches = stage_caches(pipe)
    for index_, stage_id in enumerate(pipe.stage_ids[1:], start=1):
        assert caches[stage_id]["misses"] == (1 if index_ == missing else 0), (stage_id, caches[stage_id])
    chain = pipe.reference_chain()
    try:
        alone, margins = greedy_with_margins(chain, follow, MAX_TOKENS)
    finally:
        chain.close()
    compared, problem = check_against_alone(tokens, alone, margins, MIN_MARGIN)
    assert problem is None and compared > 0, (tokens, alone, margins)


@pytest.mark.parametrize(("family", "fork_cached"), [("llama", 60), ("gemma3", 0)])
def test_a_repeated_prompt_and_a_fork_restore_the_first_part_of_an_entry(
        family: str, fork_cached: int, tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline]) -> None:
    """The same prompt again restores all but its last token from its own entry; a prompt that leaves it
    midway restores the shared part, except across sliding-window layers (gemma3), whose kept state holds only
    the entry's last window; every stage copies just those positions, as the unsplit replay does."""
    pipe = cached_pipeline(make_pipeline, tiny_model(family), SPLITS["3stage"], shared_prefix_record_limit=0)
    first = random_prompt(80, 40, 400)
    fork = first[:60] + random_prompt(20, 41, 400)
    assert fork[60] != first[60]

    async def body() -> tuple[list[tuple[int, list[int], dict[str, float]]], list[tuple[str, Any]]]:
        async with running_driver(pipe) as driver:
            return [await ask(driver, p) for p in (first, first, fork)], list(driver.recorder or ())

    turns, op_log = run(body())
    assert [t[2].cached_tokens for t in turns] == [0, 79, fork_cached]
    replayed = replay(pipe, op_log)
    assert all(replayed[sid] == tokens for sid, tokens, _ in turns)
