"""How many KV cells a stage gets: each session's context (`ctx_size`) and the pool every lane shares.

The lanes share one llama.cpp context (its unified KV cache) of `kv_pool_cells` cells: a long request may hold
what idle lanes do not, and stage 0 admits a request only when the cells its prompt needs are free
(skippy.driver.cell_pool). `ctx_size` bounds one session: its prompt and generated tokens.

Defaults (a value of 0), decided from the model file and this host's memory, the same on every stage of a host:
- `ctx_size`: the model's trained context (its GGUF's `{arch}.context_length`, llama.cpp's n_ctx_train), at most
  what the memory budget holds (under `--deterministic`, where every lane has a context of its own, the budget's
  share of one lane);
- `kv_pool_cells`: a full context for every lane, at most the memory budget, never less than one context (a
  pool given bounds the default context too; a pool smaller than a context given is refused).
The memory budget is 1/KV_MEMORY_SHARE of the memory this process may use (its memory cgroup's limit, else
the host's RAM), in cells of the whole model's KV bytes per token at the cache types (`cell_bytes`). A context
above n_ctx_train is allowed, as llama-server allows it (llama.cpp warns of a possible training context
overflow): `over_trained` says so, and the stage logs it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from skippy.config.errors import ConfigError
from skippy.netns.cgroups import own_memory_limit
from skippy.runtime.errors import ModelError, RuntimeUsageError
from skippy.runtime.gguf_file import GGUFFile
from skippy.runtime.models import resolve_model_path
from skippy.runtime.prefix_cache import kv_layer_bytes
from skippy.runtime.spec import RuntimeSpec

__all__ = ["KV_MEMORY_SHARE", "ContextSize", "flag_context", "memory_limit", "n_ctx_train", "size_context", "sized_spec",
           "spec_context", "whole_model_cell_bytes"]

KV_MEMORY_SHARE = 8  # the KV pool's default takes at most 1/8 of the memory


@dataclass(frozen=True)
class ContextSize:
    ctx_size: int  # positions one session may hold (prompt and generated tokens)
    kv_pool_cells: int  # the cells every lane shares (under --deterministic: lanes x ctx_size, one context each)
    n_ctx_train: int
    cell_bytes: int  # KV bytes of one cell, every layer of the whole model
    budget_cells: int  # cells the memory budget holds

    @property
    def over_trained(self) -> bool:
        return 0 < self.n_ctx_train < self.ctx_size

    @property
    def pool_bytes(self) -> int:
        return self.kv_pool_cells * self.cell_bytes

    def describe(self, lane_count: int) -> str:
        trained = "the model's trained context" if self.ctx_size == self.n_ctx_train else f"trained: {self.n_ctx_train}"
        return (f"context {self.ctx_size} tokens a request ({trained}); KV pool {self.kv_pool_cells} cells for"
                f" {lane_count} lanes ({self.cell_bytes} bytes a token: {self.pool_bytes / 2**20:.0f} MiB over all stages)")

    def fields(self) -> dict[str, int]:
        """For the stage's log line."""
        return {"ctx_size": self.ctx_size, "kv_pool_cells": self.kv_pool_cells, "n_ctx_train": self.n_ctx_train,
                "kv_bytes_per_cell": self.cell_bytes, "kv_pool_mib": round(self.pool_bytes / 2**20)}


def memory_limit() -> int:
    """Bytes this process may use: its memory cgroup's limit, else the host's RAM."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = own_memory_limit()
    return ram if limit is None else min(limit, ram)


def n_ctx_train(path: Path) -> int:
    """The context the GGUF at `path` was trained with (`{arch}.context_length`; 0: it does not say)."""
    gguf = GGUFFile(path)
    try:
        value = gguf.get(f"{gguf.get('general.architecture')}.context_length")
    finally:
        gguf.close()
    return value if isinstance(value, int) and value > 0 else 0


def whole_model_cell_bytes(path: Path, cache_type_k: str, cache_type_v: str) -> int:
    """KV bytes of one token over every layer of the model `path` is (a slice: scaled to the model's layers, so
    every stage of a model sizes its pool alike)."""
    per_layer = kv_layer_bytes(path, cache_type_k, cache_type_v)
    gguf = GGUFFile(path)
    try:
        source_layers = gguf.get("skippy.slice.source_n_layer")
    finally:
        gguf.close()
    if isinstance(source_layers, int) and per_layer:
        return max(1, sum(per_layer) * source_layers // len(per_layer))
    return max(1, sum(per_layer))


def size_context(trained: int, cell_bytes: int, memory: int, lane_count: int, *, ctx_size: int = 0,
                 kv_pool_cells: int = 0, per_lane: bool = False) -> ContextSize:
    """The context and pool for these lanes (0: the default, see the module docstring)."""
    budget = max(256, memory // KV_MEMORY_SHARE // cell_bytes // 256 * 256)  # whole blocks of 256 cells
    if ctx_size <= 0 and trained <= 0:
        raise ModelError("the model's GGUF does not say the context it was trained with ({arch}.context_length):"
                         " set ctx_size")
    if ctx_size <= 0:
        ctx_size = max(1, min(trained, budget // lane_count if per_lane else budget, kv_pool_cells or trained))
    if per_lane:
        kv_pool_cells = lane_count * ctx_size
    elif kv_pool_cells <= 0:
        kv_pool_cells = min(lane_count * ctx_size, max(ctx_size, budget))
    elif kv_pool_cells < ctx_size:
        raise RuntimeUsageError(f"kv_pool_cells ({kv_pool_cells}) must hold at least one context (ctx_size {ctx_size})")
    return ContextSize(ctx_size, kv_pool_cells, trained, cell_bytes, budget)


def spec_context(spec: RuntimeSpec, memory: int | None = None) -> ContextSize:
    """`spec`'s context and pool, its defaults decided from its model file and `memory` (default: this host's)."""
    path = resolve_model_path(spec.model_path)
    return size_context(n_ctx_train(path), whole_model_cell_bytes(path, spec.cache_type_k, spec.cache_type_v),
                        memory or memory_limit(), spec.lane_count, ctx_size=spec.ctx_size,
                        kv_pool_cells=spec.kv_pool_cells, per_lane=spec.deterministic)


def flag_context(model: Path, lane_count: int, ctx_size: int, kv_pool_cells: int, deterministic: bool,
                 memory: int | None = None) -> ContextSize:
    """`--ctx-size` and `--kv-pool-cells` decided for `model` (ConfigError naming them when they cannot be);
    `memory`: the smallest host's, when the stages run elsewhere."""
    if ctx_size < 0 or kv_pool_cells < 0:
        raise ConfigError(f"--ctx-size and --kv-pool-cells must be >= 0 (0: the default), got {ctx_size} and {kv_pool_cells}")
    try:
        return spec_context(RuntimeSpec(model, 0, 0, ctx_size=ctx_size, lane_count=lane_count,
                                        kv_pool_cells=kv_pool_cells, deterministic=deterministic), memory)
    except RuntimeUsageError as error:
        raise ConfigError(f"--kv-pool-cells: {error}") from None


def sized_spec(spec: RuntimeSpec) -> RuntimeSpec:
    """`spec` with its context and pool decided (unchanged when both are given)."""
    if spec.ctx_size > 0 and (spec.kv_pool_cells > 0 or spec.deterministic):
        return replace(spec, kv_pool_cells=spec.lane_count * spec.ctx_size) if spec.deterministic else spec
    size = spec_context(spec)
    return replace(spec, ctx_size=size.ctx_size, kv_pool_cells=size.kv_pool_cells)
