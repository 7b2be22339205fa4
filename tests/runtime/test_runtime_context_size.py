"""A stage's context and KV pool: by default the model's trained context, bounded by memory, shared by the lanes.

A tiny model written with a 32k trained context gets a 32k context and one pool of a context per lane (its KV is
tiny, so memory does not bound it); the llama.cpp context is that pool. The sizing rule itself is checked on
numbers: memory bounds both, `--deterministic` keeps a context per lane (smaller), a pool given bounds the
default context, a pool smaller than a context given is refused, a slice sizes its pool as the whole model, and
`skippy up` planning for hosts bounds them by the smallest host's memory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import llama_cpp as L
import pytest

from skippy.cli.main import build_parser
from skippy.cli.plan import hosts_memory
from skippy.runtime.context_size import (
    ContextSize,
    flag_context,
    n_ctx_train,
    size_context,
    sized_spec,
    whole_model_cell_bytes,
)
from skippy.runtime.errors import RuntimeUsageError
from skippy.runtime.slices import ensure_slice
from skippy.runtime.spec import RuntimeSpec
from skippy.runtime.stage_runtime import StageRuntime

TRAINED = 32768
GIB = 1 << 30


def test_the_default_context_is_the_trained_one_and_the_pool_one_context_a_lane(tiny_model: Callable[..., Path]) -> None:
    model = tiny_model("llama", n_ctx_train=TRAINED)
    runtime = StageRuntime(RuntimeSpec(model, 0, 6, ctx_size=0, lane_count=2))
    try:
        assert (runtime.spec.ctx_size, runtime.spec.kv_pool_cells) == (TRAINED, 2 * TRAINED)
        assert L.llama_n_ctx(runtime.ctx.ptr) == 2 * TRAINED  # the lanes' one pool
        assert runtime.prefix is None and runtime.params.n_ctx == 2 * TRAINED
    finally:
        runtime.close()


def test_deterministic_keeps_a_context_per_lane(tiny_model: Callable[..., Path]) -> None:
    model = tiny_model("llama", n_ctx_train=2048)
    spec = sized_spec(RuntimeSpec(model, 0, 0, ctx_size=0, lane_count=2, deterministic=True))
    assert (spec.ctx_size, spec.kv_pool_cells) == (2048, 4096)
    runtime = StageRuntime(RuntimeSpec(model, 0, 6, ctx_size=256, lane_count=2, deterministic=True))
    try:
        assert runtime.lanes is not None
        assert [L.llama_n_ctx(ctx.ptr) for ctx in runtime.lanes.contexts] == [512, 512]  # 257 cells, padded to 256s
    finally:
        runtime.close()


@pytest.mark.parametrize(("memory", "lanes", "given", "want"), [
    (64 * GIB, 4, {}, (TRAINED, 4 * TRAINED)),  # memory allows a context for every lane
    (8 * GIB, 4, {}, (TRAINED, 87296)),  # the pool is what 1/8 of the memory holds (in blocks of 256)
    (1 * GIB, 4, {}, (10752, 10752)),  # memory bounds the context too
    (64 * GIB, 4, {"ctx_size": 4096}, (4096, 16384)),
    (64 * GIB, 4, {"kv_pool_cells": 20000}, (20000, 20000)),  # a pool given bounds the default context
    (64 * GIB, 1, {"ctx_size": 40000}, (40000, 40000)),  # over the trained context: allowed, as llama-server does
    (8 * GIB, 4, {"per_lane": True}, (21824, 87296)),  # --deterministic: the budget's share of one lane each
])
def test_sizing(memory: int, lanes: int, given: dict[str, int], want: tuple[int, int]) -> None:
    size = size_context(TRAINED, 12288, memory, lanes, **given)  # Qwen2.5-Coder-0.5B's 12 KiB a token
    assert (size.ctx_size, size.kv_pool_cells) == want
    assert size.over_trained == (size.ctx_size > TRAINED)


def test_a_pool_smaller_than_a_context_is_refused() -> None:
    with pytest.raises(RuntimeUsageError, match=r"kv_pool_cells \(1000\) must hold at least one context"):
        size_context(TRAINED, 12288, 64 * GIB, 4, ctx_size=4096, kv_pool_cells=1000)


def test_a_slice_sizes_its_pool_as_the_whole_model(tiny_model: Callable[..., Path]) -> None:
    model = tiny_model("llama", n_ctx_train=TRAINED)
    whole = whole_model_cell_bytes(model, "f16", "f16")
    assert whole == 6 * 2 * 2 * 16 * 2  # 6 layers, K and V of 2 heads of 16, f16
    first = ensure_slice(model, 0, 3, final=False)
    assert whole_model_cell_bytes(first, "f16", "f16") == whole and n_ctx_train(first) == TRAINED
    assert isinstance(size_context(TRAINED, whole, GIB, 2), ContextSize)


def test_planned_hosts_bound_the_context_by_the_smallest_ones_memory(tiny_model: Callable[..., Path]) -> None:
    parse = build_parser().parse_args
    assert hosts_memory(parse(["up", "--stage-cpus", "0,1", "--host-mem-mb", "64"])) == 64 << 20
    assert hosts_memory(parse(["up", "--stage-cpus", "0,1"])) is None  # their memory unsaid: this machine's
    assert hosts_memory(parse(["up"])) is None
    model = tiny_model("llama", n_ctx_train=TRAINED)  # 768 KV bytes a token: 64 MiB / 8 holds 10922 of them
    size = flag_context(model, 2, 0, 0, False, 64 << 20)
    assert (size.ctx_size, size.kv_pool_cells) == (10752, 10752)
