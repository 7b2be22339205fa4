"""Plain helpers for the pipeline tests: a pipeline of real stage processes, a driver in the test process.

A `Pipeline` is one model split at some layers: a topology on ipc:// endpoints in a short tmp dir,
stage processes 1..n (`skippy stage`, started downstream first by `StageProcesses`), and the
driver (stage 0) created in the test's event loop by `running_driver`. Everything runs with one
llama.cpp thread per process: the machine has two cores and several processes share them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from skippy.config import ServingOptions, parse_serving_args
from skippy.driver.driver import Driver
from skippy.driver.liveness import DEAD_AFTER_S
from skippy.driver.speculative.engine import Speculation
from skippy.launcher import StageProcesses, read_events, write_local_topology
from skippy.log import configure_logging
from skippy.protocol import TokenEvents
from skippy.runtime.chain import LocalChain
from skippy.runtime.models import resolve_model_path
from skippy.runtime.slices import read_model_info
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime
from skippy.testing.reference_runs import OpLog

N_THREADS = 1
TEST_TIMEOUT_S = 120.0  # whole-test bound: a hang fails instead of stalling the run
REQUEST_TIMEOUT_S = 60.0


def run(coro: Coroutine[Any, Any, Any], timeout: float = TEST_TIMEOUT_S) -> Any:
    """Run an async test body with an overall bound."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def n_layer_of(model: str | Path) -> int:
    return read_model_info(resolve_model_path(model)).n_layer


def random_prompt(n: int, seed: int, n_vocab: int) -> list[int]:
    """n deterministic token ids in [3, n_vocab) (skipping unk/bos/eos)."""
    return np.random.default_rng(seed).integers(3, n_vocab, n).tolist()


class Pipeline:
    """One model split at `splits`; stage processes 1..n, the driver's config at `configs[0]`."""

    def __init__(self, directory: Path, model: str | Path, splits: Sequence[int], *, lane_count: int = 4,
                 ctx_size: int = 256, stage_flags: Sequence[str] = (), env: dict[str, str] | None = None,
                 include_stage0: bool = False, extra: dict[str, object] | None = None) -> None:
        self.directory = directory
        self.model = model
        self.splits = list(splits)
        self.lane_count = lane_count
        self.ctx_size = ctx_size
        self.kv_pool_cells = int((extra or {}).get("kv_pool_cells", 0))  # type: ignore[call-overload]
        self.kv_cache: dict[str, Any] = dict((extra or {}).get("kv_cache") or {})  # type: ignore[call-overload]
        self.n_layer = n_layer_of(model)
        self.topology, self.configs = write_local_topology(
            directory, model, self.n_layer, self.splits, lane_count=lane_count, ctx_size=ctx_size,
            extra={"n_threads": N_THREADS, **(extra or {})},
        )
        self.run_dir = directory / "run"
        self.stages = StageProcesses(self.topology, self.configs, self.run_dir, flags=list(stage_flags),
                                     include_stage0=include_stage0, env=env)
        self.codes: dict[str, int | None] | None = None

    @property
    def stage_ids(self) -> list[str]:
        return [s.stage_id for s in self.stages.topology.stages]

    def endpoint(self, index: int) -> str:
        return self.stages.topology.stages[index].endpoint

    def start(self) -> Pipeline:
        self.stages.start()
        return self

    def stop(self) -> dict[str, int | None]:
        """SIGTERM every stage process (idempotent); returns exit codes by stage id."""
        if self.codes is None:
            self.codes = self.stages.stop()
        return self.codes

    def events(self, stage_id: str) -> list[dict[str, Any]]:
        return read_events(self.stages.log_path(stage_id))

    def stopped_line(self, stage_id: str) -> dict[str, Any]:
        stopped = [e for e in self.events(stage_id) if e.get("event") == "stopped"]
        assert stopped, f"{stage_id} logged no 'stopped' line; log tail: {self.log_tail(stage_id)}"
        return stopped[-1]

    def log_tail(self, stage_id: str, n: int = 5) -> str:
        try:
            lines = self.stages.log_path(stage_id).read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return " | ".join(lines[-n:])

    def driver_options(self, *flags: str) -> ServingOptions:
        return parse_serving_args(["--config", str(self.configs[0]), "--topology", str(self.topology), *flags])

    def reference_spec(self) -> RuntimeSpec:
        """The unsplit model as every stage runs it (lanes, context, KV pool, prefix cache bounds, default n_batch,
        threads)."""
        records = self.kv_cache.get("mode") in ("record", "lookup-record")
        return RuntimeSpec(model_path=resolve_model_path(self.model), layer_start=0, layer_end=0,
                           ctx_size=self.ctx_size, lane_count=self.lane_count, kv_pool_cells=self.kv_pool_cells,
                           n_threads=N_THREADS, prefix_entries=int(self.kv_cache.get("max_entries", 0)) if records else 0,
                           prefix_max_bytes=int(self.kv_cache.get("max_bytes", 0)))

    def reference_chain(self) -> LocalChain:
        return LocalChain(self.reference_spec())


