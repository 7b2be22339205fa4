"""StageConfig: defaults, value rules, endpoints and errors (JSON round trip: test_config_stage_json)."""

from __future__ import annotations

from typing import Any

import pytest

from skippy.config import (
    ConfigError,
    FlashAttnType,
    KvCacheConfig,
    KvCacheMode,
    KvCachePayload,
    KvCacheType,
    LoadMode,
    PeerConfig,
    StageConfig,
)


def test_defaults(stage_dict: dict[str, Any]) -> None:
    config = StageConfig.from_dict(stage_dict)
    assert config.model_path is None
    assert config.ctx_size == 0  # the model's trained context, bounded by memory (skippy.runtime.context_size)
    assert config.lane_count == 4 and config.kv_pool_cells == 0
    assert (config.n_batch, config.n_ubatch, config.n_threads) == (None, None, None)
    assert config.cache_type_k is KvCacheType.F16 and config.cache_type_v is KvCacheType.F16
    assert config.flash_attn_type is FlashAttnType.AUTO
    assert config.load_mode is LoadMode.RUNTIME_SLICE
    assert config.filter_tensors_on_load is False
    assert config.native_mtp_enabled is True
    assert config.upstream is None and config.downstream is None and config.kv_cache is None
    assert config.is_first and config.is_final


def test_kv_cache_defaults() -> None:
    kv = KvCacheConfig()
    assert kv.mode is KvCacheMode.AUTO and kv.payload is KvCachePayload.AUTO
    assert (kv.max_entries, kv.max_bytes, kv.min_tokens) == (64, 0, 64)
    assert (kv.shared_prefix_stride_tokens, kv.shared_prefix_record_limit) == (128, 2)
    assert not kv.should_lookup and not kv.should_record
    lookup = KvCacheConfig(mode=KvCacheMode.LOOKUP_RECORD)
    assert lookup.should_lookup and lookup.should_record
    assert KvCacheConfig(mode="record").should_record  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["record", "lookup-record"])
def test_kv_cache_modes_that_keep_prefixes_are_accepted(stage_dict: dict[str, Any], mode: str) -> None:
    config = StageConfig.from_dict({**stage_dict, "kv_cache": {"mode": mode, "payload": "resident-kv"}})
    assert config.kv_cache is not None and config.kv_cache.should_record


def test_model_path_default_marker_is_stored(stage_dict: dict[str, Any]) -> None:
    assert StageConfig.from_dict({**stage_dict, "model_path": "default"}).model_path == "default"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("127.0.0.1:19000", "tcp://127.0.0.1:19000"),
        ("tcp://127.0.0.1:0", "tcp://127.0.0.1:0"),
        ("tcp://*:*", "tcp://*:*"),
        ("[::1]:5555", "tcp://[::1]:5555"),
        ("ipc:///tmp/skippy-0", "ipc:///tmp/skippy-0"),
        ("inproc://stage0", "inproc://stage0"),
    ],
)
def test_bind_addr_normalised(stage_dict: dict[str, Any], given: str, expected: str) -> None:
    assert StageConfig.from_dict({**stage_dict, "bind_addr": given}).bind_addr == expected


@pytest.mark.parametrize(
    "bad",
    ["", "localhost", "udp://1.2.3.4:5", "tcp://host:70000", "tcp://host:x", "::1:5555", "ipc://"],
)
def test_bad_bind_addr(stage_dict: dict[str, Any], bad: str) -> None:
    with pytest.raises(ConfigError, match=r"^s\.json: field 'bind_addr' "):
        StageConfig.from_dict({**stage_dict, "bind_addr": bad}, "s.json")


@pytest.mark.parametrize("bad", ["tcp://10.0.0.1:0", "tcp://*:19000", "tcp://10.0.0.1:*"])
def test_peer_endpoint_must_be_connectable(stage_dict: dict[str, Any], bad: str) -> None:
    peer = {"stage_id": "stage-1", "stage_index": 1, "endpoint": bad}
    with pytest.raises(ConfigError, match=r"s\.json: field 'downstream\.endpoint' "):
        StageConfig.from_dict({**stage_dict, "downstream": peer}, "s.json")


def test_peer_endpoint_bare_host_port_normalised() -> None:
    assert PeerConfig("s", 1, "10.0.0.2:19001").endpoint == "tcp://10.0.0.2:19001"


