"""Where native-MTP drafts come from (``resolve_mtp_source``): the reference's
``binary_stage_options`` tests, ported (with their embedded-front admission checks), then the rest
of the rule."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from config_helpers import OPENAI, reference_stage_config

from skippy.config import (
    MtpSource,
    ServingOptions,
    SpeculativeDecodeConfig,
    parse_serving_args,
    resolve_mtp_source,
)


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
        stage_path = write_json("stage.json", {**reference_stage_config(), **overrides})
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