@contextlib.asynccontextmanager
async def running_driver(pipe: Pipeline, *flags: str, max_iterations: int | None = None,
                         dead_after_s: float = DEAD_AFTER_S, speculation: Speculation | None = None,
                         max_waiting: int | None = None) -> AsyncIterator[Driver]:
    """A started Driver for `pipe` (stage 0 in this process) recording its ops (`driver.recorder`, an
    OpLog), closed with its runtime on exit."""
    configure_logging("summary", stream=sys.stderr, stage_id="stage0", role="test-driver")
    options = pipe.driver_options(*flags)
    runtime = StageRuntime(RuntimeSpec.from_stage_config(options.config))
    driver = Driver(options, runtime, max_iterations_in_flight=max_iterations, dead_after_s=dead_after_s,
                    speculation=speculation, max_waiting=max_waiting)
    driver.recorder = OpLog()
    try:
        await driver.start()
        yield driver
    finally:
        try:
            await driver.close()
        finally:
            runtime.close()


async def generate_then_release(driver: Driver, speculation: Speculation, prompt: Sequence[int],
                                max_tokens: int) -> list[int]:
    """One request's tokens, once its session is released (a global suffix index then holds it)."""
    tokens, _ = await asyncio.wait_for(driver.submit(list(prompt), max_tokens=max_tokens).collect(), 60)
    for _ in range(1000):  # bounded poll: the session's release submits it to the index
        if not speculation.sessions:
            break
        await asyncio.sleep(0.005)
    return list(tokens)


@dataclass
class Result:
    session_id: int
    tokens: list[int]
    final: TokenEvents


async def generate_each(driver: Driver, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
    """One request at a time (so every batch holds one session); each must finish by length."""
    out = []
    for prompt in prompts:
        tokens, final = await asyncio.wait_for(driver.submit(prompt, max_tokens=max_tokens).collect(),
                                               REQUEST_TIMEOUT_S)
        assert final.finish_reason == "length", final
        out.append(tokens)
    return out


def session_of(driver: Driver, request_id: str) -> int:
    """The session id the driver gave a request (read right after submit, while it is registered)."""
    seq = driver.table.get(request_id)
    assert seq is not None, f"request {request_id} is not live"
    return seq.session_id


async def generate_concurrently(driver: Driver, prompts: Sequence[Sequence[int]],
                                max_tokens: Sequence[int]) -> list[Result]:
    handles = [driver.submit(p, max_tokens=m) for p, m in zip(prompts, max_tokens)]
    sessions = [session_of(driver, h.request_id) for h in handles]
    done = await asyncio.wait_for(asyncio.gather(*(h.collect() for h in handles)), REQUEST_TIMEOUT_S)
    return [Result(s, tokens, final) for s, (tokens, final) in zip(sessions, done)]


def reference_generate(pipe: Pipeline, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
    """Greedy tokens of the unsplit model, prompts run one after another on a fresh chain."""
    chain = pipe.reference_chain()
    try:
        return [list(chain.generate(p, max_tokens)) for p in prompts]
    finally:
        chain.close()
