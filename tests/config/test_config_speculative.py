"""SpeculativeDecodeConfig: defaults, validate() rules, unknown keys, stable JSON."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skippy.config import (
    ConfigError,
    NativeMtpConfig,
    NgramConfig,
    NgramExtensionConfig,
    NgramKind,
    SpeculativeDecodeConfig,
    VerifyWindowConfig,
)


def composite_plan() -> SpeculativeDecodeConfig:
    return SpeculativeDecodeConfig(
        requested_strategy="mtp-cache",
        effective_strategy="native-mtp+ngram-cache",
        native_mtp=NativeMtpConfig(enabled=True, max_draft_tokens=2, reject_cooldown_tokens=3),
        ngram=NgramConfig(kind=NgramKind.CACHE, min_ngram=2, max_ngram=4, max_proposal_tokens=6),
        extension=NgramExtensionConfig(max_tokens=6),
        verify_window=VerifyWindowConfig(min_tokens=1, max_tokens=6, pipeline_depth=2),
    )


def test_defaults() -> None:
    plan = SpeculativeDecodeConfig()
    assert plan.requested_strategy == "auto" and plan.effective_strategy == "disabled"
    assert plan.native_mtp == NativeMtpConfig(
        enabled=False,
        max_draft_tokens=1,
        min_draft_tokens=0,
        reject_cooldown_tokens=0,
        suppress_cooldown_drafts=False,
        suppress_cooldown_draft_limit=0,
    )
    assert plan.ngram is None and plan.extension is None
    assert plan.verify_window == VerifyWindowConfig(
        min_tokens=1, max_tokens=4, pipeline_depth=1, runahead_max_tokens=0
    )
    assert plan.drafting == ()
    assert NgramConfig(min_ngram=1, max_ngram=2, max_proposal_tokens=3).kind is NgramKind.CACHE
    plan.validate()
    assert SpeculativeDecodeConfig.from_dict({}) == plan


def test_to_json_is_stable_and_round_trips(write_json) -> None:
    plan = composite_plan()
    text = plan.to_json()
    assert text == plan.to_json() == composite_plan().to_json()
    assert list(json.loads(text)) == sorted(json.loads(text))
    assert SpeculativeDecodeConfig.from_json(text) == plan
    path = write_json("plan.json", json.loads(text))
    assert SpeculativeDecodeConfig.load(path) == plan


def _rejects(plan: SpeculativeDecodeConfig, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan.validate("plan.json")
    assert str(info.value) == f"plan.json: {expected}"


def _cache(**overrides: Any) -> NgramConfig:
    values = {"min_ngram": 2, "max_ngram": 4, "max_proposal_tokens": 6, **overrides}
    return NgramConfig(kind=NgramKind.CACHE, **values)


def _suffix(**overrides: Any) -> NgramConfig:
    values = {"min_ngram": 3, "max_ngram": 32, "max_proposal_tokens": 8, **overrides}
    return NgramConfig(kind=NgramKind.SUFFIX, **values)


AT_MOST_16 = "must be <= 16 (a verify window carries at most 16 drafts)"
MTP_DRAFTS = "must be in 1..16 (the final stage drafts at most 16 a window; 0 would draft nothing)"


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        (
            SpeculativeDecodeConfig(requested_strategy=""),
            "field 'requested_strategy' must not be empty",
        ),
        (
            SpeculativeDecodeConfig(effective_strategy=" "),
            "field 'effective_strategy' must not be empty",
        ),
        (
            SpeculativeDecodeConfig(
                native_mtp=NativeMtpConfig(max_draft_tokens=1, min_draft_tokens=2)
            ),
            "field 'native_mtp.min_draft_tokens' must be <= native_mtp.max_draft_tokens (1), got 2",
        ),
        (
            SpeculativeDecodeConfig(ngram=_cache(min_ngram=0)),
            "field 'ngram.min_ngram' must be > 0, got 0",
        ),
        (
            SpeculativeDecodeConfig(ngram=_cache(min_ngram=3, max_ngram=2)),
            "field 'ngram.max_ngram' must be >= ngram.min_ngram (3), got 2",
        ),
        (
            SpeculativeDecodeConfig(ngram=_cache(max_proposal_tokens=0)),
            "field 'ngram.max_proposal_tokens' must be > 0, got 0",
        ),
        (
            SpeculativeDecodeConfig(ngram=_cache(max_ngram=5)),
            "field 'ngram.max_ngram' must be <= 4 for kind 'cache', got 5",
        ),
        (
            SpeculativeDecodeConfig(ngram=_suffix(min_ngram=2)),
            "field 'ngram.min_ngram' must be >= 3 for kind 'suffix', got 2",
        ),
        (
            SpeculativeDecodeConfig(ngram=_suffix(max_ngram=65)),
            "field 'ngram.max_ngram' must be <= 64 for kind 'suffix', got 65",
        ),
        (
            SpeculativeDecodeConfig(ngram=_cache(), extension=NgramExtensionConfig(max_tokens=4)),
            "field 'extension' requires native_mtp.enabled = true",
        ),
        (
            SpeculativeDecodeConfig(
                native_mtp=NativeMtpConfig(enabled=True),
                extension=NgramExtensionConfig(max_tokens=4),
            ),
            "field 'extension' requires an ngram proposer",
        ),
        (
            SpeculativeDecodeConfig(
                native_mtp=NativeMtpConfig(enabled=True),
                ngram=_cache(),
                extension=NgramExtensionConfig(max_tokens=0),
            ),
            "field 'extension.max_tokens' must be > 0, got 0",
        ),
        (
            SpeculativeDecodeConfig(verify_window=VerifyWindowConfig(min_tokens=0)),
            "field 'verify_window.min_tokens' must be > 0, got 0",
        ),
        (
            SpeculativeDecodeConfig(verify_window=VerifyWindowConfig(min_tokens=5, max_tokens=4)),
            "field 'verify_window.max_tokens' must be >= verify_window.min_tokens (5), got 4",
        ),
        (
            SpeculativeDecodeConfig(verify_window=VerifyWindowConfig(max_tokens=17)),
            f"field 'verify_window.max_tokens' {AT_MOST_16}, got 17",
        ),
        (
            SpeculativeDecodeConfig(ngram=_cache(max_proposal_tokens=17)),
            f"field 'ngram.max_proposal_tokens' {AT_MOST_16}, got 17",
        ),
        (
            SpeculativeDecodeConfig(
                native_mtp=NativeMtpConfig(enabled=True),
                ngram=_cache(),
                extension=NgramExtensionConfig(max_tokens=17),
            ),
            f"field 'extension.max_tokens' {AT_MOST_16}, got 17",
        ),
        (
            SpeculativeDecodeConfig(native_mtp=NativeMtpConfig(enabled=True, max_draft_tokens=0)),
            f"field 'native_mtp.max_draft_tokens' {MTP_DRAFTS}, got 0",
        ),
        (
            SpeculativeDecodeConfig(native_mtp=NativeMtpConfig(max_draft_tokens=17)),
            f"field 'native_mtp.max_draft_tokens' {MTP_DRAFTS}, got 17",
        ),
        (
            SpeculativeDecodeConfig(verify_window=VerifyWindowConfig(pipeline_depth=0)),
            "field 'verify_window.pipeline_depth' must be in 1..64, got 0",
        ),
        (
            SpeculativeDecodeConfig(verify_window=VerifyWindowConfig(pipeline_depth=65)),
            "field 'verify_window.pipeline_depth' must be in 1..64, got 65",
        ),
    ],
)
def test_validate_rules(plan: SpeculativeDecodeConfig, expected: str) -> None:
    _rejects(plan, expected)


def test_boundary_plans_are_valid() -> None:
    SpeculativeDecodeConfig(ngram=_cache(min_ngram=1, max_ngram=4)).validate()
    SpeculativeDecodeConfig(ngram=_suffix(min_ngram=3, max_ngram=64)).validate()
    SpeculativeDecodeConfig(
        verify_window=VerifyWindowConfig(min_tokens=4, pipeline_depth=64)
    ).validate()
    composite_plan().validate()


def test_validate_without_source_names_only_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^field 'verify_window.min_tokens' must be > 0, got 0$"):
        SpeculativeDecodeConfig(verify_window=VerifyWindowConfig(min_tokens=0)).validate()


def test_load_validates(write_json) -> None:
    path = write_json("plan.json", {"verify_window": {"pipeline_depth": 0}})
    with pytest.raises(ConfigError) as info:
        SpeculativeDecodeConfig.load(path)
    assert (
        str(info.value) == f"{path}: field 'verify_window.pipeline_depth' must be in 1..64, got 0"
    )


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"strategy": "auto"}, "strategy"),
        ({"native_mtp": {"enabled": True, "depth": 2}}, "native_mtp.depth"),
        ({"ngram": {"min_ngram": 1, "max_ngram": 2, "max_proposal_tokens": 3, "x": 1}}, "ngram.x"),
        ({"extension": {"max_tokens": 2, "min_tokens": 1}}, "extension.min_tokens"),
        ({"verify_window": {"runahead_tokens": 0}}, "verify_window.runahead_tokens"),
    ],
)
def test_unknown_keys_rejected_at_every_level(write_json, data: dict, field: str) -> None:
    path = write_json("plan.json", data)
    with pytest.raises(ConfigError, match=f"plan.json: field '{field}' is not a known"):
        SpeculativeDecodeConfig.load(path)


def test_runahead_budget_is_a_verify_window_field() -> None:
    """The reference's newest plans carry verify_window.runahead_max_tokens (a token count >= 0)."""
    plan = SpeculativeDecodeConfig.from_dict({"verify_window": {"runahead_max_tokens": 8}})
    assert plan.verify_window.runahead_max_tokens == 8
    with pytest.raises(ConfigError, match="runahead_max_tokens' must be a non-negative integer"):
        SpeculativeDecodeConfig.from_dict({"verify_window": {"runahead_max_tokens": -1}})


