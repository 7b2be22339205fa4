"""Serving options: CLI flags resolved against the stage config, and MTP source."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from skippy.config import (
    ConfigError,
    MtpSource,
    PrefillChunkOptions,
    ServingOptions,
    SpeculativeDecodeConfig,
    SpeculativeOptions,
    StageConfig,
    TelemetryLevel,
    WireCondition,
    add_serving_arguments,
    default_queue_capacity,
    parse_serving_args,
    resolve_mtp_source,
    resolve_serving_options,
)

Serve = Callable[..., ServingOptions]
OPENAI = ["--openai-bind-addr", "127.0.0.1:9337"]


@pytest.fixture
def serve(write_json, stage_dict: dict[str, Any]) -> Serve:
    """``serve(*flags, stage={...overrides})`` -> resolved options for a fresh config."""

    def run(*flags: str, stage: dict[str, Any] | None = None) -> ServingOptions:
        path = write_json("stage.json", {**stage_dict, **(stage or {})})
        return parse_serving_args(["--config", str(path), *flags])

    return run


def _error(serve: Serve, *flags: str, stage: dict[str, Any] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        serve(*flags, stage=stage)
    message = str(info.value)
    assert "\n" not in message
    return message


# -- stage-level flags -------------------------------------------------------


def test_defaults_without_openai(serve: Serve) -> None:
    options = serve()
    assert options.config.lane_count == 4
    assert options.topology is None
    assert options.bind_addr == "tcp://127.0.0.1:0"
    assert options.max_inflight == 4
    assert options.reply_credit_limit == 3
    assert options.async_prefill_forward is True
    assert options.wire == WireCondition() and options.wire.is_ideal
    assert options.downstream_connect_timeout_secs == 60.0
    assert options.telemetry_level is TelemetryLevel.SUMMARY
    assert options.telemetry_queue_capacity is None
    assert options.metrics_otlp_grpc is None
    assert options.prefill == PrefillChunkOptions()
    assert options.speculative == SpeculativeOptions()
    assert options.openai is None
    assert options.native_mtp_enabled is True


def test_stage_flags(serve: Serve) -> None:
    options = serve(
        "--bind-addr", "0.0.0.0:19005",
        "--max-inflight", "2",
        "--reply-credit-limit", "0",
        "--no-async-prefill-forward",
        "--downstream-wire-delay-ms", "12.5",
        "--downstream-wire-mbps", "100",
        "--downstream-connect-timeout-secs", "5",
        "--telemetry-level", "debug",
        "--telemetry-queue-capacity", "512",
        "--metrics-otlp-grpc", "http://127.0.0.1:4317",
    )  # fmt: skip
    assert options.bind_addr == "tcp://0.0.0.0:19005"
    assert (options.max_inflight, options.reply_credit_limit) == (2, 0)
    assert options.async_prefill_forward is False
    assert options.wire == WireCondition(delay_ms=12.5, mbps=100.0)
    assert options.downstream_connect_timeout_secs == 5.0
    assert options.telemetry_level is TelemetryLevel.DEBUG
    assert options.telemetry_queue_capacity == 512
    assert options.metrics_otlp_grpc == "http://127.0.0.1:4317"


def test_max_inflight_clamped_to_lane_count_and_credit_follows(serve: Serve) -> None:
    options = serve("--max-inflight", "16", stage={"lane_count": 2})
    assert options.max_inflight == 2
    assert options.reply_credit_limit == 1
    assert serve("--max-inflight", "1").reply_credit_limit == 0


def test_async_flag_wins_when_both_given(serve: Serve) -> None:
    options = serve("--async-prefill-forward", "--no-async-prefill-forward")
    assert options.async_prefill_forward is True


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--max-inflight", "0"], "--max-inflight must be > 0, got 0"),
        (["--max-inflight", "two"], "--max-inflight must be an integer, got 'two'"),
        (["--reply-credit-limit", "-1"], "--reply-credit-limit must be >= 0, got -1"),
        (
            ["--downstream-wire-delay-ms", "-1"],
            "--downstream-wire-delay-ms must be finite and >= 0, got -1",
        ),
        (
            ["--downstream-wire-delay-ms", "nan"],
            "--downstream-wire-delay-ms must be finite and >= 0, got nan",
        ),
        (
            ["--downstream-wire-delay-ms", "4000000"],
            "--downstream-wire-delay-ms must be finite and in [0, 3600000], got 4000000.0",
        ),
        (["--downstream-wire-mbps", "0"], "--downstream-wire-mbps must be finite and > 0, got 0"),
        (
            ["--downstream-wire-mbps", "inf"],
            "--downstream-wire-mbps must be finite and > 0, got inf",
        ),
        (
            ["--downstream-connect-timeout-secs", "-3"],
            "--downstream-connect-timeout-secs must be finite",
        ),
        (
            ["--telemetry-level", "loud"],
            "--telemetry-level must be one of off | summary | debug, got 'loud'",
        ),
        (["--bind-addr", "nowhere"], "--bind-addr must be host:port, got 'nowhere'"),
        (["--metrics-otlp-grpc", ""], "--metrics-otlp-grpc must be a non-empty string"),
        (["--telemetry-queue-capacity", "0"], "--telemetry-queue-capacity must be > 0, got 0"),
    ],
)
def test_bad_stage_flags(serve: Serve, flags: list[str], expected: str) -> None:
    assert _error(serve, *flags).startswith(expected)


def test_argparse_usage_errors_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--config"):
        parse_serving_args([])
    with pytest.raises(ConfigError, match="unrecognized arguments: --bogus"):
        parse_serving_args(["--config", "x.json", "--bogus"])


def test_bad_config_file_is_reported_with_its_path(write_json, stage_dict: dict[str, Any]) -> None:
    path = write_json("stage.json", {**stage_dict, "lane_count": 0})
    with pytest.raises(ConfigError) as info:
        parse_serving_args(["--config", str(path)])
    assert str(info.value) == f"{path}: field 'lane_count' must be > 0, got 0"
    with pytest.raises(ConfigError, match=r"missing.json: config file not found"):
        parse_serving_args(["--config", str(path.parent / "missing.json")])


def test_topology_is_loaded_and_checked(serve: Serve, write_json, make_topology) -> None:
    topo = write_json("topo.json", make_topology(2))
    options = serve("--topology", str(topo))
    assert options.topology is not None and options.topology.first().stage_id == "stage-0"
    message = _error(serve, "--topology", str(topo), stage={"layer_end": 5})
    assert message.endswith("field 'layer_end' is 5 but topology stage \"stage-0\" has 4")
    assert "stage.json: " in message


def test_add_serving_arguments_keeps_unset_distinguishable() -> None:
    parser = argparse.ArgumentParser()
    add_serving_arguments(parser)
    args = parser.parse_args(["--config", "c.json"])
    assert args.config == "c.json"
    assert args.max_inflight is None and args.openai_generation_concurrency is None
    assert args.async_prefill_forward is None and args.no_async_prefill_forward is None


def test_resolver_accepts_typed_namespace_values(write_json, stage_dict: dict[str, Any]) -> None:
    path = write_json("stage.json", stage_dict)
    args = argparse.Namespace(config=path, max_inflight=2, openai_bind_addr="127.0.0.1:0")
    options = resolve_serving_options(args)
    assert options.max_inflight == 2
    assert options.openai is not None and options.openai.bind_addr == "127.0.0.1:0"


# -- OpenAI front ---------------------------------------------------------------


def test_openai_defaults(serve: Serve) -> None:
    openai = serve(*OPENAI).openai
    assert openai is not None
    assert openai.bind_addr == "127.0.0.1:9337"
    assert openai.model_id == "tiny-model"
    assert openai.default_max_tokens == 16
    admission = openai.admission
    assert admission.generation_concurrency == 4
    assert admission.adaptive is False and admission.adaptive_min_concurrency is None
    assert admission.queue_capacity == 32
    assert admission.admission_timeout_secs == 0.0


@pytest.mark.parametrize(
    ("concurrency", "capacity"), [(1, 16), (2, 16), (4, 32), (32, 256), (64, 256)]
)
def test_default_queue_capacity(concurrency: int, capacity: int) -> None:
    assert default_queue_capacity(concurrency) == capacity


def test_concurrency_override_derives_queue_capacity(serve: Serve) -> None:
    admission = serve(*OPENAI, "--openai-generation-concurrency", "1").openai.admission  # type: ignore[union-attr]
    assert (admission.generation_concurrency, admission.queue_capacity) == (1, 16)
    assert admission.admission_timeout_secs == 0.0
    big = serve(*OPENAI, "--openai-generation-concurrency", "32", stage={"lane_count": 32})
    assert big.openai.admission.queue_capacity == 256  # type: ignore[union-attr]


def test_queue_capacity_override_keeps_concurrency(serve: Serve) -> None:
    admission = serve(*OPENAI, "--openai-generation-queue-capacity", "3").openai.admission  # type: ignore[union-attr]
    assert (admission.generation_concurrency, admission.queue_capacity) == (4, 3)
    assert admission.admission_timeout_secs == 0.0


def test_timeout_override_changes_nothing_else(serve: Serve) -> None:
    admission = serve(*OPENAI, "--openai-generation-admission-timeout-secs", "7.5").openai.admission  # type: ignore[union-attr]
    assert admission.admission_timeout_secs == 7.5
    assert (admission.generation_concurrency, admission.queue_capacity) == (4, 32)


def test_adaptive_concurrency(serve: Serve) -> None:
    admission = serve(*OPENAI, "--openai-adaptive-generation-concurrency").openai.admission  # type: ignore[union-attr]
    assert admission.adaptive and admission.adaptive_min_concurrency == 1
    admission = serve(
        *OPENAI,
        "--openai-adaptive-generation-concurrency",
        "--openai-adaptive-generation-min-concurrency", "3",
    ).openai.admission  # type: ignore[union-attr]  # fmt: skip
    assert admission.adaptive_min_concurrency == 3


def test_openai_overrides(serve: Serve) -> None:
    openai = serve(*OPENAI, "--openai-model-id", "served-name", "--openai-default-max-tokens", "64").openai
    assert openai is not None
    assert (openai.model_id, openai.default_max_tokens) == ("served-name", 64)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("--openai-generation-concurrency 0", "--openai-generation-concurrency must be > 0, got 0"),
        (
            "--openai-generation-concurrency 5",
            "--openai-generation-concurrency must be <= lane_count (4), got 5",
        ),
        (
            "--openai-generation-queue-capacity 0",
            "--openai-generation-queue-capacity must be > 0, got 0",
        ),
        (
            "--openai-generation-admission-timeout-secs -1",
            "--openai-generation-admission-timeout-secs must be finite and >= 0",
        ),
        (
            "--openai-adaptive-generation-min-concurrency 2",
            "--openai-adaptive-generation-min-concurrency requires"
            " --openai-adaptive-generation-concurrency",
        ),
        (
            "--openai-adaptive-generation-concurrency"
            " --openai-adaptive-generation-min-concurrency 5",
            "--openai-adaptive-generation-min-concurrency must be"
            " <= --openai-generation-concurrency (4), got 5",
        ),
        ("--openai-default-max-tokens 0", "--openai-default-max-tokens must be > 0, got 0"),
    ],
)
def test_bad_openai_flags(serve: Serve, flags: str, expected: str) -> None:
    assert _error(serve, *OPENAI, *flags.split()).startswith(expected)


def test_blank_model_id_rejected(serve: Serve) -> None:
    message = _error(serve, *OPENAI, "--openai-model-id", " ")
    assert message.startswith("--openai-model-id must be a non-empty string")


def test_bad_openai_bind_addr(serve: Serve) -> None:
    assert _error(serve, "--openai-bind-addr", "9337").startswith(
        "--openai-bind-addr must be host:port"
    )


def test_openai_only_on_stage_zero(serve: Serve) -> None:
    stage = {"stage_index": 1, "layer_start": 4, "layer_end": 8}
    message = _error(serve, *OPENAI, stage=stage)
    assert message.startswith("--openai-bind-addr is only allowed on stage 0")
    assert message.endswith("has stage_index 1")


@pytest.mark.parametrize(
    "flags",
    [
        ["--openai-generation-concurrency", "2"],
        ["--openai-adaptive-generation-concurrency"],
        ["--openai-model-id", "x"],
        ["--openai-default-max-tokens", "9"],
    ],
)
def test_front_flags_need_the_front(serve: Serve, flags: list[str]) -> None:
    """Admission, model id and default max tokens act only through a front: never accepted and dropped."""
    message = _error(serve, *flags)
    assert message.startswith(f"{flags[0]} needs --openai-bind-addr (or give it to skippy up")


# -- MTP source: the reference's binary_stage_options tests, ported -------------


def seed_stage_config() -> dict[str, Any]:
    """The reference's ``stage_config()`` fixture, every field as it serialises them."""
    return {
        "run_id": "run", "topology_id": "topology", "model_id": "model", "package_ref": None,
        "manifest_sha256": None, "source_model_path": None, "source_model_sha256": None,
        "source_model_bytes": None, "materialized_path": None, "materialized_pinned": False,
        "model_path": "/tmp/model.gguf", "projector_path": None, "stage_id": "stage-0",
        "stage_index": 0, "layer_start": 0, "layer_end": 4, "ctx_size": 512, "lane_count": 1,
        "n_batch": None, "n_ubatch": None, "n_gpu_layers": -1, "mmap": None, "mlock": False,
        "repack": False, "op_offload": None, "no_host_buffer": False, "check_tensors": False,
        "direct_io": False, "main_gpu": None, "split_mode": "auto", "cache_type_k": "f16",
        "cache_type_v": "f16", "flash_attn_type": "auto", "kv_offload": None, "kv_unified": None,
        "swa_full": None, "cache_idle_slots": None, "filter_tensors_on_load": True,
        "resident_tensor_names": [], "selected_device": None, "kv_cache": None,
        "native_mtp_enabled": True, "load_mode": "runtime-slice", "bind_addr": "127.0.0.1:0",
        "upstream": None, "downstream": None,
    }  # fmt: skip


