"""Stage 0's generation options: prefill chunking and speculative decoding.

Both belong to stage 0's driver, so they are resolved from the
``--openai-prefill-*`` and speculative flags whether or not stage 0 also
serves the OpenAI API in-process (``--openai-bind-addr``): ``skippy up``
hands them to stage 0 while its broker and adapter are separate processes.
They are validated on every stage (as in the reference) and act on stage 0.
Speculative decoding is not implemented yet (issue 9); its flags resolve here
and are refused at startup by ``serving.refuse_unsupported``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from skippy.config.errors import ConfigError
from skippy.config.schema import ConfigModel, SignedInt
from skippy.config.serving_args import FlagReader
from skippy.config.speculative import SpeculativeDecodeConfig

__all__ = [
    "PrefillChunkOptions",
    "PrefillChunkPolicy",
    "SpeculativeOptions",
    "resolve_prefill",
    "resolve_speculative",
]

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


@dataclass(frozen=True, kw_only=True)
class SpeculativeOptions(ConfigModel):
    """Stage 0's speculative-decoding flags; None / False / the default plan = not given."""

    plan: SpeculativeDecodeConfig = field(default_factory=SpeculativeDecodeConfig)
    plan_path: str | None = None  # --openai-speculative-config
    draft_model_path: str | None = None
    speculative_window: int | None = None  # None: not given (the reference's default is 4)
    adaptive_speculative_window: bool = False
    draft_n_gpu_layers: SignedInt | None = None  # None: the config's n_gpu_layers
    native_mtp_draft_model_path: str | None = None


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
    )


def resolve_speculative(flags: FlagReader) -> SpeculativeOptions:
    """The speculative flags; the plan file is loaded and validated (errors name it)."""
    draft_model_path = flags.text("--openai-draft-model-path")
    window = flags.optional_integer("--openai-speculative-window", minimum=0)
    if draft_model_path is not None and window == 0:
        raise ConfigError(
            "--openai-speculative-window must be > 0 when --openai-draft-model-path is set, got 0"
        )
    plan_path = flags.text("--openai-speculative-config")
    return SpeculativeOptions(
        plan=SpeculativeDecodeConfig.load(plan_path) if plan_path else SpeculativeDecodeConfig(),
        plan_path=plan_path,
        draft_model_path=draft_model_path,
        speculative_window=window,
        adaptive_speculative_window=flags.switch("--openai-adaptive-speculative-window"),
        draft_n_gpu_layers=flags.optional_integer("--openai-draft-n-gpu-layers", minimum=None),
        native_mtp_draft_model_path=flags.text("--openai-native-mtp-draft-model-path"),
    )
