"""Stage 0's generation options: prefill chunking and speculative decoding.

Both belong to stage 0's driver, so they are resolved from the
``--openai-prefill-*`` and speculative flags whether or not stage 0 also
serves the OpenAI API in-process (``--openai-bind-addr``): ``skippy up``
hands them to stage 0 while its broker and adapter are separate processes.
They are validated on every stage and act on stage 0.
``speculative_problems`` names the combinations that cannot work and
``prefill_problems`` the prefill flags the chosen policy would ignore (both
refused at startup by ``serving.refuse_unsupported``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from skippy.config.errors import ConfigError
from skippy.config.schema import ConfigModel, SignedInt
from skippy.config.serving_args import FlagReader
from skippy.config.speculative import (
    DISABLED,
    MAX_DRAFT_TOKENS,
    NgramConfig,
    NgramKind,
    SpeculativeDecodeConfig,
    VerifyWindowConfig,
)

__all__ = [
    "PrefillChunkOptions",
    "PrefillChunkPolicy",
    "AdaptiveWindowMode",
    "SpeculativeOptions",
    "prefill_problems",
    "resolve_prefill",
    "resolve_speculative",
    "speculative_problems",
    "DEFAULT_GLOBAL_TOKENS",
    "DEFAULT_POLICY_PLAN",
    "NO_SPECULATIVE_FLAG",
]

DEFAULT_GLOBAL_TOKENS = 65536  # --openai-speculative-global-tokens: ~14-26 MB of index at stage 0
NO_SPECULATIVE_FLAG = "--no-speculative"
# what stage 0 runs when no plan, no draft model and no --no-speculative is given: the suffix proposer (with
# the cross-request index) under the per-session policy (skippy.driver.speculative.policy), k <= 16 (<= 8 a
# session when a micro-batch holds several: policy.SHARED_MAX_K), depth <= 2
DEFAULT_POLICY_PLAN = SpeculativeDecodeConfig(
    requested_strategy="auto", effective_strategy="policy",
    ngram=NgramConfig(kind=NgramKind.SUFFIX, min_ngram=3, max_ngram=16, max_proposal_tokens=16),
    verify_window=VerifyWindowConfig(min_tokens=1, max_tokens=16, pipeline_depth=2),
)

class PrefillChunkPolicy(enum.StrEnum):
    FIXED = "fixed"
    SCHEDULE = "schedule"
    ADAPTIVE_RAMP = "adaptive-ramp"


@dataclass(frozen=True, kw_only=True)
class PrefillChunkOptions(ConfigModel):
    """How stage 0 splits a prompt's prefill into chunks."""

    policy: PrefillChunkPolicy = PrefillChunkPolicy.ADAPTIVE_RAMP
    chunk_size: int = 256
    schedule: tuple[int, ...] = ()  # non-empty only for the schedule policy
    adaptive_start: int = 128
    adaptive_step: int = 128
    adaptive_max: int = 384
    adaptive_target_ms: float = 100.0
    given: tuple[str, ...] = ()  # the --openai-prefill-* flags given (prefill_problems)


POLICY_FLAGS: dict[PrefillChunkPolicy, tuple[str, ...]] = {  # the flags each policy reads
    PrefillChunkPolicy.FIXED: ("--openai-prefill-chunk-size",),
    PrefillChunkPolicy.SCHEDULE: ("--openai-prefill-chunk-schedule",),
    PrefillChunkPolicy.ADAPTIVE_RAMP: ("--openai-prefill-adaptive-start", "--openai-prefill-adaptive-step",
                                       "--openai-prefill-adaptive-max", "--openai-prefill-adaptive-target-ms"),
}


def prefill_problems(prefill: PrefillChunkOptions) -> list[str]:
    """One line per given prefill flag that the chosen policy would ignore (empty when none)."""
    return [f"{flag} is read only by --openai-prefill-chunk-policy {policy}, but the policy is {prefill.policy}"
            for policy, flags in POLICY_FLAGS.items() if policy is not prefill.policy
            for flag in flags if flag in prefill.given]


class AdaptiveWindowMode(enum.StrEnum):
    COST = "cost"  # k maximising expected tokens per ms (C(rows) calibrated at startup)
    SIMPLE = "simple"  # k + 1 when at most the last draft was rejected, else k - 1 (SimpleAdaptiveWindow)