def cache_composite_plan() -> dict[str, Any]:
    """The reference's ``cache_composite_plan()`` fixture."""
    return {
        "requested_strategy": "mtp-cache",
        "effective_strategy": "native-mtp+ngram-cache",
        "native_mtp": {
            "enabled": True, "max_draft_tokens": 1, "min_draft_tokens": 0,
            "reject_cooldown_tokens": 0, "suppress_cooldown_drafts": False,
            "suppress_cooldown_draft_limit": 0,
        },
        "ngram": {"kind": "cache", "min_ngram": 2, "max_ngram": 4, "max_proposal_tokens": 6},
        "extension": {"max_tokens": 6},
        "verify_window": {
            "min_tokens": 1, "max_tokens": 6, "pipeline_depth": 2, "runahead_max_tokens": 0,
        },
    }  # fmt: skip


@pytest.fixture
def seed(write_json) -> Callable[..., ServingOptions]:
    """``seed(*flags, **config_overrides)``: resolve flags against the seed's stage config."""

    def run(*flags: str, **overrides: Any) -> ServingOptions:
        stage_path = write_json("stage.json", {**seed_stage_config(), **overrides})
        return parse_serving_args(["--config", str(stage_path), *flags])

    return run


def test_typed_speculative_plan_reaches_embedded_stage_without_policy_merging(seed, write_json) -> None:
    expected = SpeculativeDecodeConfig.from_dict(cache_composite_plan())
    plan_path = write_json("speculative.json", expected.to_dict())
    options = seed("--openai-bind-addr", "127.0.0.1:9337", "--openai-speculative-config", str(plan_path))
    assert resolve_mtp_source(options) is MtpSource.INTEGRATED
    openai = options.openai
    assert openai is not None
    assert options.native_mtp_enabled
    assert openai.admission.generation_concurrency == 1
    assert openai.admission.queue_capacity == 16
    assert openai.admission.admission_timeout_secs == 0
    assert options.speculative.plan == expected  # the reference's openai.speculative


