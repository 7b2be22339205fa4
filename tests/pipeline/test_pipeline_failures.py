"""A stage that dies or is stopped mid-generation and never comes back: the affected requests pause, then fail
after the resume deadline with one error naming it; nothing leaks.

- SIGKILL of the final stage while requests decode: every request (and one submitted meanwhile, which
  waits instead of being refused) ends with finish_reason "error" naming that stage once
  --openai-resume-timeout-s has passed, and after teardown no stage process of this run is left.
- SIGTERM on a stage: it exits 0 and logs `stopped` with its counters; with requests decoding it
  first tells stage 0 (its report alone pauses them), whose requests fail at the deadline naming it.
(A stage that comes back: tests/chaos/test_replay.py and test_revive.py.)
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from pipeline_helpers import Pipeline, random_prompt, run, running_driver

from skippy.driver.driver import Driver
from skippy.protocol import TokenEvents
from skippy.request_events import RequestHandle

FAIL_WITHIN_S = 30.0  # bounded wait: the heartbeat bound, then the resume deadline
RESUME = ("--openai-resume-timeout-s", "2")


def _never_back(stage_id: str) -> str:
    """The resume deadline's error (the cause stage 0 saw follows in parentheses)."""
    return f"stage {stage_id} died and did not come back within 2 s ("


class Watched:
    """Consumes a handle's events; `started` is set once `min_tokens` tokens have arrived."""

    def __init__(self, handle: RequestHandle, min_tokens: int = 3) -> None:
        self.tokens: list[int] = []
        self.final: TokenEvents | None = None
        self.started = asyncio.Event()
        self.min_tokens = min_tokens
        self.task = asyncio.get_running_loop().create_task(self._consume(handle))

    async def _consume(self, handle: RequestHandle) -> TokenEvents:
        async for event in handle:
            if event.final:
                self.final = event
                self.started.set()  # a request that ends early must not leave the test waiting
                return event
            self.tokens += event.tokens
            if len(self.tokens) >= self.min_tokens:
                self.started.set()
        raise AssertionError("event stream ended without a final event")


async def _decoding(driver: Driver, n: int, max_tokens: int) -> list[Watched]:
    """n requests submitted and each seen producing tokens (bounded wait)."""
    watched = [Watched(driver.submit(random_prompt(6 + 3 * i, 600 + i, 400), max_tokens=max_tokens)) for i in range(n)]
    await asyncio.wait_for(asyncio.gather(*(w.started.wait() for w in watched)), 30.0)
    assert all(w.final is None for w in watched), [w.final for w in watched]
    return watched


def _stage_processes_of(pipe: Pipeline) -> list[str]:
    """Live `skippy stage` processes started from this pipeline's directory (pgrep -f)."""
    done = subprocess.run(["pgrep", "-af", f"skippy.cli.main stage --config {pipe.directory}/"],
                          capture_output=True, text=True, check=False)
    return [line for line in done.stdout.splitlines() if line.strip()]


def test_killed_final_stage_fails_requests_and_refuses_new_ones(tiny_model: Callable[..., Path],
                                                                make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = make_pipeline(tiny_model("llama"), [2, 4], lane_count=4, ctx_size=512)

    async def body() -> None:
        async with running_driver(pipe, *RESUME) as driver:
            watched = await _decoding(driver, 4, max_tokens=480)
            pipe.stages.kill("stage2")
            watched.append(Watched(driver.submit([5, 6, 7], max_tokens=4)))  # waits, never refused
            finals = await asyncio.wait_for(asyncio.gather(*(w.task for w in watched)), FAIL_WITHIN_S)
            for w, final in zip(watched, finals):
                assert final.finish_reason == "error", final
                assert final.error and final.error.startswith(_never_back("stage2")), final
                assert len(w.tokens) < 480

    run(body())
    assert pipe.stages.procs["stage2"].returncode == -signal.SIGKILL
    assert len(_stage_processes_of(pipe)) == 1  # the pgrep pattern does find this run's live stage1
    codes = pipe.stop()
    assert codes["stage1"] == 0, (codes, pipe.log_tail("stage1"))
    assert all(proc.returncode is not None for proc in pipe.stages.procs.values())
    assert _stage_processes_of(pipe) == []
    assert any(e.get("event") == "stopped" for e in pipe.events("stage1")), pipe.log_tail("stage1")


def test_sigterm_on_idle_stage_exits_zero_and_logs_stopped(tiny_model: Callable[..., Path],
                                                           make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=2, ctx_size=128)

    async def body() -> None:
        async with running_driver(pipe) as driver:
            tokens, final = await asyncio.wait_for(driver.submit([5, 6, 7, 8], max_tokens=5).collect(), 30.0)
            assert final.finish_reason == "length" and len(tokens) == 5

    run(body())
    proc = pipe.stages.procs["stage1"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0, pipe.log_tail("stage1")
    stopped = pipe.stopped_line("stage1")
    assert stopped["batches"] == 5 and stopped["errors"] == 0, stopped
    assert pipe.stop() == {"stage1": 0}


def test_sigterm_mid_generation_fails_requests_naming_the_stage(tiny_model: Callable[..., Path],
                                                                make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = make_pipeline(tiny_model("llama"), [2, 4], lane_count=4, ctx_size=512)
    proc = pipe.stages.procs["stage1"]

    async def body() -> None:
        async with running_driver(pipe, *RESUME) as driver:
            watched = await _decoding(driver, 3, max_tokens=480)
            proc.send_signal(signal.SIGTERM)
            finals = await asyncio.wait_for(asyncio.gather(*(w.task for w in watched)), FAIL_WITHIN_S)
            for final in finals:
                assert final.finish_reason == "error", final
                assert final.error and final.error.startswith(_never_back("stage1")), final
            assert not driver.status().ready
            # a bounded wait for the exit, off the event loop
            code = await asyncio.wait_for(asyncio.to_thread(proc.wait, 15), 20)
            assert code == 0, pipe.log_tail("stage1")

    run(body())
    stopped = pipe.stopped_line("stage1")
    assert stopped["batches"] >= 3, stopped
    codes = pipe.stop()
    assert codes == {"stage1": 0, "stage2": 0}, (codes, pipe.log_tail("stage2"))
    assert _stage_processes_of(pipe) == []


def test_sigterm_mid_generation_is_reported_by_the_stage(tiny_model: Callable[..., Path],
                                                         make_pipeline: Callable[..., Pipeline]) -> None:
    """The stopping stage's own report (not a heartbeat timeout) is what fails the requests."""
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=2, ctx_size=512)

    async def body() -> TokenEvents:
        async with running_driver(pipe, *RESUME, dead_after_s=600.0) as driver:  # no heartbeat timeout here
            (watched,) = await _decoding(driver, 1, max_tokens=480)
            pipe.stages.procs["stage1"].send_signal(signal.SIGTERM)
            return await asyncio.wait_for(watched.task, FAIL_WITHIN_S)

    final = run(body())
    assert pipe.stop() == {"stage1": 0}
    assert final.finish_reason == "error"
    assert final.error == _never_back("stage1") + "stage stage1: stage stage1 stopped)", final.error  # its report
