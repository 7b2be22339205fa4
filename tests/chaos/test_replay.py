"""Nothing lost when the final stage dies: the requests in flight pause and replay once it is back.

Real stage processes (tests/pipeline's `make_pipeline`), the driver in the test. Five requests decode at
once (one seeded at temperature 1, one seeded with repeat_penalty 1.3, three greedy); the final stage is
SIGKILLed mid-stream and started again; every request then completes with exactly the tokens of an
undisturbed run of the same requests (sampler state restored: penalties' history, the RNG's draws), each
token once. A final stage that never comes back fails the paused requests, and one that waited, after
`--openai-resume-timeout-s` with one error naming it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline_helpers import Pipeline, random_prompt, run, running_driver
from prometheus_client import generate_latest
from revive_helpers import decoding, driver_log, restart_stage
from test_pipeline_failures import Watched

from skippy.driver.driver import Driver
from skippy.protocol import ErrorCode
from skippy.runtime.sampling import SamplingParams

MAX_TOKENS = 300
REQUESTS = [SamplingParams(temperature=1.0, seed=1234), SamplingParams(temperature=0.8, seed=99, repeat_penalty=1.3),
            SamplingParams(), SamplingParams(), SamplingParams()]
DONE_WITHIN_S = 120.0  # bounded wait for the streams to finish (not a timing claim)


def _prompts() -> list[list[int]]:
    return [random_prompt(8 + 3 * i, 900 + i, 400) for i in range(len(REQUESTS))]


async def _generate(driver: Driver, min_tokens: int) -> list[Watched]:
    watched = [Watched(driver.submit(p, s, max_tokens=MAX_TOKENS), min_tokens) for p, s in zip(_prompts(), REQUESTS)]
    await asyncio.wait_for(asyncio.gather(*(w.started.wait() for w in watched)), 60.0)
    return watched


def test_killed_final_stage_restarted_loses_nothing(tiny_model: Callable[..., Path],
                                                   make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=8, ctx_size=512)
    logged: dict[str, list[dict[str, Any]]] = {}

    async def body() -> tuple[list[list[int]], list[Watched], str]:
        with driver_log(pipe.directory / "driver.log") as events:
            async with running_driver(pipe) as driver:
                undisturbed = await _generate(driver, 1)
                await asyncio.wait_for(asyncio.gather(*(w.task for w in undisturbed)), DONE_WITHIN_S)
                watched = await _generate(driver, 5)
                assert all(w.final is None for w in watched), "a request ended before the kill"
                pipe.stages.kill("stage1")
                await restart_stage(pipe, 1)
                await asyncio.wait_for(asyncio.gather(*(w.task for w in watched)), DONE_WITHIN_S)
                metrics = generate_latest(driver.telemetry.registry).decode()
            logged.update((name, events(name)) for name in ("request_replay", "request_paused", "stage_back"))
            return [w.tokens for w in undisturbed], watched, metrics

    expected, watched, metrics = run(body())
    diffs = [next((i for i, (a, b) in enumerate(zip(want, got.tokens)) if a != b), None)
             for want, got in zip(expected, watched)]
    assert diffs == [None] * len(REQUESTS), (diffs, [(e["session_id"], e["replayed_committed"], e["draws"])
                                                     for e in logged["request_replay"]])
    for want, got in zip(expected, watched):
        assert len(want) == MAX_TOKENS
        assert got.final is not None and got.final.finish_reason == "length", got.final
        assert got.tokens == want  # each token once, the undisturbed run's
    replays = logged["request_replay"]
    assert len(replays) == len(REQUESTS), replays  # once per request
    assert {e["dead_stage"] for e in replays} == {"stage1"}
    assert all(e["replayed_tokens"] > 0 and e["paused_ms"] > 0 for e in replays), replays
    assert [e["stage"] for e in logged["stage_back"]] == ["stage1"]
    assert f"skippy_driver_replays_total {float(len(REQUESTS))}" in metrics
    replayed = sum(e["replayed_tokens"] for e in replays)
    assert f"skippy_driver_replayed_tokens_total {float(replayed)}" in metrics


def test_final_stage_that_never_comes_back_fails_after_the_resume_deadline(
        tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=2, ctx_size=512)

    async def body() -> tuple[list[Any], Any]:
        async with running_driver(pipe, "--openai-resume-timeout-s", "1.5", dead_after_s=1.0) as driver:
            watched = await decoding(driver, 2)
            pipe.stages.kill("stage1")
            late = Watched(driver.submit([5, 6, 7], max_tokens=4))  # waits at stage 0 instead of a refusal
            finals = await asyncio.wait_for(asyncio.gather(*(w.task for w in [*watched, late])), 30.0)
            return finals, driver.status()

    finals, status = run(body())
    for final in finals:
        assert final.finish_reason == "error" and final.code is ErrorCode.PIPELINE_FAILED, final
        assert final.error and final.error.startswith("stage stage1 died and did not come back within 1.5 s ("), final
    assert not status.ready and status.dead_stage == "stage1"
