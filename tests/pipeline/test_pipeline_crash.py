"""A failure inside a process surfaces: the client gets an error naming the cause, the process exits 1.

Failures are injected with SKIPPY_FAULT (skippy.faults) in the stage processes, so the processes'
real failure paths run: supervision, `process_failed`, failed requests, exit codes.
- a driver task that raises (stage 0 process): the request in flight fails with the cause, exit 1;
- a send that fails on stage 0's link: the same;
- a send that fails on a middle stage's link: that stage exits 1 and tells stage 0, whose request
  fails with an error naming the stage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from pipeline_helpers import Pipeline, random_prompt, run, running_driver

from skippy.client import PipelineClient
from skippy.protocol import ErrorCode
from skippy.transport.endpoints import request_endpoint

EXIT_WITHIN_S = 30.0


def _failed_line(pipe: Pipeline, stage_id: str) -> dict:
    lines = [e for e in pipe.events(stage_id) if e.get("event") == "process_failed"]
    assert lines, f"{stage_id} logged no process_failed line: {pipe.log_tail(stage_id)}"
    return lines[0]


def _exit_code(pipe: Pipeline, stage_id: str) -> int:
    return pipe.stages.procs[stage_id].wait(EXIT_WITHIN_S)


def _request_through_stage0(pipe: Pipeline) -> tuple[str | None, str | None, str | None]:
    async def body() -> tuple[str | None, str | None, str | None]:
        client = PipelineClient(request_endpoint(pipe.endpoint(0)))
        try:
            handle = await client.submit(random_prompt(12, 5, 400), max_tokens=8)
            _, final = await asyncio.wait_for(handle.collect(), EXIT_WITHIN_S)
            return final.finish_reason, final.error, final.code
        finally:
            client.close()

    return run(body())


def test_driver_task_failure_fails_the_request_and_exits_nonzero(
        tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = make_pipeline(tiny_model("llama"), [3], include_stage0=True, env={"SKIPPY_FAULT": "driver.launch"})
    reason, error, code = _request_through_stage0(pipe)
    assert (reason, code) == ("error", ErrorCode.PIPELINE_FAILED)
    assert error is not None and "stage stage0 failed: schedule loop failed" in error and "driver.launch" in error
    assert _exit_code(pipe, "stage0") == 1
    assert "schedule loop failed" in _failed_line(pipe, "stage0")["cause"]
    assert pipe.stages.procs["stage1"].poll() is None  # the other stage is unaffected


def test_link_send_failure_at_stage0_fails_the_request_and_exits_nonzero(
        tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline]) -> None:
    # no speculation: its startup calibration would send the first Batch, and the fault would stop stage 0 before ready
    pipe = make_pipeline(tiny_model("llama"), [3], include_stage0=True, env={"SKIPPY_FAULT": "link.batch"},
                         stage_flags=("--no-speculative",))
    reason, error, code = _request_through_stage0(pipe)
    assert (reason, code) == ("error", ErrorCode.PIPELINE_FAILED)
    assert error is not None and "sending Batch to" in error and "link.batch" in error
    assert _exit_code(pipe, "stage0") == 1
    assert _failed_line(pipe, "stage0")["cause"].startswith("sending Batch to ")


def test_link_send_failure_at_a_middle_stage_names_that_stage(
        tiny_model: Callable[..., Path], make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = make_pipeline(tiny_model("llama"), [2, 4], env={"SKIPPY_FAULT": "link.batch"})

    async def body() -> tuple[str | None, str | None]:
        # the stage is not restarted here: its request pauses, then fails at the resume deadline with the cause
        async with running_driver(pipe, "--openai-resume-timeout-s", "2") as driver:
            _, final = await asyncio.wait_for(driver.submit(random_prompt(12, 6, 400), max_tokens=8).collect(),
                                              EXIT_WITHIN_S)
            return final.finish_reason, final.error

    reason, error = run(body())
    assert reason == "error"
    assert error is not None and error.startswith("stage stage1 died and did not come back within 2 s"
                                                  " (stage stage1: stage stage1 sending Batch to "), error
    assert _exit_code(pipe, "stage1") == 1
    assert "link.batch" in _failed_line(pipe, "stage1")["cause"]
