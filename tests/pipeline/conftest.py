"""Fixtures for the pipeline tests: pipelines of real stage processes, always stopped at teardown.

`make_pipeline(model, splits, ...)` writes a topology in a fresh short tmp dir (ipc socket paths
must stay under 107 bytes) and starts stages 1..n downstream first; the test runs the driver itself
(`pipeline_helpers.running_driver`). At teardown every stage is SIGTERMed (then killed) even when
the test failed, and every process started must have exited.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pipeline_helpers import Pipeline


@pytest.fixture(scope="session", autouse=True)
def _fresh_slice_cache(skippy_cache_dir: Path) -> Path:
    """SKIPPY_CACHE_DIR set before any stage process is started (they inherit it)."""
    return skippy_cache_dir


@pytest.fixture
def make_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Pipeline]]:
    """`make_pipeline(model, splits, lane_count=4, ctx_size=256, stage_flags=(), start=True)`."""
    pipelines: list[Pipeline] = []

    def make(model: str | Path, splits: Sequence[int], *, start: bool = True, **kwargs: Any) -> Pipeline:
        pipe = Pipeline(tmp_path_factory.mktemp("pipe"), model, splits, **kwargs)
        pipelines.append(pipe)
        return pipe.start() if start else pipe

    yield make
    problems = []
    for pipe in pipelines:
        try:
            pipe.stop()
        except Exception as exc:  # noqa: BLE001 - keep stopping the others, report below
            problems.append(f"stopping {pipe.directory}: {exc!r}")
        finally:
            for stage_id, proc in pipe.stages.procs.items():
                if proc.poll() is None:  # stop() kills stragglers; this is the last resort
                    proc.kill()
                    proc.wait(10)
                    problems.append(f"{stage_id} of {pipe.directory} outlived stop()")
    assert not problems, problems
