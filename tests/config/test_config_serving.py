"""Serving options: stage-level CLI flags resolved against the stage config, argparse and file
errors, and the JSON dump of the resolved options.  The OpenAI front, admission and MTP source have
their own files (test_config_openai, test_config_admission, test_config_mtp)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from config_helpers import OPENAI, Serve, ServeError

from skippy.config import (
    ConfigError,
    PrefillChunkOptions,
    SpeculativeOptions,
    StageConfig,
    TelemetryLevel,
    WireCondition,
    add_serving_arguments,
    parse_serving_args,
    resolve_serving_options,
)
from skippy.config.generation import DEFAULT_POLICY_PLAN


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
    assert options.telemetry_queue_capacity == 1024
    assert options.metrics_otlp_grpc is None
    assert options.prefill == PrefillChunkOptions()
    assert options.speculative == SpeculativeOptions(plan=DEFAULT_POLICY_PLAN, policy=True)  # on by default
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
        (["--metrics-otlp-grpc", "grpc://x:4317"], "--metrics-otlp-grpc must be http://host:port or https://host:port"),
        (["--metrics-otlp-grpc", "127.0.0.1"], "--metrics-otlp-grpc must be host:port, got '127.0.0.1'"),
        (["--telemetry-queue-capacity", "0"], "--telemetry-queue-capacity must be > 0, got 0"),
    ],
)
def test_bad_stage_flags(serve_error: ServeError, flags: list[str], expected: str) -> None:
    assert serve_error(*flags).startswith(expected)


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


def test_topology_is_loaded_and_checked(serve: Serve, serve_error: ServeError, write_json, make_topology) -> None:
    topo = write_json("topo.json", make_topology(2))
    options = serve("--topology", str(topo))
    assert options.topology is not None and options.topology.first().stage_id == "stage-0"
    message = serve_error("--topology", str(topo), stage={"layer_end": 5})
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


def test_options_dump_to_json_ready_dict(serve: Serve) -> None:
    data = serve(*OPENAI).to_dict()
    assert data["prefill"]["policy"] == "adaptive-ramp"
    assert data["speculative"]["plan"]["effective_strategy"] == "policy"
    assert serve(*OPENAI, "--no-speculative").to_dict()["speculative"]["plan"]["effective_strategy"] == "disabled"
    assert data["telemetry_level"] == "summary"
    assert StageConfig.from_dict(data["config"]).lane_count == 4
