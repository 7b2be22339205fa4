"""Stage 0's generation flags (prefill chunking, bad speculative values) and the refusal of flags whose
feature is not built yet: resolved and validated with or without the in-process OpenAI front.
Speculative flag combinations: test_config_speculative_flags.py."""

from __future__ import annotations

import pytest
from config_helpers import OPENAI, Serve

from skippy.config import (
    ConfigError,
    PrefillChunkPolicy,
    refuse_unsupported,
    unsupported_options,
)

FRONTS = pytest.mark.parametrize(
    "front", [[], list(OPENAI)], ids=["no-front", "front"]
)


# -- prefill ------------------------------------------------------------------------


@FRONTS
def test_prefill_flags_resolve_with_or_without_front(serve: Serve, front: list[str]) -> None:
    prefill = serve(
        *front,
        "--openai-prefill-chunk-policy", "adaptive",
        "--openai-prefill-adaptive-start", "32",
        "--openai-prefill-adaptive-step", "16",
        "--openai-prefill-adaptive-max", "96",
        "--openai-prefill-adaptive-target-ms", "250",
    ).prefill  # fmt: skip
    assert prefill.policy is PrefillChunkPolicy.ADAPTIVE_RAMP
    assert (prefill.adaptive_start, prefill.adaptive_step, prefill.adaptive_max) == (32, 16, 96)
    assert prefill.adaptive_target_ms == 250.0


@pytest.mark.parametrize("policy", [None, "fixed", "schedule"])
def test_schedule_policy(serve: Serve, policy: str | None) -> None:
    flags = ["--openai-prefill-chunk-schedule", "128, 256,384"]
    if policy:
        flags += ["--openai-prefill-chunk-policy", policy]
    prefill = serve(*flags).prefill
    assert prefill.policy is PrefillChunkPolicy.SCHEDULE
    assert prefill.schedule == (128, 256, 384)


def test_fixed_policy(serve: Serve) -> None:
    options = serve("--openai-prefill-chunk-policy", "fixed", "--openai-prefill-chunk-size", "64")
    assert options.prefill.policy is PrefillChunkPolicy.FIXED and options.prefill.schedule == ()
    assert options.prefill.chunk_size == 64 and unsupported_options(options) == []


INERT_PREFILL_FLAGS = [  # (flags, the one line each given flag gets)
    ("--openai-prefill-chunk-size 64",
     ["--openai-prefill-chunk-size is read only by --openai-prefill-chunk-policy fixed, but the policy is adaptive-ramp"]),
    ("--openai-prefill-chunk-schedule 64,128 --openai-prefill-chunk-size 64",
     ["--openai-prefill-chunk-size is read only by --openai-prefill-chunk-policy fixed, but the policy is schedule"]),
    ("--openai-prefill-chunk-policy fixed --openai-prefill-adaptive-start 64 --openai-prefill-adaptive-target-ms 50",
     ["--openai-prefill-adaptive-start is read only by --openai-prefill-chunk-policy adaptive-ramp, but the policy is fixed",
      "--openai-prefill-adaptive-target-ms is read only by --openai-prefill-chunk-policy adaptive-ramp,"
      " but the policy is fixed"]),
    ("--openai-prefill-chunk-schedule 64 --openai-prefill-adaptive-max 512",
     ["--openai-prefill-adaptive-max is read only by --openai-prefill-chunk-policy adaptive-ramp, but the policy is schedule"]),
]


@FRONTS
@pytest.mark.parametrize(("flags", "lines"), INERT_PREFILL_FLAGS)
def test_prefill_flags_the_policy_ignores_are_refused(serve: Serve, front: list[str], flags: str, lines: list[str]) -> None:
    options = serve(*front, *flags.split())
    assert unsupported_options(options) == lines
    with pytest.raises(ConfigError, match="read only by"):
        refuse_unsupported(options)


BAD_STAGE0_FLAGS = [
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
        "--openai-prefill-adaptive-start must be <= --openai-prefill-adaptive-max (384), got 512",
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
        "--openai-prefill-adaptive-target-ms -5",
        "--openai-prefill-adaptive-target-ms must be finite and > 0",
    ),
    (
        "--openai-draft-model-path d.gguf --openai-speculative-window 0",
        "--openai-speculative-window must be > 0 when --openai-draft-model-path is set, got 0",
    ),
    ("--openai-speculative-window -1", "--openai-speculative-window must be >= 0, got -1"),
    ("--openai-draft-n-gpu-layers x", "--openai-draft-n-gpu-layers must be an integer, got 'x'"),
    (
        "--openai-adaptive-speculative-window-mode fast",
        "--openai-adaptive-speculative-window-mode must be one of cost | simple",
    ),
]


@FRONTS
@pytest.mark.parametrize(("flags", "expected"), BAD_STAGE0_FLAGS)
def test_bad_stage0_flags(serve: Serve, front: list[str], flags: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        serve(*front, *flags.split())
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)


# -- telemetry flags (issue 12: once refused, now built) ------------------------------------


@pytest.mark.parametrize(("flags", "field", "value"), [
    (["--metrics-otlp-grpc", "http://127.0.0.1:4317"], "metrics_otlp_grpc", "http://127.0.0.1:4317"),
    (["--metrics-otlp-grpc", "127.0.0.1:4317"], "metrics_otlp_grpc", "http://127.0.0.1:4317"),  # bare host:port
    (["--telemetry-queue-capacity", "64"], "telemetry_queue_capacity", 64),
], ids=["otlp-url", "otlp-host-port", "queue-capacity"])
def test_telemetry_flags_resolve_and_are_supported(serve: Serve, flags: list[str], field: str, value: object) -> None:
    options = serve(*flags)
    assert getattr(options, field) == value
    assert unsupported_options(options) == []
    refuse_unsupported(options)


def test_defaults_are_supported(serve: Serve) -> None:
    refuse_unsupported(serve())
    refuse_unsupported(serve("--openai-bind-addr", "127.0.0.1:0"))
