"""Reply credits bound what is in flight, and a downstream that stops reading blocks its sender.

With `--max-inflight 2` at the driver and every stage, no sender ever has more than 2 un-credited
batches toward its downstream (driver counters live, stage counters from their `stopped` lines).
A final stage frozen with SIGSTOP takes nothing, returns no credits: the driver reaches its credit
limit and waits there (in-flight count and send queue stay bounded) until SIGCONT, after which every
request completes with the tokens of the unsplit model decoding the same batches.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from pipeline_helpers import (
    REQUEST_TIMEOUT_S,
    Pipeline,
    generate_concurrently,
    random_prompt,
    run,
    running_driver,
    session_of,
)

from skippy.testing.reference_runs import replay_op_log

LIMIT = 2
FLAGS = ("--max-inflight", str(LIMIT))


def _replayed_tokens(pipe: Pipeline, op_log: list) -> dict[int, list[int]]:
    chain = pipe.reference_chain()
    try:
        return replay_op_log(chain, op_log)
    finally:
        chain.close()


def test_credit_counters_never_exceed_max_inflight(tiny_model: Callable[..., Path],
                                                   make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = make_pipeline(tiny_model("llama"), [2, 4], lane_count=8, ctx_size=256, stage_flags=FLAGS)
    prompts = [random_prompt(8 + 9 * i, 200 + i, 400) for i in range(8)]
    max_tokens = [12 + i for i in range(8)]

    async def body() -> tuple[list, list, dict, dict]:
        # more iterations allowed in flight than credits: the credits are what binds
        async with running_driver(pipe, *FLAGS, max_iterations=6) as driver:
            assert driver.options.max_inflight == LIMIT
            results = await generate_concurrently(driver, prompts, max_tokens)
            # the last batch's credit comes from stage 1 on its own socket and may trail stage 2's predictions
            credits = driver.downstream.credits.stats
            deadline = time.monotonic() + 30.0
            while credits.outstanding and time.monotonic() < deadline:  # bounded poll
                await asyncio.sleep(0.01)
            return results, list(driver.recorder), vars(credits).copy(), vars(driver.stats).copy()

    results, op_log, credits, stats = run(body())
    assert all(code == 0 for code in pipe.stop().values())
    assert all(r.final.finish_reason == "length" for r in results)
    assert credits["limit"] == LIMIT
    assert 1 <= credits["max_outstanding"] <= LIMIT, credits
    assert credits["outstanding"] == 0, credits  # every batch sent was credited back
    # (iterations in flight may exceed the credit limit: stage1 credits a batch once it has forwarded it)
    for stage_id in pipe.stage_ids[1:-1]:  # stages with a downstream to credit
        line = pipe.stopped_line(stage_id)
        assert line["credits"]["limit"] == LIMIT, line
        assert line["credits"]["max_outstanding"] <= LIMIT, line
    assert pipe.stopped_line(pipe.stage_ids[-1])["credits"] is None  # the final stage sends to no one
    assert pipe.stopped_line("stage1")["credits"]["max_outstanding"] >= 1  # stage1 did forward under credits
    assert {r.session_id: r.tokens for r in results} == _replayed_tokens(pipe, op_log)


async def _poll(predicate: Callable[[], bool], timeout_s: float, what: Callable[[], str]) -> None:
    """Bounded poll of in-process state (the driver's counters have no event to wait on)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what()}")
        await asyncio.sleep(0.01)


def test_stalled_downstream_blocks_sender(tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline]) -> None:
    # a frozen stage sends no heartbeats either; keep the driver from declaring it dead meanwhile
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=8, ctx_size=256, stage_flags=FLAGS)
    final = pipe.stages.procs["stage1"]
    prompts = [random_prompt(20 + 7 * i, 300 + i, 400) for i in range(6)]
    max_tokens = [40] * len(prompts)

    async def body() -> tuple[list, list, dict]:
        async with running_driver(pipe, *FLAGS, max_iterations=6, dead_after_s=120.0) as driver:
            credits = driver.downstream.credits.stats
            os.kill(final.pid, signal.SIGSTOP)
            try:
                # one request per micro-batch: submit the next once the previous one is on the wire,
                # until the driver has LIMIT un-credited batches out and waits for a credit that does not come
                handles = []
                for i, (prompt, m) in enumerate(zip(prompts, max_tokens)):
                    handles.append(driver.submit(prompt, max_tokens=m))
                    if i < LIMIT:
                        await _poll(lambda i=i: credits.outstanding == i + 1, 20.0,
                                    lambda i=i: f"batch {i + 1} to be sent ({credits})")
                    elif i == LIMIT:
                        await _poll(lambda: credits.waits >= 1, 20.0,
                                    lambda: f"the driver to wait for a credit ({credits})")
                sessions = [session_of(driver, h.request_id) for h in handles]
                sent_bytes = driver.downstream.bytes_sent
                for _ in range(50):  # and it stays blocked: nothing more in flight, nothing more sent
                    assert credits.outstanding == LIMIT, credits
                    assert len(driver.launcher.inflight) <= LIMIT, driver.launcher.inflight
                    assert driver.downstream._jobs.qsize() == 0  # no growing send queue either
                    await asyncio.sleep(0.02)
                assert driver.downstream.bytes_sent == sent_bytes
                assert credits.max_outstanding == LIMIT and driver.stats.max_in_flight == LIMIT
                # the scheduler is parked on the credit: LIMIT batches out, one computed and waiting, the rest queued
                assert credits.waits == 1
                assert (len(driver.table.running), len(driver.table.waiting)) == (LIMIT + 1, len(prompts) - LIMIT - 1)
                assert all(h._events.empty() for h in handles)  # nothing came back from a frozen stage
            finally:
                os.kill(final.pid, signal.SIGCONT)
            done = await asyncio.wait_for(asyncio.gather(*(h.collect() for h in handles)), REQUEST_TIMEOUT_S)
            assert credits.max_outstanding <= LIMIT
            results = [(s, tokens, final_event) for s, (tokens, final_event) in zip(sessions, done)]
            return results, list(driver.recorder), vars(credits).copy()

    results, op_log, credits = run(body())
    assert all(code == 0 for code in pipe.stop().values())
    for _, tokens, final_event in results:
        assert final_event.finish_reason == "length", final_event
        assert len(tokens) == 40
    assert credits["max_outstanding"] == LIMIT, credits
    assert {s: tokens for s, tokens, _ in results} == _replayed_tokens(pipe, op_log)


