"""A stage that comes back: stage 0 greets the chain again, waits for its Ready, and serves again.

- A killed stage pauses the requests in flight and a request sent meanwhile waits; once it is started
  again stage 0 greets it (`stage_greeted`), serving resumes only on the Ready (`stage_back`), the paused
  requests replay and complete, and the waiting one gives the unsplit model's tokens (no session of
  before survives anywhere) without restarting any other stage.
- A stage restarted faster than the heartbeat bound is still noticed: its heartbeats carry another
  process incarnation, so the requests it lost replay instead of hanging.
- The final stage of three restarted: stage 1 greets it again before answering stage 0.
- A restarted middle stage under `--activation-wire-dtype auto` is given the certified format again.
- A stage restarted with another model or another layer range is refused (logged on both sides): the
  paused request fails with that reason and the pipeline stays not ready; the right stage is accepted
  afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline_helpers import Pipeline, random_prompt, reference_generate, run, running_driver
from revive_helpers import (
    completed,
    decoding,
    driver_log,
    edited_json,
    events_named,
    restart_stage,
    serving,
    start_rogue,
    until,
)

from skippy.protocol import WireDtype, WireVerdict

MAX_TOKENS = 10


def test_killed_stage_comes_back_and_serves_exactly(tiny_model: Callable[..., Path],
                                                   make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=2, ctx_size=512)
    prompt = random_prompt(9, 42, 400)
    expected = reference_generate(pipe, [prompt], MAX_TOKENS)[0]
    logged: dict[str, list[dict[str, Any]]] = {}

    async def body() -> tuple[list[int], str | None, list[int]]:
        with driver_log(pipe.directory / "driver.log") as events:
            async with running_driver(pipe) as driver:
                watched = await decoding(driver, 2)
                pipe.stages.kill("stage1")
                late = driver.submit(prompt, max_tokens=MAX_TOKENS)  # waits at stage 0 while stage1 is down
                await restart_stage(pipe, 1)
                await completed(watched)  # paused, then replayed
                tokens, final = await asyncio.wait_for(late.collect(), 60.0)
                await until(lambda: not driver.runtime.active_sessions, "sessions released")
                held = list(driver.runtime.active_sessions)
            logged.update((name, events(name)) for name in ("stage_greeted", "stage_back"))
            return tokens, final.finish_reason, held

    tokens, reason, held = run(body())
    assert (reason, tokens) == ("length", expected)
    assert held == []  # the requests' sessions were dropped at stage 0 too
    assert [e["stage"] for e in logged["stage_greeted"]][-1:] == ["stage1"]
    assert [e["stage"] for e in logged["stage_back"]] == ["stage1"]
    assert len(events_named(pipe, "stage1", "upstream_accepted")) == 2  # the first process, then the new one


def test_a_fast_restart_is_told_by_its_incarnation(tiny_model: Callable[..., Path],
                                                   make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=2, ctx_size=512)

    async def body() -> tuple[list[str | None], str | None]:
        async with running_driver(pipe, dead_after_s=600.0) as driver:  # silence alone would take 10 minutes
            watched = await decoding(driver, 2)
            pipe.stages.kill("stage1")
            await restart_stage(pipe, 1)
            finals = await completed(watched)
            await until(lambda: serving(driver), "serving again")
            _, final = await asyncio.wait_for(driver.submit([5, 6, 7, 8], max_tokens=4).collect(), 60.0)
            return [f.finish_reason for f in finals], final.finish_reason

    reasons, reason = run(body())
    assert reasons == ["length", "length"]  # the restart was noticed (else they would never resume) and replayed
    assert reason == "length"


def test_final_stage_of_three_restarted_is_greeted_through_the_chain(tiny_model: Callable[..., Path],
                                                                     make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = make_pipeline(tiny_model("llama"), [2, 4], lane_count=2, ctx_size=512)
    prompt = random_prompt(7, 43, 400)
    expected = reference_generate(pipe, [prompt], MAX_TOKENS)[0]

    async def body() -> tuple[list[int], str | None]:
        async with running_driver(pipe) as driver:
            watched = await decoding(driver, 2)
            pipe.stages.kill("stage2")
            await restart_stage(pipe, 2)
            await completed(watched)
            await until(lambda: serving(driver), "serving again")
            tokens, final = await asyncio.wait_for(driver.submit(prompt, max_tokens=MAX_TOKENS).collect(), 60.0)
            return tokens, final.finish_reason

    tokens, reason = run(body())
    assert (reason, tokens) == ("length", expected)
    assert pipe.stages.procs["stage1"].poll() is None  # stage 1 was not restarted
    # stage 1 greeted the new stage 2 before answering stage 0 (startup greeting, then the revival's)
    assert [e["upstream"] for e in events_named(pipe, "stage2", "upstream_accepted")] == ["stage1"] * 3
    assert len(events_named(pipe, "stage1", "upstream_accepted")) == 2


def test_restarted_stage_with_another_model_or_range_is_refused(tiny_model: Callable[..., Path],
                                                                make_pipeline: Callable[..., Pipeline]) -> None:
    pipe = make_pipeline(tiny_model("llama"), [3], lane_count=2, ctx_size=256)
    other_model = tiny_model("llama", seed=1)  # same shapes and vocabulary, other weights: another digest
    config, topology = pipe.configs[1], pipe.topology
    rogue_model = edited_json(config, pipe.directory / "rogue-model.json",
                              lambda c: c.update(model_path=str(other_model)))

    def move_split(data: dict[str, Any]) -> None:
        if "stages" in data:
            data["stages"][0]["layer_end"] = data["stages"][1]["layer_start"] = 2
        else:
            data["layer_start"] = 2

    rogue_topology = edited_json(topology, pipe.directory / "rogue-topology.json", move_split)
    rogue_range = edited_json(config, pipe.directory / "rogue-range.json", move_split)

    async def refused(driver: Any, name: str, stage0_refusals: Callable[[], int], before: int) -> str:
        await until(lambda: bool(events_named(pipe, name, "handshake_refused")), f"{name} refused")
        # the rogue logs its refusal before its ErrorReport has left it: killed now, stage 0 might never hear
        # of it (and would only greet again after GREETING_TIMEOUT_S); kill it once stage 0 has logged it
        await until(lambda: stage0_refusals() > before, f"stage 0 told of {name}'s refusal")
        assert not driver.status().ready  # the broker routes nothing new here meanwhile
        pipe.stages.kill(name)
        return str(events_named(pipe, name, "handshake_refused")[0]["error"])

    refusals: list[dict[str, Any]] = []

    async def body() -> tuple[str, str, str | None]:
        with driver_log(pipe.directory / "driver.log") as events:
            async with running_driver(pipe) as driver:
                (paused,) = await decoding(driver, 1)
                pipe.stages.kill("stage1")
                await until(lambda: driver.liveness.dead == "stage1", "stage1 dead")
                def stage0_refusals() -> int:
                    return len(events("stage_refused"))

                await start_rogue(pipe, "rogue-model", rogue_model, topology)
                model_error = await refused(driver, "rogue-model", stage0_refusals, stage0_refusals())
                failed = await asyncio.wait_for(paused.task, 30.0)  # a paused request fails with the refusal
                assert failed.finish_reason == "error" and failed.error, failed
                assert failed.error.startswith("stage stage1 came back but was refused:"), failed.error
                await start_rogue(pipe, "rogue-range", rogue_range, rogue_topology)
                range_error = await refused(driver, "rogue-range", stage0_refusals, stage0_refusals())
                await restart_stage(pipe, 1)
                await until(lambda: serving(driver), "serving again")
                _, final = await asyncio.wait_for(driver.submit([5, 6, 7, 8], max_tokens=4).collect(), 60.0)
            refusals.extend(events("stage_refused"))
            return model_error, range_error, final.finish_reason

    model_error, range_error, reason = run(body())
    assert "serves model" in model_error, model_error
    assert "upstream stage0 ends at layer 3 but stage stage1 starts at layer 2" in range_error, range_error
    assert reason == "length"
    assert len(refusals) >= 2 and all(e["stage"] == "stage1" for e in refusals), refusals


def test_a_restarted_stage_gets_the_certified_wire_again(tiny_model: Callable[..., Path],
                                                         make_pipeline: Callable[..., Pipeline]) -> None:
    """Under `--activation-wire-dtype auto` a restarted middle stage starts in f32; once it is back stage 0
    sets the certified format (q8 on the tiny gemma3) on the chain again, as its verdict says."""
    auto = ("--activation-wire-dtype", "auto")
    pipe = make_pipeline(tiny_model("gemma3"), [2, 4], lane_count=1, stage_flags=auto)

    def set_again() -> bool:  # stage1's log since its last ready line: the chained SetWire with q8
        events = pipe.events("stage1")
        last_ready = max(i for i, e in enumerate(events) if e.get("event") == "ready")
        return any(e.get("event") == "wire_changed" and e.get("whole_chain") and e.get("activation_dtype") == "q8"
                   for e in events[last_ready:])

    async def body() -> WireVerdict | None:
        async with running_driver(pipe, *auto, dead_after_s=600.0) as driver:
            verdict = driver.wire_verdict
            await until(lambda: "stage1" in driver.liveness.incarnations, "stage1's heartbeat heard")  # a restart is told
            pipe.stages.kill("stage1")
            await restart_stage(pipe, 1)
            await until(lambda: serving(driver) and set_again(), "q8 set on the restarted stage")
            _, final = await asyncio.wait_for(driver.submit([5, 6, 7, 8], max_tokens=4).collect(), 60.0)
            assert final.finish_reason == "length"
            return verdict

    verdict = run(body())
    assert verdict is not None and verdict.asked == "auto" and verdict.used is WireDtype.Q8
