"""Fixtures for the broker tests: tiny-model pipelines of real stage processes (stage 0 included).

`make_pipeline()` writes a 2-stage topology (tiny llama, 6 layers split at 3, 2 lanes) in a
fresh short tmp dir and starts both stages; `shared_pipeline` is one such pipeline for the whole
module.  Stages run with a 5 ms downstream wire delay so a token takes >= 5 ms whatever the
machine: "long" requests then reliably outlast the admission timeouts the tests use.  Every
stage is stopped at teardown (StageProcesses), even when the test failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from broker_helpers import PipelineProcs

from skippy.launcher import StageProcesses, write_local_topology

WIRE_FLAGS = ("--downstream-wire-delay-ms", "5")


@pytest.fixture(scope="session", autouse=True)
def _fresh_slice_cache(skippy_cache_dir: Path) -> Path:
    """SKIPPY_CACHE_DIR set before any stage process is started (they inherit it)."""
    return skippy_cache_dir


def _start(directory: Path, model: Path, *flags: str, deterministic: bool = False) -> PipelineProcs:
    topology, configs = write_local_topology(directory, model, 6, [3], lane_count=2, ctx_size=512,
                                             extra={"n_threads": 1, "deterministic": deterministic})
    stages = StageProcesses(topology, configs, directory / "run", flags=(*WIRE_FLAGS, *flags), include_stage0=True)
    return PipelineProcs(topology, stages.start())


@pytest.fixture(scope="module")
def shared_pipeline(tmp_path_factory: pytest.TempPathFactory,
                    tiny_model: Callable[..., Path]) -> Iterator[PipelineProcs]:
    pipe = _start(tmp_path_factory.mktemp("pipe"), tiny_model("llama"))
    try:
        yield pipe
    finally:
        pipe.stages.stop()


@pytest.fixture
def make_pipeline(tmp_path_factory: pytest.TempPathFactory,
                  tiny_model: Callable[..., Path]) -> Iterator[Callable[..., PipelineProcs]]:
    """`make(*flags, deterministic=False)`: a fresh pipeline, its stages started with `flags` too (and
    `deterministic: true` in their configs: a row's result independent of its batch, docs/deterministic.md)."""
    started: list[PipelineProcs] = []

    def make(*flags: str, deterministic: bool = False) -> PipelineProcs:
        started.append(_start(tmp_path_factory.mktemp("pipe"), tiny_model("llama"), *flags,
                              deterministic=deterministic))
        return started[-1]

    yield make
    for pipe in started:
        pipe.stages.stop()
