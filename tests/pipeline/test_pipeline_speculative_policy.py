"""The default speculation (the suffix proposer of DEFAULT_POLICY_PLAN with the cross-request index, under
SpeculationPolicy) through real stage processes: a request that re-does an earlier request's sub-task gets
its drafts from the global index (counted by source), and its greedy output is plain decoding's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from pipeline_helpers import Pipeline, generate_then_release, random_prompt, reference_generate, run, running_driver

from skippy.config.generation import DEFAULT_POLICY_PLAN
from skippy.driver.speculative.engine import Speculation
from skippy.driver.speculative.global_suffix import GlobalSuffixProposerFactory
from skippy.driver.speculative.policy import SpeculationPolicy

FIRST_TOKENS, DONE_BEFORE, REPEAT_TOKENS = 24, 8, 16


def test_a_repeated_sub_task_drafts_from_the_global_index_under_the_default_policy(
        tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline]) -> None:
    """An agent sends a task, then re-sends it with the first steps of the answer done and asks for the
    rest: the rest is an earlier session's output, which the second session's own history has never seen,
    so the drafts that are accepted came from the global index (source "global")."""
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=4, ctx_size=128)
    task = random_prompt(12, 321, 400)
    plan = DEFAULT_POLICY_PLAN
    assert plan.ngram is not None
    factory = GlobalSuffixProposerFactory(plan.ngram, 4096)
    # uncalibrated (every row costs the same): the policy's k follows acceptance alone, deterministically
    speculation = Speculation(factory, SpeculationPolicy(plan.verify_window.max_tokens, max_depth=2),
                              plan.verify_window.max_tokens, depth=plan.verify_window.pipeline_depth)

    steps: list[float] = []  # micro-batches each request took (its prefill chunk included)

    async def body() -> tuple[list[int], list[int]]:
        async with running_driver(pipe, speculation=speculation) as driver:
            done = lambda: driver.telemetry.iterations._value.get()  # noqa: E731
            start = done()
            first = await generate_then_release(driver, speculation, task, FIRST_TOKENS)
            steps.append(done() - start)
            before = dict(speculation.totals.accepted_by_source)
            assert before.get("global", 0) == 0  # nothing was in the index during the first request
            resumed = task + first[:DONE_BEFORE]
            start = done()
            rest, _ = await asyncio.wait_for(driver.submit(resumed, max_tokens=REPEAT_TOKENS).collect(), 60)
            steps.append(done() - start)
            return first, rest

    first, rest = run(body())
    # the repeat decodes >= 3x as many tokens per step as the first time (what makes it >= 3x faster)
    assert REPEAT_TOKENS / steps[1] >= 3 * FIRST_TOKENS / steps[0], steps
    assert first == reference_generate(pipe, [task], FIRST_TOKENS)[0]
    assert rest == first[DONE_BEFORE:] == reference_generate(pipe, [task + first[:DONE_BEFORE]], REPEAT_TOKENS)[0]
    totals = speculation.totals
    assert totals.accepted_by_source["global"] >= REPEAT_TOKENS // 2, totals
    assert totals.proposed_by_source["global"] >= totals.accepted_by_source["global"]