def test_embedded_openai_admission_overrides_are_independent(seed) -> None:
    options = seed(
        "--openai-bind-addr", "127.0.0.1:9337",
        "--openai-generation-concurrency", "2",
        "--openai-generation-queue-capacity", "33",
        "--openai-generation-admission-timeout-secs", "90",
        lane_count=4,
    )  # fmt: skip
    assert options.openai is not None
    admission = options.openai.admission
    assert admission.generation_concurrency == 2
    assert admission.queue_capacity == 33
    assert admission.admission_timeout_secs == 90


def test_native_mtp_sidecar_path_reaches_the_embedded_stage(seed, tmp_path: Path, write_json) -> None:
    sidecar_path = tmp_path / "sidecar-mtp.gguf"
    sidecar_path.write_bytes(b"gguf-stub")
    plan_path = write_json("speculative.json", cache_composite_plan())
    options = seed(
        "--openai-bind-addr", "127.0.0.1:9337",
        "--openai-speculative-config", str(plan_path),
        "--openai-native-mtp-draft-model-path", str(sidecar_path),
    )  # fmt: skip
    assert resolve_mtp_source(options) is MtpSource.EXTERNAL
    assert options.openai is not None
    # The sidecar attaches MTP heads to the served model; it must not be opened as a standalone
    # draft model.
    assert options.speculative.native_mtp_draft_model_path == str(sidecar_path)
    assert options.speculative.draft_model_path is None


