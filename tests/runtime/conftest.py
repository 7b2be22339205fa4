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
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime


@pytest.fixture(scope="session", autouse=True)
def _fresh_slice_cache(skippy_cache_dir: Path) -> Path:
    return skippy_cache_dir


_PROBE = """
import sys
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime
path, lanes, end, outputs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
StageRuntime(RuntimeSpec(model_path=path, layer_start=0, layer_end=end, lane_count=lanes, ctx_size=64,
                         n_outputs_max=outputs or None)).close()
"""


@pytest.fixture(scope="session")
def non_final_probe(tiny_model: Callable[..., Path]) -> Callable[..., None]:
    """`check(lane_count, layer_end=1, n_outputs_max=0)`: build that stage of the tiny llama in a
    subprocess (once); fail the test, instead of aborting pytest, if that kills the process."""
    results: dict[tuple[int, int, int], subprocess.CompletedProcess[str]] = {}

    def check(lane_count: int, layer_end: int = 1, n_outputs_max: int = 0) -> None:
        key = (lane_count, layer_end, n_outputs_max)
        if key not in results:
            results[key] = subprocess.run(
                [sys.executable, "-c", _PROBE, str(tiny_model("llama")), *map(str, key)],
                capture_output=True, text=True, timeout=300,
            )
        done = results[key]
        if done.returncode != 0:
            reason = next((ln for ln in done.stderr.splitlines() if "GGML_ASSERT" in ln or "Error" in ln), "")
            kind = "final" if layer_end == N_LAYER else "non-final"
            pytest.fail(
                f"building a {kind} StageRuntime with lane_count={lane_count}, n_outputs_max={n_outputs_max or None} "
                f"kills the process (exit {done.returncode}): {reason.strip() or done.stderr[-500:]}",
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
def open_chain(non_final_probe: Callable[..., None]) -> Iterator[Callable[..., LocalChain]]:
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
def open_stage(non_final_probe: Callable[..., None]) -> Iterator[Callable[..., StageRuntime]]:
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
