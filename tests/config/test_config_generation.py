"""Stage 0's generation flags (prefill chunking, speculative decoding) and the refusal of flags whose
feature is not built yet: resolved and validated with or without the in-process OpenAI front."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from skippy.config import (
    ConfigError,
    PrefillChunkPolicy,
    ServingOptions,
    SpeculativeDecodeConfig,
    parse_serving_args,
    refuse_unsupported,
    unsupported_options,
)

Serve = Callable[..., ServingOptions]
FRONTS = pytest.mark.parametrize(
    "front", [[], ["--openai-bind-addr", "127.0.0.1:9337"]], ids=["no-front", "front"]
)


@pytest.fixture
def serve(write_json, stage_dict: dict[str, Any]) -> Serve:
    path = write_json("stage.json", stage_dict)
    return lambda *flags: parse_serving_args(["--config", str(path), *flags])


# -- prefill ------------------------------------------------------------------------


@FRONTS
def test_prefill_flags_resolve_with_or_without_front(serve: Serve, front: list[str]) -> None:
    prefill = serve(
        *front,
        "--openai-prefill-chunk-size", "64",
        "--openai-prefill-chunk-policy", "adaptive",
        "--openai-prefill-adaptive-start", "32",
        "--openai-prefill-adaptive-step", "16",
        "--openai-prefill-adaptive-max", "96",
        "--openai-prefill-adaptive-target-ms", "250",
    ).prefill  # fmt: skip
    assert prefill.policy is PrefillChunkPolicy.ADAPTIVE_RAMP and prefill.chunk_size == 64
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
    prefill = serve("--openai-prefill-chunk-policy", "fixed").prefill
    assert prefill.policy is PrefillChunkPolicy.FIXED and prefill.schedule == ()


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
]


@FRONTS
@pytest.mark.parametrize(("flags", "expected"), BAD_STAGE0_FLAGS)
def test_bad_stage0_flags(serve: Serve, front: list[str], flags: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        serve(*front, *flags.split())
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)


# -- speculative flags ----------------------------------------------------------------


def test_speculative_flags_resolve_without_front(serve: Serve, write_json) -> None:
    plan = write_json("plan.json", {"native_mtp": {"enabled": True}})
    spec = serve(
        "--openai-speculative-config", str(plan),
        "--openai-draft-model-path", "/models/draft.gguf",
        "--openai-speculative-window", "6",
        "--openai-adaptive-speculative-window",
        "--openai-draft-n-gpu-layers", "-1",
        "--openai-native-mtp-draft-model-path", "/models/mtp.gguf",
    ).speculative  # fmt: skip
    assert spec.plan == SpeculativeDecodeConfig.load(plan) and spec.plan_path == str(plan)
    assert spec.draft_model_path == "/models/draft.gguf"
    assert (spec.speculative_window, spec.adaptive_speculative_window) == (6, True)
    assert spec.draft_n_gpu_layers == -1
    assert spec.native_mtp_draft_model_path == "/models/mtp.gguf"


def test_window_zero_without_draft_model_is_allowed(serve: Serve) -> None:
    assert serve("--openai-speculative-window", "0").speculative.speculative_window == 0


def test_invalid_plan_is_rejected_with_its_path(serve: Serve, write_json) -> None:
    ngram = {"kind": "cache", "min_ngram": 2, "max_ngram": 8, "max_proposal_tokens": 6}
    path = write_json("plan.json", {"ngram": ngram})
    with pytest.raises(ConfigError) as info:
        serve("--openai-speculative-config", str(path))
    assert str(info.value) == f"{path}: field 'ngram.max_ngram' must be <= 4 for kind 'cache', got 8"


# -- flags whose feature is not built yet -----------------------------------------------


UNSUPPORTED = [
    (["--metrics-otlp-grpc", "http://127.0.0.1:4317"], "(OTLP export: issue 12)"),
    (["--telemetry-queue-capacity", "1024"], "(telemetry event queue: issue 12)"),
    (["--openai-draft-model-path", "/models/draft.gguf"], "(speculative decoding: issue 9)"),
    (["--openai-speculative-window", "4"], "(speculative decoding: issue 9)"),
    (["--openai-adaptive-speculative-window"], "(speculative decoding: issue 9)"),
    (["--openai-draft-n-gpu-layers", "0"], "(speculative decoding: issue 9)"),
    (["--openai-native-mtp-draft-model-path", "/models/mtp.gguf"], "(speculative decoding: issue 9)"),
]


@pytest.mark.parametrize(("flags", "why"), UNSUPPORTED, ids=[f[0] for f, _ in UNSUPPORTED])
def test_unsupported_flag_resolves_but_is_refused(serve: Serve, flags: list[str], why: str) -> None:
    options = serve(*flags)  # resolution succeeds: the value is checked and visible
    assert unsupported_options(options) == [f"{flags[0]} is not supported yet {why}"]
    with pytest.raises(ConfigError, match=f"^{flags[0]} is not supported yet"):
        refuse_unsupported(options)


@pytest.mark.parametrize(
    ("plan", "asks"),
    [
        ({"native_mtp": {"enabled": True}}, "native_mtp.enabled"),
        (
            {"ngram": {"min_ngram": 2, "max_ngram": 4, "max_proposal_tokens": 6}},
            "ngram",
        ),
        ({"effective_strategy": "ngram-cache"}, "effective_strategy 'ngram-cache'"),
    ],
)
def test_a_plan_that_drafts_is_refused(serve: Serve, write_json, plan: dict[str, Any], asks: str) -> None:
    path = write_json("plan.json", plan)
    (line,) = unsupported_options(serve("--openai-speculative-config", str(path)))
    assert line == (
        "--openai-speculative-config is not supported yet"
        f" (speculative decoding: issue 9; {path} sets {asks})"
    )


def test_a_plan_that_does_not_draft_is_accepted(serve: Serve, write_json) -> None:
    path = write_json("plan.json", {"requested_strategy": "off", "verify_window": {"max_tokens": 2}})
    assert SpeculativeDecodeConfig.load(path).drafting == ()
    assert unsupported_options(serve("--openai-speculative-config", str(path))) == []


def test_defaults_are_supported(serve: Serve) -> None:
    refuse_unsupported(serve())
    refuse_unsupported(serve("--openai-bind-addr", "127.0.0.1:0"))


def test_every_unsupported_flag_is_named_on_one_line(serve: Serve) -> None:
    flags = [arg for pair, _ in UNSUPPORTED for arg in pair]
    with pytest.raises(ConfigError) as info:
        refuse_unsupported(serve(*flags))
    message = str(info.value)
    assert "\n" not in message
    assert [part.split()[0] for part in message.split("; ")] == [pair[0] for pair, _ in UNSUPPORTED]