@dataclass(frozen=True, kw_only=True)
class SpeculativeOptions(ConfigModel):
    """Stage 0's speculative-decoding flags; None / False / the default plan = not given."""

    plan: SpeculativeDecodeConfig = field(default_factory=SpeculativeDecodeConfig)
    plan_path: str | None = None  # --openai-speculative-config
    draft_model_path: str | None = None
    speculative_window: int | None = None  # None: not given (the plan's verify_window.max_tokens then)
    adaptive_speculative_window: bool = False
    adaptive_mode: AdaptiveWindowMode = AdaptiveWindowMode.COST
    adaptive_mode_given: bool = False
    draft_n_gpu_layers: SignedInt | None = None  # None: the config's n_gpu_layers
    native_mtp_draft_model_path: str | None = None
    global_tokens: int = DEFAULT_GLOBAL_TOKENS  # --openai-speculative-global-tokens (suffix proposer only)
    global_tokens_given: bool = False
    policy: bool = False  # the default plan under the per-session policy (no plan, draft model or --no-speculative)
    no_speculative: bool = False  # --no-speculative: plain decoding, whatever else is given


def resolve_prefill(flags: FlagReader) -> PrefillChunkOptions:
    """The ``--openai-prefill-*`` flags, validated (chunk sizes > 0, target-ms finite and > 0)."""
    policy_flag, schedule_flag = "--openai-prefill-chunk-policy", "--openai-prefill-chunk-schedule"
    policy = flags.choice(
        policy_flag,
        PrefillChunkPolicy,
        PrefillChunkPolicy.ADAPTIVE_RAMP,
        aliases={"adaptive": PrefillChunkPolicy.ADAPTIVE_RAMP},
    )
    schedule = flags.int_list(schedule_flag)
    if schedule is not None:
        if flags.given(policy_flag) and policy is PrefillChunkPolicy.ADAPTIVE_RAMP:
            raise ConfigError(f"{schedule_flag} needs {policy_flag} schedule, got adaptive-ramp")
        policy = PrefillChunkPolicy.SCHEDULE  # also the legacy "fixed + schedule" form
    elif policy is PrefillChunkPolicy.SCHEDULE:
        raise ConfigError(f"{policy_flag} schedule requires {schedule_flag}")
    start = flags.integer("--openai-prefill-adaptive-start", 128)
    maximum = flags.integer("--openai-prefill-adaptive-max", 384)
    if start > maximum:
        raise ConfigError(
            f"--openai-prefill-adaptive-start must be <= --openai-prefill-adaptive-max"
            f" ({maximum}), got {start}"
        )
    return PrefillChunkOptions(
        policy=policy,
        chunk_size=flags.integer("--openai-prefill-chunk-size", 256),
        schedule=schedule or (),
        adaptive_start=start,
        adaptive_step=flags.integer("--openai-prefill-adaptive-step", 128),
        adaptive_max=maximum,
        adaptive_target_ms=flags.number(
            "--openai-prefill-adaptive-target-ms", 100.0, positive=True
        ),
        given=tuple(flag for flags_of in POLICY_FLAGS.values() for flag in flags_of if flags.given(flag)),
    )


def resolve_speculative(flags: FlagReader) -> SpeculativeOptions:
    """The speculative flags; the plan file is loaded and validated (errors name it)."""
    draft_model_path = flags.text("--openai-draft-model-path")
    window = flags.optional_integer("--openai-speculative-window", minimum=0)
    if window is not None and window > MAX_DRAFT_TOKENS:
        raise ConfigError(f"--openai-speculative-window must be <= {MAX_DRAFT_TOKENS} (a verify window carries at"
                          f" most {MAX_DRAFT_TOKENS} drafts), got {window}")
    if draft_model_path is not None and window == 0:
        raise ConfigError(
            "--openai-speculative-window must be > 0 when --openai-draft-model-path is set, got 0"
        )
    plan_path = flags.text("--openai-speculative-config")
    draft_layers = flags.optional_integer("--openai-draft-n-gpu-layers", minimum=None)
    off = flags.switch(NO_SPECULATIVE_FLAG)
    policy = plan_path is None and draft_model_path is None and not off
    return SpeculativeOptions(
        plan=SpeculativeDecodeConfig.load(plan_path) if plan_path else DEFAULT_POLICY_PLAN if policy
        else SpeculativeDecodeConfig(),
        policy=policy,
        no_speculative=off,
        plan_path=plan_path,
        draft_model_path=draft_model_path,
        speculative_window=window,
        adaptive_speculative_window=flags.switch("--openai-adaptive-speculative-window"),
        adaptive_mode=flags.choice("--openai-adaptive-speculative-window-mode", AdaptiveWindowMode,
                                   AdaptiveWindowMode.COST),
        adaptive_mode_given=flags.given("--openai-adaptive-speculative-window-mode"),
        draft_n_gpu_layers=None if draft_layers is None else SignedInt(draft_layers),
        native_mtp_draft_model_path=flags.text("--openai-native-mtp-draft-model-path"),
        global_tokens=flags.integer(GLOBAL_TOKENS_FLAG, DEFAULT_GLOBAL_TOKENS, minimum=0),
        global_tokens_given=flags.given(GLOBAL_TOKENS_FLAG),
    )