def test_stalled_final_stage_blocks_middle_stage(tiny_model: Callable[..., Path],
                                                 make_pipeline: Callable[..., Pipeline]) -> None:
    """3 stages, the final one frozen: stage1 fills its credit window toward it and waits there,
    and the driver stays at its cap of iterations in flight (one per stage here) with no more sent."""
    pipe = make_pipeline(tiny_model("llama"), [2, 4], lane_count=8, ctx_size=256, stage_flags=FLAGS)
    final = pipe.stages.procs["stage2"]
    prompts = [random_prompt(16 + 5 * i, 400 + i, 400) for i in range(5)]

    async def body() -> tuple[list, list]:
        async with running_driver(pipe, *FLAGS, max_iterations=3, dead_after_s=120.0) as driver:
            cap = driver.max_iterations
            assert cap == 3
            os.kill(final.pid, signal.SIGSTOP)
            try:
                handles, sessions = [], []
                for i, prompt in enumerate(prompts):
                    handles.append(driver.submit(prompt, max_tokens=24))
                    sessions.append(session_of(driver, handles[-1].request_id))
                    await _poll(lambda i=i: len(driver.launcher.inflight) == min(i + 1, cap), 20.0,
                                lambda i=i: f"iteration {i + 1} to be launched ({len(driver.launcher.inflight)} in flight)")
                for _ in range(25):  # nothing comes back, nothing more goes out
                    assert len(driver.launcher.inflight) == cap
                    assert driver.downstream.credits.stats.outstanding <= LIMIT
                    await asyncio.sleep(0.02)
                assert all(h._events.empty() for h in handles)
            finally:
                os.kill(final.pid, signal.SIGCONT)
            done = await asyncio.wait_for(asyncio.gather(*(h.collect() for h in handles)), REQUEST_TIMEOUT_S)
            assert driver.downstream.credits.stats.max_outstanding <= LIMIT
            return [(s, t, f) for s, (t, f) in zip(sessions, done)], list(driver.recorder)

    results, op_log = run(body())
    assert all(code == 0 for code in pipe.stop().values())
    assert all(f.finish_reason == "length" and len(t) == 24 for _, t, f in results), results
    middle = pipe.stopped_line("stage1")["credits"]
    assert middle["max_outstanding"] == LIMIT and middle["waits"] >= 1, middle  # stage1 waited on stage2
    assert {s: t for s, t, _ in results} == _replayed_tokens(pipe, op_log)
