"""Fixtures for the runtime tests: shared unsplit chains, split chains closed at teardown, fresh slice cache.

llama.cpp aborts the whole process on a failed GGML_ASSERT, which would take the pytest run down with
it. Non-final stages with several lanes are therefore first built once in a subprocess
(`non_final_probe`); if that crashes, the tests that need one fail with the reason instead.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from runtime_helpers import N_LAYER, tiny_spec
from skippy.runtime.chain import LocalChain
from skippy.runtime.stage_runtime import RuntimeSpec, StageRuntime


@pytest.fixture(scope="session", autouse=True)
def _fresh_slice_cache(skippy_cache_dir: Path) -> Path:
    return skippy_cache_dir


_PROBE = """
import sys
from skippy.runtime.stage_runtime import RuntimeSpec, StageRuntime
StageRuntime(RuntimeSpec(model_path=sys.argv[1], layer_start=0, layer_end=1, lane_count=int(sys.argv[2]),
                         ctx_size=64)).close()
"""


@pytest.fixture(scope="session")
def non_final_probe(tiny_model: Callable[..., Path]) -> Callable[[int], None]:
    """`check(lane_count)`: fail the test (instead of aborting pytest) if such a non-final stage crashes."""
    results: dict[int, subprocess.CompletedProcess[str]] = {}

    def check(lane_count: int) -> None:
        if lane_count not in results:
            results[lane_count] = subprocess.run(
                [sys.executable, "-c", _PROBE, str(tiny_model("llama")), str(lane_count)],
                capture_output=True, text=True, timeout=300,
            )
        done = results[lane_count]
        if done.returncode != 0:
            reason = next((ln for ln in done.stderr.splitlines() if "GGML_ASSERT" in ln or "Error" in ln), "")
            pytest.fail(
                f"building a non-final StageRuntime with lane_count={lane_count} kills the process "
                f"(exit {done.returncode}): {reason.strip() or done.stderr[-500:]}",
                pytrace=False,
            )

    return check


@pytest.fixture(scope="session")
def _shared_chains() -> Iterator[dict[str, LocalChain]]:
    chains: dict[str, LocalChain] = {}
    yield chains
    for chain in chains.values():
        chain.close()


@pytest.fixture(scope="session")
def unsplit_chain(tiny_model: Callable[..., Path], _shared_chains: dict[str, LocalChain]) -> Callable[[str], LocalChain]:
    """`unsplit_chain("qwen2")`: the whole tiny model (one LocalChain per family for the session)."""

    def get(family: str) -> LocalChain:
        if family not in _shared_chains:
            _shared_chains[family] = LocalChain(tiny_spec(tiny_model(family)))
        return _shared_chains[family]

    return get


@pytest.fixture(autouse=True)
def _no_leaked_sessions(_shared_chains: dict[str, LocalChain]) -> Iterator[None]:
    """Tests must release their sessions on the shared chains (a leak would change later batches)."""
    yield
    leaked = {}
    for family, chain in _shared_chains.items():
        for stage in chain.stages:
            if stage.active_sessions:
                leaked[family] = stage.active_sessions
                for sid in stage.active_sessions:
                    stage.release_session(sid)
    assert not leaked, f"test left sessions open on shared chains: {leaked}"


@pytest.fixture
def open_chain(non_final_probe: Callable[[int], None]) -> Iterator[Callable[..., LocalChain]]:
    """`open_chain(base, split_points)`: a LocalChain closed at teardown."""
    chains: list[LocalChain] = []

    def open_(base: RuntimeSpec, split_points: Sequence[int] = ()) -> LocalChain:
        if split_points and base.lane_count > 1:
            non_final_probe(base.lane_count)
        chain = LocalChain(base, split_points)
        chains.append(chain)
        return chain

    yield open_
    for chain in chains:
        chain.close()


@pytest.fixture
def open_stage(non_final_probe: Callable[[int], None]) -> Iterator[Callable[..., StageRuntime]]:
    """`open_stage(spec, n_layer=6)`: a StageRuntime closed at teardown (n_layer of the source model)."""
    stages: list[StageRuntime] = []

    def open_(spec: RuntimeSpec, n_layer: int = N_LAYER) -> StageRuntime:
        if spec.layer_end < n_layer and spec.lane_count > 1:
            non_final_probe(spec.lane_count)
        stage = StageRuntime(spec)
        stages.append(stage)
        return stage

    yield open_
    for stage in stages:
        stage.close()
