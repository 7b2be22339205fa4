"""Serving options: CLI flags resolved against the stage config, and MTP source."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from skippy.config import (
    ConfigError,
    MtpSource,
    PrefillChunkPolicy,
    ServingOptions,
    SpeculativeDecodeConfig,
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
    assert options.metrics_otlp_grpc is None
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
        "--metrics-otlp-grpc", "http://127.0.0.1:4317",
    )  # fmt: skip
    assert options.bind_addr == "tcp://0.0.0.0:19005"
    assert (options.max_inflight, options.reply_credit_limit) == (2, 0)
    assert options.async_prefill_forward is False
    assert options.wire == WireCondition(delay_ms=12.5, mbps=100.0)
    assert options.downstream_connect_timeout_secs == 5.0
    assert options.telemetry_level is TelemetryLevel.DEBUG
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
    prefill = openai.prefill
    assert prefill.policy is PrefillChunkPolicy.ADAPTIVE_RAMP
    assert prefill.chunk_size == 256 and prefill.schedule == ()
    assert (prefill.adaptive_start, prefill.adaptive_step, prefill.adaptive_max) == (128, 128, 384)
    assert prefill.adaptive_target_ms == 100.0
    assert openai.speculative is None
    assert openai.draft_model_path is None and openai.native_mtp_draft_model_path is None
    assert openai.speculative_window == 4 and openai.adaptive_speculative_window is False


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
    openai = serve(
        *OPENAI,
        "--openai-model-id", "served-name",
        "--openai-default-max-tokens", "64",
        "--openai-prefill-chunk-size", "64",
        "--openai-prefill-chunk-policy", "adaptive",
        "--openai-prefill-adaptive-start", "32",
        "--openai-prefill-adaptive-step", "16",
        "--openai-prefill-adaptive-max", "96",
        "--openai-prefill-adaptive-target-ms", "250",
        "--openai-draft-model-path", "/models/draft.gguf",
        "--openai-speculative-window", "6",
        "--openai-adaptive-speculative-window",
    ).openai  # fmt: skip
    assert openai is not None
    assert (openai.model_id, openai.default_max_tokens) == ("served-name", 64)
    prefill = openai.prefill
    assert prefill.policy is PrefillChunkPolicy.ADAPTIVE_RAMP and prefill.chunk_size == 64
    assert (prefill.adaptive_start, prefill.adaptive_step, prefill.adaptive_max) == (32, 16, 96)
    assert prefill.adaptive_target_ms == 250.0
    assert openai.draft_model_path == "/models/draft.gguf"
    assert openai.speculative_window == 6 and openai.adaptive_speculative_window


@pytest.mark.parametrize("policy", [None, "fixed", "schedule"])
def test_schedule_policy(serve: Serve, policy: str | None) -> None:
    flags = ["--openai-prefill-chunk-schedule", "128, 256,384"]
    if policy:
        flags += ["--openai-prefill-chunk-policy", policy]
    prefill = serve(*OPENAI, *flags).openai.prefill  # type: ignore[union-attr]
    assert prefill.policy is PrefillChunkPolicy.SCHEDULE
    assert prefill.schedule == (128, 256, 384)


def test_fixed_policy(serve: Serve) -> None:
    prefill = serve(*OPENAI, "--openai-prefill-chunk-policy", "fixed").openai.prefill  # type: ignore[union-attr]
    assert prefill.policy is PrefillChunkPolicy.FIXED and prefill.schedule == ()


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
        ("--openai-prefill-chunk-size 0", "--openai-prefill-chunk-size must be > 0, got 0"),
        (
            "--openai-prefill-chunk-policy greedy",
            "--openai-prefill-chunk-policy must be one of fixed | schedule | adaptive-ramp",
        ),
        (
            "--openai-prefill-chunk-policy schedule",
            "--openai-prefill-chunk-policy schedule requires --openai-prefill-chunk-schedule",
        ),
        (
            "--openai-prefill-chunk-schedule 128,,256",
            "--openai-prefill-chunk-schedule must be a comma-separated list"
            " of positive integers, got '128,,256'",
        ),
        (
            "--openai-prefill-chunk-schedule 128,0",
            "--openai-prefill-chunk-schedule must be a comma-separated list of positive integers",
        ),
        (
            "--openai-prefill-chunk-schedule a,b",
            "--openai-prefill-chunk-schedule must be a comma-separated list of positive integers",
        ),
        (
            "--openai-prefill-chunk-policy adaptive-ramp --openai-prefill-chunk-schedule 64",
            "--openai-prefill-chunk-schedule needs --openai-prefill-chunk-policy schedule",
        ),
        ("--openai-prefill-adaptive-start 0", "--openai-prefill-adaptive-start must be > 0, got 0"),
        ("--openai-prefill-adaptive-step 0", "--openai-prefill-adaptive-step must be > 0, got 0"),
        ("--openai-prefill-adaptive-max 0", "--openai-prefill-adaptive-max must be > 0, got 0"),
        (
            "--openai-prefill-adaptive-start 512",
            "--openai-prefill-adaptive-start must be"
            " <= --openai-prefill-adaptive-max (384), got 512",
        ),
        (
            "--openai-prefill-adaptive-target-ms 0",
            "--openai-prefill-adaptive-target-ms must be finite and > 0",
        ),
        (
            "--openai-prefill-adaptive-target-ms inf",
            "--openai-prefill-adaptive-target-ms must be finite and > 0",
        ),
        (
            "--openai-draft-model-path d.gguf --openai-speculative-window 0",
            "--openai-speculative-window must be > 0 when --openai-draft-model-path is set, got 0",
        ),
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


def test_window_zero_without_draft_model_is_allowed(serve: Serve) -> None:
    assert serve(*OPENAI, "--openai-speculative-window", "0").openai.speculative_window == 0  # type: ignore[union-attr]


def test_openai_only_on_stage_zero(serve: Serve) -> None:
    stage = {"stage_index": 1, "layer_start": 4, "layer_end": 8}
    message = _error(serve, *OPENAI, stage=stage)
    assert message.startswith("--openai-bind-addr is only allowed on stage 0")
    assert message.endswith("has stage_index 1")


def test_openai_flags_ignored_without_front(serve: Serve) -> None:
    assert serve("--openai-generation-concurrency", "2").openai is None


# -- speculative plan and MTP source --------------------------------------------


PLAN: dict[str, Any] = {
    "requested_strategy": "mtp-cache",
    "effective_strategy": "native-mtp+ngram-cache",
    "native_mtp": {"enabled": True, "max_draft_tokens": 1},
    "ngram": {"kind": "cache", "min_ngram": 2, "max_ngram": 4, "max_proposal_tokens": 6},
    "extension": {"max_tokens": 6},
    "verify_window": {"min_tokens": 1, "max_tokens": 6, "pipeline_depth": 2},
}


def test_plan_reaches_options_unchanged(serve: Serve, write_json) -> None:
    path = write_json("plan.json", PLAN)
    options = serve(*OPENAI, "--openai-speculative-config", str(path))
    assert options.openai is not None
    assert options.openai.speculative == SpeculativeDecodeConfig.load(path)
    assert options.openai.speculative == SpeculativeDecodeConfig.from_dict(PLAN)
    assert options.openai.speculative.to_json() == SpeculativeDecodeConfig.from_dict(PLAN).to_json()
    assert resolve_mtp_source(options) is MtpSource.INTEGRATED


def test_invalid_plan_is_rejected_with_its_path(serve: Serve, write_json) -> None:
    path = write_json("plan.json", {**PLAN, "ngram": {**PLAN["ngram"], "max_ngram": 8}})
    message = _error(serve, *OPENAI, "--openai-speculative-config", str(path))
    assert message == f"{path}: field 'ngram.max_ngram' must be <= 4 for kind 'cache', got 8"


def test_sidecar_resolves_external(serve: Serve, write_json) -> None:
    options = serve(*OPENAI, "--openai-native-mtp-draft-model-path", "/models/mtp.gguf")
    assert options.openai.native_mtp_draft_model_path == "/models/mtp.gguf"  # type: ignore[union-attr]
    assert resolve_mtp_source(options) is MtpSource.EXTERNAL
    path = write_json("plan.json", PLAN)
    with_plan = serve(*OPENAI, "--openai-speculative-config", str(path),
                      "--openai-native-mtp-draft-model-path", "/models/mtp.gguf")  # fmt: skip
    assert resolve_mtp_source(with_plan) is MtpSource.EXTERNAL


def test_no_openai_front_is_integrated(serve: Serve) -> None:
    assert resolve_mtp_source(serve()) is MtpSource.INTEGRATED


def test_openai_without_plan_or_sidecar_is_integrated(serve: Serve) -> None:
    assert resolve_mtp_source(serve(*OPENAI)) is MtpSource.INTEGRATED


def test_stage_config_disabling_mtp_keeps_terminal_stage_out_of_integrated(serve: Serve) -> None:
    options = serve(stage={"native_mtp_enabled": False})
    assert options.config.is_final and options.openai is None
    assert options.native_mtp_enabled is False
    assert resolve_mtp_source(options) is MtpSource.DISABLED
    # Even if the runtime-level switch is on, the stage config's switch wins.
    forced = dataclasses.replace(options, native_mtp_enabled=True)
    assert resolve_mtp_source(forced) is MtpSource.DISABLED


def test_runtime_switch_disables_mtp(serve: Serve) -> None:
    options = dataclasses.replace(serve(), native_mtp_enabled=False)
    assert options.config.native_mtp_enabled is True
    assert resolve_mtp_source(options) is MtpSource.DISABLED


def test_plan_with_mtp_off_disables(serve: Serve, write_json) -> None:
    path = write_json("plan.json", {"effective_strategy": "ngram-cache"})
    options = serve(*OPENAI, "--openai-speculative-config", str(path))
    assert resolve_mtp_source(options) is MtpSource.DISABLED


def test_sidecar_with_mtp_disabled_is_a_startup_error(serve: Serve, write_json) -> None:
    sidecar = ["--openai-native-mtp-draft-model-path", "/models/mtp.gguf"]
    message = _error(serve, *OPENAI, *sidecar, stage={"native_mtp_enabled": False})
    assert message.startswith("--openai-native-mtp-draft-model-path requires native MTP")
    assert "stage.json sets native_mtp_enabled = false" in message
    path = write_json("plan.json", {"effective_strategy": "ngram-cache"})
    message = _error(serve, *OPENAI, *sidecar, "--openai-speculative-config", str(path))
    assert message.endswith(f"{path} sets native_mtp.enabled = false")


def test_options_dump_to_json_ready_dict(serve: Serve) -> None:
    data = serve(*OPENAI).to_dict()
    assert data["openai"]["prefill"]["policy"] == "adaptive-ramp"
    assert data["telemetry_level"] == "summary"
    assert StageConfig.from_dict(data["config"]).lane_count == 4
