"""Names the config tests share: the types of the ``serve`` fixtures (tests/config/conftest.py), the
flag that turns stage 0's OpenAI front on, and the reference's serialised stage config."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from skippy.config import ServingOptions

Serve = Callable[..., ServingOptions]  # serve(*flags, stage={...overrides}) -> resolved options
ServeError = Callable[..., str]  # serve_error(*flags, stage=...) -> the one-line ConfigError message
OPENAI = ("--openai-bind-addr", "127.0.0.1:9337")


def reference_stage_config() -> dict[str, Any]:
    """The seed's `stage_config()` test fixture, as the reference serialises it (every field)."""
    return {
        "run_id": "run", "topology_id": "topology", "model_id": "model",
        "package_ref": None, "manifest_sha256": None,
        "source_model_path": None, "source_model_sha256": None, "source_model_bytes": None,
        "materialized_path": None, "materialized_pinned": False,
        "model_path": "/tmp/model.gguf", "projector_path": None,
        "stage_id": "stage-0", "stage_index": 0, "layer_start": 0, "layer_end": 4,
        "ctx_size": 512, "lane_count": 1, "n_batch": None, "n_ubatch": None,
        "n_gpu_layers": -1, "mmap": None, "mlock": False, "repack": False, "op_offload": None,
        "no_host_buffer": False, "check_tensors": False, "direct_io": False, "main_gpu": None,
        "split_mode": "auto", "cache_type_k": "f16", "cache_type_v": "f16", "flash_attn_type": "auto",
        "kv_offload": None, "kv_unified": None, "swa_full": None, "cache_idle_slots": None,
        "filter_tensors_on_load": True, "resident_tensor_names": [], "selected_device": None,
        "kv_cache": None, "native_mtp_enabled": True, "load_mode": "runtime-slice",
        "bind_addr": "127.0.0.1:0", "upstream": None, "downstream": None,
    }
