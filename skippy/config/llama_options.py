"""The llama.cpp load and context knobs of a StageConfig, and their rules.

A StageConfig carries llama-server style knobs (`n_gpu_layers`, `mmap`, `repack`,
`kv_unified`, ...). Each is honoured where llama.cpp has it; a value that would break what skippy
relies on is refused here with one line saying why, before anything loads. `None` always means
"llama.cpp's default".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from skippy.config.errors import FieldError
from skippy.config.schema import ConfigModel, SignedInt, check

LLAMA_MAX_SEQ = 256  # llama.cpp's limit on sequences per context (lanes + prefix cache entries)

__all__ = ["SelectedDevice", "SignedInt", "SplitMode", "check_llama_fields", "check_unsupported_fields"]

class SplitMode(enum.StrEnum):
    """How llama.cpp spreads a model over several GPUs (`auto` = llama.cpp's default, layer)."""

    AUTO = "auto"
    NONE = "none"
    LAYER = "layer"
    ROW = "row"
    TENSOR = "tensor"


@dataclass(frozen=True, kw_only=True)
class SelectedDevice(ConfigModel):
    """The ggml backend device a stage offloads to (e.g. `CUDA0`, `Vulkan0`, `CPU`)."""

    backend_device: str
    stable_id: str | None = None  # metadata: the mesh's identity of the device
    index: int | None = None  # metadata: the device's index in the mesh's inventory
    vram_bytes: int | None = None  # metadata: the device's memory as the mesh measured it

    def _check(self) -> None:
        check(self.backend_device.strip() != "", "backend_device", "must not be empty")


def check_llama_fields(config: Any) -> None:
    """Value rules for the llama.cpp knobs of ``config`` (a StageConfig)."""
    check(
        config.kv_unified is not False,
        "kv_unified",
        "false is not supported: skippy batches many sessions in one decode and needs a unified KV"
        " cache so llama.cpp keeps rows in batch order (captured activations line up with inputs)",
    )
    check(
        config.swa_full is not False,
        "swa_full",
        "false is not supported: positions are authoritative, so a session must be trimmable at any"
        " position (rejected drafts, retried windows), which needs the full-size sliding-window cache",
    )
    if config.kv_cache is not None and config.kv_cache.should_record:
        entries = config.kv_cache.max_entries
        check(config.lane_count + entries <= LLAMA_MAX_SEQ, "kv_cache.max_entries",
              f"lane_count + max_entries must be <= {LLAMA_MAX_SEQ} (each entry is a llama.cpp sequence), got"
              f" {config.lane_count} + {entries}")
    if config.direct_io:
        check(config.mmap is not True, "direct_io", "cannot be combined with mmap: true (pick one load mode)")
        check(not config.mlock, "direct_io", "cannot be combined with mlock: true (pick one load mode)")


def check_unsupported_fields(config: Any) -> None:
    """Fields whose feature skippy does not have yet: refused instead of silently ignored."""
    check(
        config.projector_path is None,
        "projector_path",
        "multimodal projectors are not supported (skippy serves text models)",
    )
    check(
        len(config.resident_tensor_names) == 0,
        "resident_tensor_names",
        "layer-package graph bindings are not supported (use load_mode runtime-slice or artifact-slice)",
    )
    check(
        not config.cache_idle_slots,
        "cache_idle_slots",
        "true is not supported (a finished session's KV is not kept; the prefix cache, kv_cache, keeps"
        " prompt prefixes instead)",
    )
    kv_cache = config.kv_cache
    if kv_cache is not None and kv_cache.should_record and kv_cache.payload.value not in ("auto", "resident-kv"):
        raise FieldError(
            "kv_cache.payload",
            f"'{kv_cache.payload.value}' is not supported: skippy serves attention-only models, whose prefix"
            " cache keeps resident KV ('auto' or 'resident-kv')",
        )


DETERMINISTIC_MAX_UBATCH = 63  # llama.cpp's CPU flash attention takes its tiled kernel from 64 query rows


def check_deterministic(config: Any) -> None:
    """`deterministic: true` (`--deterministic`): refuse what would make a row's result depend on its batch."""
    check(str(config.flash_attn_type) != "disabled", "flash_attn_type",
          "'disabled' cannot be deterministic: llama.cpp's attention without flash attention rounds a row"
          " differently by what else is in its batch (docs/deterministic.md); use auto or enabled")
    check(int(config.n_gpu_layers) == 0, "n_gpu_layers",
          "deterministic mode is for the CPU backend only (GPU kernels are not checked for batch invariance)")
    check(config.n_ubatch is None or config.n_ubatch <= DETERMINISTIC_MAX_UBATCH, "n_ubatch",
          f"must be <= {DETERMINISTIC_MAX_UBATCH} with deterministic: llama.cpp's CPU flash attention switches"
          " to a tiled kernel at 64 rows")
    check(config.kv_pool_cells == 0, "kv_pool_cells", "not with deterministic: every lane has a context of its"
          " own (ctx_size cells), no shared pool")
