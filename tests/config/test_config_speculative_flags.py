"""Stage 0's speculative flags (issue 9): how they resolve, which combinations are accepted, and the one
line naming the flag that refuses each combination that cannot work (``speculative_problems``, reached
through ``unsupported_options`` / ``refuse_unsupported``).  The plan file itself: test_config_speculative.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from config_helpers import OPENAI, Serve, ServeError

from skippy.config import (
    ConfigError,
    NgramKind,
    ServingOptions,
    SpeculativeDecodeConfig,
    refuse_unsupported,
    unsupported_options,
)
from skippy.config.generation import DEFAULT_POLICY_PLAN, AdaptiveWindowMode, speculative_problems
from skippy.config.speculative import NgramConfig

Plan = dict[str, Any] | None
Resolve = Callable[..., tuple[ServingOptions, str]]  # resolve(plan, *flags) -> (options, plan path or "")

SUFFIX = {"kind": "suffix", "min_ngram": 3, "max_ngram": 8, "max_proposal_tokens": 16}
CACHE = {"kind": "cache", "min_ngram": 1, "max_ngram": 4, "max_proposal_tokens": 6}
MTP = {"enabled": True, "max_draft_tokens": 2}
DRAFT = ["--openai-draft-model-path", "/models/draft.gguf"]
NEEDS_PROPOSER = "needs a proposer: --openai-draft-model-path, or an ngram section in --openai-speculative-config"


@pytest.fixture
def resolve(serve: Serve, write_json) -> Resolve:
    """Resolve ``flags`` (plus ``--openai-speculative-config`` when ``plan`` is a dict)."""

    def run(plan: Plan, *flags: str) -> tuple[ServingOptions, str]:
        if plan is None:
            return serve(*flags), ""
        path = str(write_json("plan.json", plan))
        return serve("--openai-speculative-config", path, *flags), path

    return run


# -- resolution ---------------------------------------------------------------------------


def test_speculative_flags_resolve_without_front(serve: Serve, write_json) -> None:
    plan = write_json("plan.json", {"native_mtp": {"enabled": True}})
    spec = serve(
        "--openai-speculative-config", str(plan),
        "--openai-draft-model-path", "/models/draft.gguf",
        "--openai-speculative-window", "6",
        "--openai-adaptive-speculative-window",
        "--openai-adaptive-speculative-window-mode", "simple",
        "--openai-draft-n-gpu-layers", "-1",
        "--openai-native-mtp-draft-model-path", "/models/mtp.gguf",
    ).speculative  # fmt: skip
    assert spec.plan == SpeculativeDecodeConfig.load(plan) and spec.plan_path == str(plan)
    assert spec.draft_model_path == "/models/draft.gguf"
    assert (spec.speculative_window, spec.adaptive_speculative_window) == (6, True)
    assert (spec.adaptive_mode, spec.adaptive_mode_given) == (AdaptiveWindowMode.SIMPLE, True)
    assert spec.draft_n_gpu_layers == -1
    assert spec.native_mtp_draft_model_path == "/models/mtp.gguf"


def test_adaptive_mode_defaults_to_cost_and_is_not_given(serve: Serve) -> None:
    spec = serve().speculative
    assert (spec.adaptive_mode, spec.adaptive_mode_given) == (AdaptiveWindowMode.COST, False)
    assert serve("--openai-adaptive-speculative-window-mode", "cost").speculative.adaptive_mode_given


def test_window_zero_without_draft_model_resolves(serve: Serve) -> None:
    assert serve("--openai-speculative-window", "0").speculative.speculative_window == 0


def test_a_window_longer_than_a_verify_window_carries_is_refused(serve: Serve, serve_error: ServeError) -> None:
    assert serve("--openai-speculative-window", "16").speculative.speculative_window == 16
    assert serve_error("--openai-speculative-window", "17") == (
        "--openai-speculative-window must be <= 16 (a verify window carries at most 16 drafts), got 17")


def test_speculation_is_on_by_default_and_off_with_no_speculative(serve: Serve, write_json) -> None:
    spec = serve().speculative
    assert spec.policy and spec.plan == DEFAULT_POLICY_PLAN and spec.plan.active_ngram is not None
    off = serve(OFF).speculative
    assert (off.policy, off.no_speculative, off.plan.active_ngram) == (False, True, None)
    assert speculative_problems(off) == []
    planned = serve("--openai-speculative-config", str(write_json("p.json", {"ngram": SUFFIX}))).speculative
    assert not planned.policy and planned.plan.ngram == NgramConfig(**SUFFIX)


def test_invalid_plan_is_rejected_with_its_path(serve: Serve, write_json) -> None:
    ngram = {"kind": "cache", "min_ngram": 2, "max_ngram": 8, "max_proposal_tokens": 6}
    path = write_json("plan.json", {"ngram": ngram})
    with pytest.raises(ConfigError) as info:
        serve("--openai-speculative-config", str(path))
    assert str(info.value) == f"{path}: field 'ngram.max_ngram' must be <= 4 for kind 'cache', got 8"


# -- accepted combinations -----------------------------------------------------------------


ACCEPTED = {
    "suffix-fixed-window": ({"ngram": SUFFIX}, ["--openai-speculative-window", "8"]),
    "suffix-adaptive": ({"ngram": SUFFIX}, ["--openai-speculative-window", "8", "--openai-adaptive-speculative-window"]),
    "suffix-adaptive-simple": (
        {"ngram": SUFFIX},
        ["--openai-adaptive-speculative-window", "--openai-adaptive-speculative-window-mode", "simple"],
    ),
    "cache-plan-only": ({"ngram": CACHE, "effective_strategy": "ngram-cache"}, []),
    "suffix-depth-1": ({"ngram": SUFFIX, "verify_window": {"min_tokens": 2, "max_tokens": 8, "pipeline_depth": 1}}, []),
    "suffix-depth-2": ({"ngram": SUFFIX, "verify_window": {"min_tokens": 2, "max_tokens": 8, "pipeline_depth": 2}}, []),
    "draft-layers": (None, [*DRAFT, "--openai-draft-n-gpu-layers", "0"]),
    "draft-adaptive-cost": (
        None,
        [*DRAFT, "--openai-speculative-window", "6", "--openai-adaptive-speculative-window",
         "--openai-adaptive-speculative-window-mode", "cost"],
    ),
    "plan-without-drafting": ({"requested_strategy": "off", "verify_window": {"max_tokens": 2}}, []),
}


@pytest.mark.parametrize("front", [[], list(OPENAI)], ids=["no-front", "front"])
@pytest.mark.parametrize(("plan", "flags"), ACCEPTED.values(), ids=ACCEPTED.keys())
def test_valid_speculative_flags_are_accepted(resolve: Resolve, front: list[str], plan: Plan, flags: list[str]) -> None:
    options, _path = resolve(plan, *front, *flags)
    assert speculative_problems(options.speculative) == []
    assert unsupported_options(options) == []
    refuse_unsupported(options)


def test_the_draft_model_path_is_not_opened_while_resolving(resolve: Resolve) -> None:
    options, _ = resolve(None, "--openai-draft-model-path", "/no/such/draft.gguf", "--openai-draft-n-gpu-layers", "0")
    assert options.speculative.draft_model_path == "/no/such/draft.gguf"
    assert options.speculative.draft_n_gpu_layers == 0 and unsupported_options(options) == []


def test_accepted_suffix_plan_keeps_its_values(resolve: Resolve) -> None:
    options, path = resolve({"ngram": SUFFIX}, "--openai-speculative-window", "8", "--openai-adaptive-speculative-window")
    spec = options.speculative
    assert spec.plan_path == path and spec.plan.ngram is not None and spec.plan.ngram.kind is NgramKind.SUFFIX
    assert (spec.plan.ngram.min_ngram, spec.plan.ngram.max_ngram, spec.plan.ngram.max_proposal_tokens) == (3, 8, 16)
    assert (spec.speculative_window, spec.adaptive_speculative_window) == (8, True)


# -- refused combinations: one line each, naming the flag ------------------------------------


CONFIG = "--openai-speculative-config: {plan} sets"
OFF = "--no-speculative"
NEEDS_OFF = f"{NEEDS_PROPOSER} ({OFF} turns speculation off)"
WINDOW_MODE = "--openai-adaptive-speculative-window-mode"
REFUSED = {  # (plan, flags, the one line; {plan} is the plan's path)
    "native-mtp-draft-model": (
        None, ["--openai-native-mtp-draft-model-path", "/models/mtp.gguf"],
        "--openai-native-mtp-draft-model-path needs native_mtp.enabled in --openai-speculative-config"
        " (the default plan leaves native MTP off)",
    ),
    "native-mtp-and-draft-model": (
        {"native_mtp": MTP}, DRAFT,
        "--openai-draft-model-path and the native MTP drafts of {plan} cannot both draft; pick one",
    ),
    "native-mtp-and-ngram-without-extension": (
        {"native_mtp": MTP, "ngram": CACHE}, [],
        f"{CONFIG} native_mtp and an ngram proposer without an extension: the n-gram drafts only as the tail of"
        " the MTP prefix (add extension.max_tokens)",
    ),
    "native-mtp-extension-of-suffix": (
        {"native_mtp": MTP, "ngram": SUFFIX, "extension": {"max_tokens": 2}}, [],
        "--openai-speculative-config: {plan} extends native MTP with ngram.kind 'suffix'; the extension tail is the"
        " n-gram cache (kind 'cache')",
    ),
    "draft-and-ngram": (
        {"ngram": SUFFIX}, DRAFT,
        "--openai-draft-model-path and the ngram proposer of {plan} cannot both draft; pick one",
    ),
    "window-alone": (None, ["--no-speculative", "--openai-speculative-window", "4"], f"--openai-speculative-window {NEEDS_OFF}"),
    "window-zero-alone": (
        None, ["--no-speculative", "--openai-speculative-window", "0"], f"--openai-speculative-window {NEEDS_OFF}",
    ),
    "window-plan-without-ngram": (
        {"verify_window": {"max_tokens": 8}}, ["--openai-speculative-window", "4"],
        f"--openai-speculative-window {NEEDS_PROPOSER}",
    ),
    "adaptive-alone": (
        None, [OFF, "--openai-adaptive-speculative-window"],
        f"--openai-adaptive-speculative-window {NEEDS_OFF}",
    ),
    "mode-alone": (None, ["--no-speculative", WINDOW_MODE, "simple"], f"{WINDOW_MODE} {NEEDS_OFF}"),
    "draft-layers-alone": (
        None, ["--no-speculative", "--openai-draft-n-gpu-layers", "0"], f"--openai-draft-n-gpu-layers {NEEDS_OFF}",
    ),
    "strategy-without-ngram": (
        {"effective_strategy": "ngram-cache"}, [],
        f"{CONFIG} effective_strategy 'ngram-cache' but no proposer (an ngram section)",
    ),
    "mode-without-adaptive-ngram": (
        {"ngram": SUFFIX}, [WINDOW_MODE, "simple"], f"{WINDOW_MODE} needs --openai-adaptive-speculative-window",
    ),
    "mode-without-adaptive-draft": (
        None, [*DRAFT, WINDOW_MODE, "cost"], f"{WINDOW_MODE} needs --openai-adaptive-speculative-window",
    ),
    "draft-layers-with-ngram": (
        {"ngram": SUFFIX}, ["--openai-draft-n-gpu-layers", "0"],
        "--openai-draft-n-gpu-layers needs --openai-draft-model-path: the ngram proposer of {plan} runs no model",
    ),
    "no-speculative-with-plan": (
        {"ngram": SUFFIX}, [OFF], f"{OFF} turns speculation off, but --openai-speculative-config asks for it; drop one",
    ),
    "no-speculative-with-draft-model": (
        None, [OFF, *DRAFT], f"{OFF} turns speculation off, but --openai-draft-model-path asks for it; drop one",
    ),
    "default-window-zero": (
        None, ["--openai-speculative-window", "0"],
        "--openai-speculative-window must be > 0 with the ngram proposer of the default plan, got 0",
    ),
    "window-zero-with-ngram": (
        {"ngram": CACHE}, ["--openai-speculative-window", "0"],
        "--openai-speculative-window must be > 0 with the ngram proposer of {plan}, got 0",
    ),
    "window-below-min-tokens": (
        {"ngram": SUFFIX, "verify_window": {"min_tokens": 4, "max_tokens": 8}}, ["--openai-speculative-window", "2"],
        "--openai-speculative-window 2 is below verify_window.min_tokens (4) of {plan}: no window could carry its"
        " minimum; raise one or lower the other",
    ),
}


@pytest.mark.parametrize(("plan", "flags", "line"), REFUSED.values(), ids=REFUSED.keys())
def test_each_unworkable_combination_is_one_line_naming_its_flag(resolve: Resolve, plan: Plan, flags: list[str],
                                                                 line: str) -> None:
    options, path = resolve(plan, *flags)  # resolution succeeds: the values are checked and visible
    expected = line.format(plan=path)
    named = expected.split()[0].rstrip(":")
    assert named in flags or (plan is not None and named == "--openai-speculative-config")
    assert speculative_problems(options.speculative) == [expected]
    assert unsupported_options(options) == [expected]
    with pytest.raises(ConfigError) as info:
        refuse_unsupported(options)
    assert str(info.value) == expected and "\n" not in expected


def test_every_refusal_is_named_on_one_line(resolve: Resolve) -> None:
    flags = [
        "--metrics-otlp-grpc", "http://127.0.0.1:4317",
        "--telemetry-queue-capacity", "1024",
        "--openai-native-mtp-draft-model-path", "/models/mtp.gguf",
        "--openai-speculative-window", "4",
        "--openai-adaptive-speculative-window",
        "--openai-adaptive-speculative-window-mode", "simple",
        "--openai-draft-n-gpu-layers", "0",
    ]  # fmt: skip
    options, _ = resolve({"native_mtp": MTP, "ngram": CACHE, "verify_window": {"pipeline_depth": 3}}, *flags)
    lines = unsupported_options(options)
    assert [line.split()[0].rstrip(":") for line in lines] == [  # the telemetry flags are supported (issue 12)
        "--openai-speculative-config",  # native_mtp with an ngram section but no extension (docs/mtp.md)
        "--openai-draft-n-gpu-layers",  # native MTP runs no draft model
    ]
    with pytest.raises(ConfigError) as info:
        refuse_unsupported(options)
    assert str(info.value) == "; ".join(lines) and "\n" not in str(info.value)