GLOBAL_TOKENS_FLAG = "--openai-speculative-global-tokens"


def _native_mtp_problems(spec: SpeculativeOptions, source: str) -> list[str]:
    """The native-MTP part of a plan that cannot run as given (docs/mtp.md)."""
    plan, lines = spec.plan, []
    mtp = plan.native_mtp.enabled and not plan.disabled
    if spec.native_mtp_draft_model_path is not None and not mtp:
        lines.append(f"--openai-native-mtp-draft-model-path needs native_mtp.enabled in --openai-speculative-config"
                     f" ({source} leaves native MTP off)")
    if not mtp:
        return lines
    if spec.draft_model_path is not None:
        lines.append(f"--openai-draft-model-path and the native MTP drafts of {source} cannot both draft; pick one")
    if plan.ngram is not None and plan.extension is None:
        lines.append(f"--openai-speculative-config: {source} sets native_mtp and an ngram proposer without an"
                     " extension: the n-gram drafts only as the tail of the MTP prefix (add extension.max_tokens)")
    if plan.extension is not None and plan.ngram is not None and plan.ngram.kind is not NgramKind.CACHE:
        lines.append(f"--openai-speculative-config: {source} extends native MTP with ngram.kind"
                     f" '{plan.ngram.kind}'; the extension tail is the n-gram cache (kind 'cache')")
    return lines


def speculative_problems(spec: SpeculativeOptions) -> list[str]:
    """One line per speculative option that cannot work as given (empty when all can)."""
    plan, source = spec.plan, spec.plan_path or ("the default plan" if spec.policy else "the speculative plan")
    lines = _native_mtp_problems(spec, source)
    if spec.no_speculative and (spec.plan_path is not None or spec.draft_model_path is not None):
        given = "--openai-speculative-config" if spec.plan_path is not None else "--openai-draft-model-path"
        lines.append(f"{NO_SPECULATIVE_FLAG} turns speculation off, but {given} asks for it; drop one")
    mtp = plan.native_mtp.enabled and not plan.disabled
    ngram = plan.active_ngram
    if spec.draft_model_path is not None and ngram is not None and not mtp:
        lines.append(f"--openai-draft-model-path and the ngram proposer of {source} cannot both draft; pick one")
    if spec.draft_model_path is not None and spec.plan_path is not None and plan.disabled:
        lines.append(f"--openai-draft-model-path: {source} sets effective_strategy '{DISABLED}' (speculation off);"
                     " drop one")
    if spec.global_tokens_given and (spec.draft_model_path is not None or ngram is None
                                     or ngram.kind is not NgramKind.SUFFIX):
        lines.append(f"{GLOBAL_TOKENS_FLAG} needs the suffix proposer (ngram.kind 'suffix' in {source})")
    if spec.draft_model_path is None and ngram is None and not mtp:
        off = f" ({source} sets effective_strategy '{DISABLED}')" if plan.ngram is not None else ""
        off = f" ({NO_SPECULATIVE_FLAG} turns speculation off)" if spec.no_speculative else off
        needs = {
            "--openai-speculative-window": spec.speculative_window is not None,
            "--openai-adaptive-speculative-window": spec.adaptive_speculative_window,
            "--openai-adaptive-speculative-window-mode": spec.adaptive_mode_given,
            "--openai-draft-n-gpu-layers": spec.draft_n_gpu_layers is not None,
        }
        lines += [f"{flag} needs a proposer: --openai-draft-model-path, or an ngram section in"
                  f" --openai-speculative-config{off}" for flag, given in needs.items() if given]
        if not plan.disabled:
            lines.append(f"--openai-speculative-config: {source} sets effective_strategy"
                         f" '{plan.effective_strategy}' but no proposer (an ngram section)")
    else:
        if spec.adaptive_mode_given and not spec.adaptive_speculative_window:
            lines.append("--openai-adaptive-speculative-window-mode needs --openai-adaptive-speculative-window")
        if spec.draft_n_gpu_layers is not None and spec.draft_model_path is None:
            lines.append(f"--openai-draft-n-gpu-layers needs --openai-draft-model-path: the ngram proposer of"
                         f" {source} runs no model")
        if spec.speculative_window == 0 and ngram is not None:
            lines.append(f"--openai-speculative-window must be > 0 with the ngram proposer of {source}, got 0")
        low = plan.verify_window.min_tokens
        if spec.speculative_window and spec.speculative_window < low:
            lines.append(f"--openai-speculative-window {spec.speculative_window} is below verify_window.min_tokens"
                         f" ({low}) of {source}: no window could carry its minimum; raise one or lower the other")
    return lines
