"""Stage 0 certifies an f16/q8 activation wire at startup through the real split (skippy.driver.wire_certify).

Real stage processes (ipc endpoints, one llama.cpp thread each). Gemma 3 270M split at layer 9 with q8
is refused: the start fails with the format, the measured agreement and the flag in its error; with
`auto` the same split falls back to f16, and the verdict is in stage 0's ready line and its Status.
A tiny gemma3 split in three stages passes q8 (every link switched by the chained SetWire: the middle
stage logs it), so the format asked is the one served.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from skippy.client import PipelineClient
from skippy.driver.wire_certify import MIN_AGREEMENT
from skippy.launcher import LaunchError, StageProcesses, read_events, write_local_topology
from skippy.protocol import Status, WireDtype
from skippy.runtime.slices import read_model_info
from skippy.transport.endpoints import request_endpoint

TIMEOUT_S = 60.0


def pipeline(model: Path, splits: Sequence[int], directory: Path, dtype: str) -> StageProcesses:
    topology, configs = write_local_topology(directory, model, read_model_info(model).n_layer, list(splits),
                                             lane_count=1, ctx_size=256, extra={"n_threads": 1})
    return StageProcesses(topology, configs, directory / "run", ["--activation-wire-dtype", dtype], include_stage0=True)


async def status_of(stages: StageProcesses) -> Status:
    client = PipelineClient(request_endpoint(stages.topology.first().endpoint))
    try:
        return await client.status(timeout_s=TIMEOUT_S)
    finally:
        client.close()


def test_gemma_q8_is_refused_with_the_measured_agreement(gemma_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    with pytest.raises(LaunchError) as refused:
        pipeline(gemma_path, [9], tmp_path_factory.mktemp("wire"), "q8").start()
    message = str(refused.value)
    match = re.search(r"--activation-wire-dtype q8: the final stage's argmax agrees with f32 at ([0-9.]+) of (\d+)"
                      r" calibration positions", message)
    assert match, message
    assert float(match.group(1)) < 0.9 and int(match.group(2)) > 10
    assert "auto" in message


def test_gemma_auto_falls_back_to_f16_and_says_so(gemma_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    with pipeline(gemma_path, [9], tmp_path_factory.mktemp("wire"), "auto") as stages:
        ready = stages.ready["stage0"]["wire"]
        status = asyncio.run(status_of(stages))
    assert ready["asked"] == "auto" and ready["used"] == "f16" and ready["certified"]
    assert ready["agreement"]["q8"] < 0.9 <= ready["agreement"]["f16"]
    assert status.wire is not None and status.wire.used is WireDtype.F16
    assert [d for d, _ in status.wire.tried] == [WireDtype.Q8, WireDtype.F16]


def test_tiny_gemma3_q8_is_certified_on_every_link(tiny_model: Callable[..., Path],
                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    with pipeline(tiny_model("gemma3"), [2, 4], tmp_path_factory.mktemp("wire"), "q8") as stages:
        ready = stages.ready["stage0"]["wire"]
        middle = read_events(stages.log_path("stage1"))
    assert ready == {"asked": "q8", "used": "q8", "agreement": {"q8": 1.0}, "positions": ready["positions"],
                     "certified": True}
    assert ready["positions"] > 0
    switched = [e["activation_dtype"] for e in middle if e.get("event") == "wire_changed" and e.get("whole_chain")]
    assert switched == ["f32", "q8"]  # the reference round in f32, then the asked format, on the middle link too


@pytest.mark.gemma
@pytest.mark.parametrize(("model", "splits"), [("qwen05b_path", [12]), ("qwen15b_path", [14])], ids=["qwen05b", "qwen15b"])
def test_qwen_coder_auto_serves_a_certified_format(request: pytest.FixtureRequest,
                                                   tmp_path_factory: pytest.TempPathFactory, model: str,
                                                   splits: list[int]) -> None:
    """Real weights: `auto` certifies q8 or falls back to f16, and the format served passed on this split."""
    with pipeline(request.getfixturevalue(model), splits, tmp_path_factory.mktemp("wire"), "auto") as stages:
        ready = stages.ready["stage0"]["wire"]
        status = asyncio.run(status_of(stages))
    assert ready["asked"] == "auto" and ready["certified"] and ready["positions"] > 10, ready
    assert ready["used"] in ("q8", "f16") and ready["agreement"][ready["used"]] >= MIN_AGREEMENT, ready
    assert status.wire is not None and status.wire.used.value == ready["used"]