def test_disabled_native_mtp_keeps_a_terminal_stage_out_of_integrated_mode(seed) -> None:
    options = seed(native_mtp_enabled=False)
    assert resolve_mtp_source(options) is MtpSource.DISABLED


def test_cache_composite_plan_is_json_stable_for_stage_handoff() -> None:
    plan = SpeculativeDecodeConfig.from_dict(cache_composite_plan())
    data = json.loads(plan.to_json())
    assert data["ngram"]["min_ngram"] == 2
    assert data["verify_window"]["pipeline_depth"] == 2


# -- MTP source: the rest of the rule ---------------------------------------------


def test_no_openai_front_is_integrated(seed) -> None:
    assert resolve_mtp_source(seed()) is MtpSource.INTEGRATED


def test_front_without_plan_is_disabled(seed) -> None:
    """No plan = the default plan, whose native_mtp.enabled is false."""
    assert resolve_mtp_source(seed(*OPENAI)) is MtpSource.DISABLED


def test_sidecar_without_plan_is_disabled_and_resolves(seed) -> None:
    options = seed(*OPENAI, "--openai-native-mtp-draft-model-path", "/models/mtp.gguf")
    assert options.speculative.native_mtp_draft_model_path == "/models/mtp.gguf"
    assert resolve_mtp_source(options) is MtpSource.DISABLED


