"""Every field of the speculative plan is honoured or refused (issue 25, item 4): `effective_strategy`
"disabled" turns speculation off even with an ngram section, a plan file without it gets the strategy
that runs, `verify_window.min_tokens` / `runahead_max_tokens` shape the windows stage 0 drafts, and
`requested_strategy` is metadata (logged, never acted on). And the flag sizing the suffix proposer's
global (cross-request) index."""

from __future__ import annotations

from typing import Any, cast

import pytest
from config_helpers import Serve

from skippy.config import ConfigError, SpeculativeDecodeConfig, VerifyWindowConfig
from skippy.config.generation import DEFAULT_GLOBAL_TOKENS, speculative_problems
from skippy.driver.speculative.engine import Speculation
from skippy.driver.speculative.global_suffix import GlobalSuffixProposerFactory
from skippy.driver.speculative.setup import DEFAULT_WINDOW, build_speculation
from skippy.driver.speculative.suffix import SuffixProposerFactory
from skippy.driver.speculative.window import FixedWindow
from skippy.runtime.stage_runtime import StageRuntime

SUFFIX = {"kind": "suffix", "min_ngram": 3, "max_ngram": 8, "max_proposal_tokens": 16}
NO_RUNTIME = cast(StageRuntime, None)  # the ngram proposers read nothing of stage 0's runtime
PERIODIC = list(range(5, 21)) * 3  # the suffix proposer continues this period of 16 tokens


def speculation_for(serve: Serve, write_json, plan: dict[str, Any], *flags: str) -> Speculation | None:
    options = serve("--openai-speculative-config", str(write_json("plan.json", plan)), *flags)
    assert speculative_problems(options.speculative) == []
    return build_speculation(options, NO_RUNTIME)


def test_a_plan_file_without_effective_strategy_gets_the_one_that_runs() -> None:
    plan = SpeculativeDecodeConfig.from_dict({"ngram": SUFFIX})
    assert plan.effective_strategy == "ngram-suffix" and plan.active_ngram == plan.ngram
    assert SpeculativeDecodeConfig.from_dict({"ngram": {**SUFFIX, "kind": "cache", "min_ngram": 1, "max_ngram": 4}}
                                             ).effective_strategy == "ngram-cache"
    assert SpeculativeDecodeConfig.from_dict(plan.to_dict()) == plan
    assert SpeculativeDecodeConfig.from_dict({}).effective_strategy == "disabled"


def test_disabled_means_no_proposer_even_with_an_ngram_section(serve: Serve, write_json) -> None:
    plan = {"effective_strategy": "disabled", "requested_strategy": "ngram", "ngram": SUFFIX}
    assert SpeculativeDecodeConfig.from_dict(plan).active_ngram is None
    assert speculation_for(serve, write_json, plan) is None
    running = speculation_for(serve, write_json, {"ngram": SUFFIX})
    assert running is not None and running.name == "suffix"


def test_disabled_plan_refuses_what_needs_a_proposer(serve: Serve, write_json) -> None:
    path = str(write_json("plan.json", {"effective_strategy": "disabled", "ngram": SUFFIX}))
    window = serve("--openai-speculative-config", path, "--openai-speculative-window", "4").speculative
    assert speculative_problems(window) == [
        "--openai-speculative-window needs a proposer: --openai-draft-model-path, or an ngram section in"
        f" --openai-speculative-config ({path} sets effective_strategy 'disabled')"]
    draft = serve("--openai-speculative-config", path, "--openai-draft-model-path", "/models/draft.gguf").speculative
    assert speculative_problems(draft) == [
        f"--openai-draft-model-path: {path} sets effective_strategy 'disabled' (speculation off); drop one"]


def test_verify_window_fields_reach_the_engine(serve: Serve, write_json) -> None:
    window = {"min_tokens": 3, "max_tokens": 6, "pipeline_depth": 2, "runahead_max_tokens": 9}
    spec = speculation_for(serve, write_json, {"ngram": SUFFIX, "verify_window": window})
    assert spec is not None and isinstance(spec.policy, FixedWindow)
    assert (spec.min_k, spec.max_k, spec.depth, spec.runahead) == (3, 6, 2, 9)
    # a draft model's k also defaults to the plan's max_tokens, whose own default is the reference's window
    assert VerifyWindowConfig().max_tokens == DEFAULT_WINDOW


def test_runahead_below_min_tokens_is_refused() -> None:
    with pytest.raises(ConfigError, match="'verify_window.runahead_max_tokens' must be 0 .no cap. or >= verify_window"):
        SpeculativeDecodeConfig.from_dict({"verify_window": {"min_tokens": 3, "max_tokens": 4, "runahead_max_tokens": 2}})


def suffix_speculation(**shape: int) -> Speculation:
    plan = SpeculativeDecodeConfig.from_dict({"ngram": SUFFIX})
    assert plan.ngram is not None
    spec = Speculation(SuffixProposerFactory(plan.ngram), FixedWindow(4), 4, **shape)
    spec.start(1, PERIODIC)
    return spec


def test_runahead_caps_the_tokens_a_session_has_in_flight() -> None:
    uncapped, _ = suffix_speculation(depth=3).draft(1, 64, 1)
    assert len(uncapped) == 3 * 5 - 1  # depth windows of [head, 4 drafts], less the first head
    capped, k = suffix_speculation(depth=3, runahead=6).draft(1, 64, 1)
    assert (len(capped), k) == (6, 4) and capped == uncapped[:6]


def test_a_proposal_shorter_than_min_tokens_decodes_plainly_as_a_shadow() -> None:
    spec = suffix_speculation(min_k=3, runahead=3)
    assert spec.draft(1, 64, 1)[1] == 4  # 3 drafts proposed: enough
    short = suffix_speculation(min_k=3)
    short.sessions[1].proposer.close()  # a history with nothing to match
    short.sessions[1].proposer.extend([1, 2, 3, 4, 1, 2])
    assert short.draft(1, 64, 1) == ([], 0)
    assert short.sessions[1].k == 0


def test_the_suffix_proposer_drafts_across_requests_within_the_global_budget(serve: Serve, write_json) -> None:
    default = speculation_for(serve, write_json, {"ngram": SUFFIX})
    assert default is not None and isinstance(default.factory, GlobalSuffixProposerFactory)
    assert default.factory.index.max_tokens == DEFAULT_GLOBAL_TOKENS
    sized = speculation_for(serve, write_json, {"ngram": SUFFIX}, "--openai-speculative-global-tokens", "128")
    assert sized is not None and isinstance(sized.factory, GlobalSuffixProposerFactory)
    assert sized.factory.index.max_tokens == 128
    own_only = speculation_for(serve, write_json, {"ngram": SUFFIX}, "--openai-speculative-global-tokens", "0")
    assert own_only is not None and isinstance(own_only.factory, SuffixProposerFactory)


def test_global_tokens_without_the_suffix_proposer_is_refused(serve: Serve, write_json) -> None:
    cache = str(write_json("plan.json", {"ngram": {"kind": "cache", "min_ngram": 1, "max_ngram": 4,
                                                   "max_proposal_tokens": 6}}))
    options = serve("--openai-speculative-config", cache, "--openai-speculative-global-tokens", "64")
    assert speculative_problems(options.speculative) == [
        f"--openai-speculative-global-tokens needs the suffix proposer (ngram.kind 'suffix' in {cache})"]