@pytest.mark.parametrize(
    ("override", "field", "fragment"),
    [
        ({"lane_count": 0}, "lane_count", "must be > 0, got 0"),
        ({"ctx_size": -1}, "ctx_size", "must be a non-negative integer, got -1"),  # 0: the default
        ({"kv_pool_cells": -2}, "kv_pool_cells", "must be a non-negative integer, got -2"),
        ({"ctx_size": 512, "kv_pool_cells": 256}, "kv_pool_cells", "must hold at least one context (ctx_size 512)"),
        ({"n_batch": 0}, "n_batch", "must be > 0, got 0"),
        ({"n_ubatch": 0}, "n_ubatch", "must be > 0, got 0"),
        ({"n_threads": 0}, "n_threads", "must be > 0, got 0"),
        ({"n_batch": 64, "n_ubatch": 128}, "n_ubatch", "must be <= n_batch (64), got 128"),
        ({"layer_start": 4, "layer_end": 4}, "layer_end", "must be > layer_start (4), got 4"),
        ({"layer_start": 5, "layer_end": 2}, "layer_end", "must be > layer_start (5), got 2"),
        ({"layer_start": -1}, "layer_start", "must be a non-negative integer, got -1"),
        ({"stage_index": -1}, "stage_index", "must be a non-negative integer, got -1"),
        ({"model_id": ""}, "model_id", "must not be empty"),
        ({"stage_id": "  "}, "stage_id", "must not be empty"),
        ({"cache_type_k": "q3_k"}, "cache_type_k", "must be one of 'f32', 'f16'"),
        ({"cache_type_v": "int8"}, "cache_type_v", "must be one of 'f32', 'f16'"),
        ({"flash_attn_type": "on"}, "flash_attn_type", "must be one of 'auto'"),
        ({"load_mode": "packed"}, "load_mode", "must be one of 'runtime-slice'"),
        ({"load_mode": "layer-package"}, "load_mode", "'layer-package' is not supported"),
        ({"kv_unified": False}, "kv_unified", "false is not supported: skippy batches many sessions"),
        ({"swa_full": False}, "swa_full", "false is not supported: positions are authoritative"),
        ({"projector_path": "/m/mmproj.gguf"}, "projector_path", "multimodal projectors are not supported"),
        ({"resident_tensor_names": ["blk.0.attn_q.weight"]}, "resident_tensor_names", "layer-package graph"),
        ({"cache_idle_slots": True}, "cache_idle_slots", "true is not supported (a finished session's KV"),
        ({"kv_cache": {"mode": "record", "payload": "full-state"}}, "kv_cache.payload", "'full-state' is not"),
        ({"kv_cache": {"mode": "lookup-record", "payload": "kv-recurrent"}}, "kv_cache.payload",
         "'kv-recurrent' is not supported"),
        ({"kv_cache": {"mode": "lookup-record", "max_entries": 253}}, "kv_cache.max_entries",
         "lane_count + max_entries must be <= 256"),
        ({"direct_io": True, "mmap": True}, "direct_io", "cannot be combined with mmap: true"),
        ({"direct_io": True, "mlock": True}, "direct_io", "cannot be combined with mlock: true"),
        ({"split_mode": "graph"}, "split_mode", "must be one of 'auto', 'none', 'layer', 'row', 'tensor'"),
        ({"selected_device": {"backend_device": " "}}, "selected_device.backend_device", "must not be empty"),
        ({"n_gpu_layers": "all"}, "n_gpu_layers", "must be an integer, got \"all\""),
        ({"source_model_bytes": -5}, "source_model_bytes", "must be a non-negative integer or null"),
        ({"kv_cache": {"mode": "sometimes"}}, "kv_cache.mode", "must be one of 'disabled'"),
        ({"kv_cache": {"max_entries": 0}}, "kv_cache.max_entries", "must be > 0, got 0"),
    ],
)
def test_value_rules(stage_dict: dict[str, Any], override: dict, field: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        StageConfig.from_dict({**stage_dict, **override}, "configs/stage0.json")
    assert str(info.value).startswith(f"configs/stage0.json: field '{field}' {fragment}")


def test_lane_count_message_exact(stage_dict: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as info:
        StageConfig.from_dict({**stage_dict, "lane_count": 0}, "configs/stage0.json")
    assert str(info.value) == "configs/stage0.json: field 'lane_count' must be > 0, got 0"


@pytest.mark.parametrize(
    ("override", "field", "fragment"),
    [
        ({"lane_count": "4"}, "lane_count", 'must be a non-negative integer, got "4"'),
        ({"lane_count": 4.0}, "lane_count", "must be a non-negative integer, got 4.0"),
        ({"lane_count": True}, "lane_count", "must be a non-negative integer, got true"),
        ({"native_mtp_enabled": 1}, "native_mtp_enabled", "must be a boolean, got 1"),
        ({"model_id": 7}, "model_id", "must be a string, got 7"),
        ({"n_batch": "big"}, "n_batch", "must be a non-negative integer or null"),
        ({"upstream": "stage-0"}, "upstream", "must be a JSON object or null"),
        ({"kv_cache": []}, "kv_cache", "must be a JSON object or null, got []"),
    ],
)
def test_wrong_types(stage_dict: dict[str, Any], override: dict, field: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=f"^s.json: field '{field}' ") as info:
        StageConfig.from_dict({**stage_dict, **override}, "s.json")
    assert fragment in str(info.value)


def test_unknown_keys_rejected_at_every_level(write_json, stage_dict: dict[str, Any]) -> None:
    path = write_json("stage.json", {**stage_dict, "lane_cout": 4})
    with pytest.raises(
        ConfigError, match=r"stage\.json: field 'lane_cout' is not a known StageConfig"
    ):
        StageConfig.load(path)
    peer = {"stage_id": "s1", "stage_index": 1, "endpoint": "h:1", "host": "h"}
    with pytest.raises(ConfigError, match=r"field 'downstream.host' is not a known PeerConfig"):
        StageConfig.from_dict({**stage_dict, "downstream": peer})
    with pytest.raises(ConfigError, match=r"field 'kv_cache.size' is not a known KvCacheConfig"):
        StageConfig.from_dict({**stage_dict, "kv_cache": {"size": 1}})


@pytest.mark.parametrize("missing", ["run_id", "model_id", "layer_end", "load_mode", "bind_addr"])
def test_missing_required_field(write_json, stage_dict: dict[str, Any], missing: str) -> None:
    del stage_dict[missing]
    path = write_json("stage.json", stage_dict)
    with pytest.raises(ConfigError) as info:
        StageConfig.load(path)
    assert str(info.value) == f"{path}: field '{missing}' is required"


def test_missing_required_nested_field(stage_dict: dict[str, Any]) -> None:
    peer = {"stage_id": "s1", "stage_index": 1}
    with pytest.raises(ConfigError, match=r"field 'downstream.endpoint' is required"):
        StageConfig.from_dict({**stage_dict, "downstream": peer})


def test_peer_indices_must_point_the_right_way(stage_dict: dict[str, Any]) -> None:
    up = {"stage_id": "x", "stage_index": 0, "endpoint": "h:1"}
    with pytest.raises(
        ConfigError, match=r"field 'upstream.stage_index' must be < stage_index \(0\)"
    ):
        StageConfig.from_dict({**stage_dict, "upstream": up})
    down = {"stage_id": "x", "stage_index": 0, "endpoint": "h:1"}
    with pytest.raises(
        ConfigError, match=r"field 'downstream.stage_index' must be > stage_index \(0\)"
    ):
        StageConfig.from_dict({**stage_dict, "downstream": down})


def test_direct_construction_validates_and_coerces() -> None:
    config = StageConfig(
        run_id="r",
        topology_id="t",
        model_id="m",
        stage_id="s",
        stage_index=0,
        layer_start=0,
        layer_end=1,
        load_mode="artifact-slice",  # type: ignore[arg-type]
        bind_addr="localhost:7000",
        kv_cache={"mode": "disabled"},  # type: ignore[arg-type]
    )
    assert config.load_mode is LoadMode.ARTIFACT_SLICE
    assert config.kv_cache == KvCacheConfig(mode=KvCacheMode.DISABLED)
    assert config.bind_addr == "tcp://localhost:7000"
    with pytest.raises(ConfigError, match=r"^field 'lane_count' must be > 0, got 0$"):
        StageConfig(**{**config.to_dict(), "lane_count": 0})


def test_config_is_frozen(stage_dict: dict[str, Any]) -> None:
    config = StageConfig.from_dict(stage_dict)
    with pytest.raises(AttributeError):
        config.lane_count = 8  # type: ignore[misc]