def test_ngram_fields_required_and_kind_checked() -> None:
    with pytest.raises(ConfigError, match=r"^p: field 'ngram.max_proposal_tokens' is required$"):
        SpeculativeDecodeConfig.from_dict({"ngram": {"min_ngram": 1, "max_ngram": 2}}, "p")
    bad_kind = {"kind": "trie", "min_ngram": 1, "max_ngram": 2, "max_proposal_tokens": 3}
    with pytest.raises(
        ConfigError, match=r"^p: field 'ngram.kind' must be one of 'cache', 'suffix'"
    ):
        SpeculativeDecodeConfig.from_dict({"ngram": bad_kind}, "p")


@st.composite
def valid_plans(draw: st.DrawFn) -> SpeculativeDecodeConfig:
    small = st.integers(min_value=0, max_value=16)
    mtp_max = draw(st.integers(min_value=1, max_value=16))
    native_mtp = NativeMtpConfig(
        enabled=draw(st.booleans()),
        max_draft_tokens=mtp_max,
        min_draft_tokens=draw(st.integers(min_value=0, max_value=mtp_max)),
        reject_cooldown_tokens=draw(small),
        suppress_cooldown_drafts=draw(st.booleans()),
        suppress_cooldown_draft_limit=draw(small),
    )
    ngram = None
    if draw(st.booleans()):
        kind = draw(st.sampled_from(NgramKind))
        low_min, high_max = (1, 4) if kind is NgramKind.CACHE else (3, 64)
        low = draw(st.integers(min_value=low_min, max_value=high_max))
        ngram = NgramConfig(
            kind=kind,
            min_ngram=low,
            max_ngram=draw(st.integers(min_value=low, max_value=high_max)),
            max_proposal_tokens=draw(st.integers(min_value=1, max_value=16)),
        )
    extension = None
    if native_mtp.enabled and ngram is not None and draw(st.booleans()):
        extension = NgramExtensionConfig(max_tokens=draw(st.integers(min_value=1, max_value=16)))
    window_min = draw(st.integers(min_value=1, max_value=16))
    return SpeculativeDecodeConfig(
        requested_strategy=draw(st.text(min_size=1, max_size=12).filter(str.strip)),
        effective_strategy=draw(st.text(min_size=1, max_size=12).filter(str.strip)),
        native_mtp=native_mtp,
        ngram=ngram,
        extension=extension,
        verify_window=VerifyWindowConfig(
            min_tokens=window_min,
            max_tokens=draw(st.integers(min_value=window_min, max_value=16)),
            pipeline_depth=draw(st.integers(min_value=1, max_value=64)),
        ),
    )


