"""StageConfig as JSON: a config with every field set loads, dumps and round-trips unchanged; the
reference's serialised stage config is accepted whole; its load knobs reach the runtime spec."""

from __future__ import annotations

import json
from typing import Any

from config_helpers import reference_stage_config

from skippy.config import PeerConfig, SplitMode, StageConfig
from skippy.runtime.llama_model import ModelLoadParams
from skippy.runtime.spec import RuntimeSpec


def full_config_dict(stage_dict: dict[str, Any]) -> dict[str, Any]:
    """Every field set explicitly, in canonical (dumped) form."""
    return {
        **stage_dict,
        "model_path": "/models/tiny.gguf",
        "stage_id": "stage-1",
        "stage_index": 1,
        "layer_start": 4,
        "layer_end": 8,
        "ctx_size": 1024,
        "lane_count": 2,
        "kv_pool_cells": 4096,
        "n_batch": 512,
        "n_ubatch": 128,
        "n_threads": 3,
        "cache_type_k": "q8_0",
        "cache_type_v": "bf16",
        "flash_attn_type": "enabled",
        "load_mode": "artifact-slice",
        "filter_tensors_on_load": True,
        "native_mtp_enabled": False,
        "bind_addr": "tcp://0.0.0.0:19001",
        "upstream": {"stage_id": "stage-0", "stage_index": 0, "endpoint": "tcp://10.0.0.1:19000"},
        "downstream": {"stage_id": "stage-2", "stage_index": 2, "endpoint": "ipc:///tmp/s2"},
        "deterministic": False,
        "package_ref": "hf://org/model-layers:main",
        "manifest_sha256": "ab" * 32,
        "source_model_path": "/models/full.gguf",
        "source_model_sha256": "cd" * 32,
        "source_model_bytes": 123456,
        "materialized_path": "/var/cache/stage-1.gguf",
        "materialized_pinned": True,
        "projector_path": None,
        "n_gpu_layers": -1,
        "mmap": False,
        "mlock": True,
        "repack": False,
        "op_offload": False,
        "no_host_buffer": True,
        "check_tensors": True,
        "direct_io": False,
        "main_gpu": 1,
        "split_mode": "row",
        "kv_offload": False,
        "kv_unified": True,
        "swa_full": True,
        "cache_idle_slots": False,
        "resident_tensor_names": [],
        "selected_device": {"backend_device": "CUDA1", "stable_id": "gpu-uuid", "index": 1, "vram_bytes": 8 << 30},
        "kv_cache": {
            "mode": "disabled",
            "payload": "resident-kv",
            "max_entries": 8,
            "max_bytes": 1 << 30,
            "min_tokens": 16,
            "shared_prefix_stride_tokens": 64,
            "shared_prefix_record_limit": 1,
        },
    }


def test_load_dump_gives_the_same_json(write_json, stage_dict: dict[str, Any]) -> None:
    data = full_config_dict(stage_dict)
    path = write_json("stage1.json", data)
    config = StageConfig.load(path)
    assert config.to_dict() == data
    assert json.loads(config.to_json()) == data
    assert config.upstream == PeerConfig("stage-0", 0, "tcp://10.0.0.1:19000")
    assert not config.is_first and not config.is_final


def test_round_trip_from_dict(stage_dict: dict[str, Any]) -> None:
    for data in (stage_dict, full_config_dict(stage_dict)):
        config = StageConfig.from_dict(data)
        assert StageConfig.from_dict(config.to_dict()) == config
        assert StageConfig.from_json(config.to_json()) == config




def test_reference_stage_config_is_accepted_whole(write_json) -> None:
    data = reference_stage_config()
    config = StageConfig.load(write_json("stage.json", data))
    assert config.n_gpu_layers == -1 and config.repack is False and config.filter_tensors_on_load is True
    assert config.split_mode is SplitMode.AUTO and config.bind_addr == "tcp://127.0.0.1:0"
    dumped = config.to_dict()
    assert set(dumped) == set(data) | {"n_threads", "deterministic", "kv_pool_cells"}  # skippy's own (null, false, 0)
    assert {k: v for k, v in dumped.items() if k != "bind_addr"} == {
        **{k: v for k, v in data.items() if k != "bind_addr"}, "n_threads": None, "deterministic": False,
        "kv_pool_cells": 0}


def test_reference_config_knobs_reach_the_runtime_spec(stage_dict: dict[str, Any]) -> None:
    data = full_config_dict(stage_dict)
    spec = RuntimeSpec.from_stage_config(StageConfig.from_dict({**data, "model_path": None}))
    assert spec.model_path == "/models/full.gguf"  # source_model_path stands in for a null model_path
    assert spec.load == ModelLoadParams(
        n_gpu_layers=-1, main_gpu=1, split_mode="row", device="CUDA1", mmap=False, mlock=True,
        direct_io=False, repack=False, no_host=True, check_tensors=True,
    )
    assert (spec.kv_offload, spec.op_offload) == (False, False)
    assert (spec.source_sha256, spec.source_bytes) == ("cd" * 32, 123456)