def test_plan_with_mtp_off_disables(seed, write_json) -> None:
    path = write_json("plan.json", {"effective_strategy": "ngram-cache"})
    sidecar = ["--openai-native-mtp-draft-model-path", "/models/mtp.gguf"]
    assert resolve_mtp_source(seed(*OPENAI, "--openai-speculative-config", str(path))) is MtpSource.DISABLED
    options = seed(*OPENAI, *sidecar, "--openai-speculative-config", str(path))
    assert resolve_mtp_source(options) is MtpSource.DISABLED


def test_stage_config_switch_wins_over_the_runtime_switch(seed, write_json) -> None:
    path = write_json("plan.json", cache_composite_plan())
    options = seed(*OPENAI, "--openai-speculative-config", str(path), native_mtp_enabled=False)
    assert resolve_mtp_source(dataclasses.replace(options, native_mtp_enabled=True)) is MtpSource.DISABLED
    enabled = seed(*OPENAI, "--openai-speculative-config", str(path))
    assert resolve_mtp_source(dataclasses.replace(enabled, native_mtp_enabled=False)) is MtpSource.DISABLED


def test_options_dump_to_json_ready_dict(serve: Serve) -> None:
    data = serve(*OPENAI).to_dict()
    assert data["prefill"]["policy"] == "adaptive-ramp"
    assert data["speculative"]["plan"]["effective_strategy"] == "disabled"
    assert data["telemetry_level"] == "summary"
    assert StageConfig.from_dict(data["config"]).lane_count == 4