@given(valid_plans())
def test_round_trip_property(plan: SpeculativeDecodeConfig) -> None:
    plan.validate()
    text = plan.to_json()
    again = SpeculativeDecodeConfig.from_json(text)
    assert again == plan
    assert again.to_json() == text
    assert SpeculativeDecodeConfig.from_dict(plan.to_dict()) == plan


def test_a_plan_file_beyond_what_a_window_carries_is_refused_naming_its_field(write_json) -> None:
    """Loaded from a file, a value that used to be clamped (a window of 16 at most) or draft nothing is refused."""
    for plan, field in (({"ngram": _cache().to_dict(), "verify_window": {"max_tokens": 32}}, "verify_window.max_tokens"),
                        ({"native_mtp": {"enabled": True, "max_draft_tokens": 0}}, "native_mtp.max_draft_tokens")):
        path = write_json("plan.json", plan)
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: field '{field}' must be"):
            SpeculativeDecodeConfig.load(path)


def test_the_window_bound_is_what_the_runtime_and_the_wire_hold() -> None:
    from skippy.config.speculative import MAX_DRAFT_TOKENS  # noqa: PLC0415
    from skippy.protocol.base import MAX_MTP_DRAFT  # noqa: PLC0415
    from skippy.runtime.stage_params import MAX_DRAFT_TOKENS as RUNTIME_MAX  # noqa: PLC0415

    assert MAX_DRAFT_TOKENS == RUNTIME_MAX == MAX_MTP_DRAFT
