"""Serving options: the stage server's CLI flags resolved against its config.

``resolve_serving_options`` turns parsed flags (see ``serving_args``) into a
typed, validated :class:`ServingOptions`, applying the reference
``serve-binary`` defaults (notes §3.4) that depend on the stage config:
generation concurrency = ``lane_count``, queue capacity =
``clamp(8 * concurrency, 16, 256)``, ``max_inflight`` clamped to
``lane_count``, reply credit = ``max_inflight - 1``.  ``resolve_mtp_source``
decides where native-MTP drafts come from.
"""

from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass, field

from skippy.config.endpoint import normalize_http_addr, normalize_zmq_endpoint
from skippy.config.errors import ConfigError, FieldError
from skippy.config.schema import ConfigModel
from skippy.config.serving_args import FlagReader, add_serving_arguments
from skippy.config.speculative import SpeculativeDecodeConfig
from skippy.config.stage import StageConfig, StageTopology
from skippy.config.wire import WireCondition

__all__ = [
    "AdmissionOptions",
    "MtpSource",
    "OpenAIOptions",
    "PrefillChunkOptions",
    "PrefillChunkPolicy",
    "ServingOptions",
    "TelemetryLevel",
    "add_serving_arguments",
    "default_queue_capacity",
    "parse_serving_args",
    "resolve_mtp_source",
    "resolve_serving_options",
]


class TelemetryLevel(enum.StrEnum):
    OFF = "off"
    SUMMARY = "summary"
    DEBUG = "debug"


class PrefillChunkPolicy(enum.StrEnum):
    FIXED = "fixed"
    SCHEDULE = "schedule"
    ADAPTIVE_RAMP = "adaptive-ramp"


class MtpSource(enum.Enum):
    DISABLED = "disabled"
    INTEGRATED = "integrated"  # the served model's own MTP heads
    EXTERNAL = "external"  # a native-MTP sidecar GGUF


@dataclass(frozen=True, kw_only=True)
class AdmissionOptions(ConfigModel):
    """Generation admission: execution permits, wait queue and its timeout."""

    generation_concurrency: int
    adaptive: bool = False
    adaptive_min_concurrency: int | None = None  # set only when adaptive
    queue_capacity: int
    admission_timeout_secs: float = 0.0  # 0 = wait until the client cancels


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
class OpenAIOptions(ConfigModel):
    """The embedded OpenAI front (stage 0 only)."""

    bind_addr: str
    model_id: str
    default_max_tokens: int = 16
    admission: AdmissionOptions
    prefill: PrefillChunkOptions
    speculative: SpeculativeDecodeConfig | None = None
    draft_model_path: str | None = None
    speculative_window: int = 4
    adaptive_speculative_window: bool = False
    native_mtp_draft_model_path: str | None = None


@dataclass(frozen=True, kw_only=True)
class ServingOptions(ConfigModel):
    """Everything a stage server needs at startup, resolved and validated."""

    config: StageConfig
    topology: StageTopology | None = None
    bind_addr: str
    max_inflight: int
    reply_credit_limit: int
    async_prefill_forward: bool = True
    wire: WireCondition = field(default_factory=WireCondition)
    downstream_connect_timeout_secs: float = 60.0
    telemetry_level: TelemetryLevel = TelemetryLevel.SUMMARY
    metrics_otlp_grpc: str | None = None
    openai: OpenAIOptions | None = None
    native_mtp_enabled: bool = True


def default_queue_capacity(concurrency: int) -> int:
    """The reference default: ``clamp(8 * concurrency, 16, 256)``."""
    return min(max(8 * concurrency, 16), 256)


def _endpoint_flag(flags: FlagReader, flag: str, *, http: bool) -> str | None:
    value = flags.text(flag)
    if value is None:
        return None
    try:
        return normalize_http_addr(value) if http else normalize_zmq_endpoint(value, bind=True)
    except ValueError as error:
        raise ConfigError(f"{flag} {error}") from None


def _resolve_admission(flags: FlagReader, lane_count: int) -> AdmissionOptions:
    flag = "--openai-generation-concurrency"
    concurrency = flags.integer(flag, lane_count)
    if concurrency > lane_count:
        raise ConfigError(f"{flag} must be <= lane_count ({lane_count}), got {concurrency}")
    adaptive = flags.switch("--openai-adaptive-generation-concurrency")
    min_flag = "--openai-adaptive-generation-min-concurrency"
    if not adaptive and flags.given(min_flag):
        raise ConfigError(f"{min_flag} requires --openai-adaptive-generation-concurrency")
    min_concurrency = flags.integer(min_flag, 1) if adaptive else None
    if min_concurrency is not None and min_concurrency > concurrency:
        raise ConfigError(f"{min_flag} must be <= {flag} ({concurrency}), got {min_concurrency}")
    return AdmissionOptions(
        generation_concurrency=concurrency,
        adaptive=adaptive,
        adaptive_min_concurrency=min_concurrency,
        queue_capacity=flags.integer(
            "--openai-generation-queue-capacity", default_queue_capacity(concurrency)
        ),
        admission_timeout_secs=flags.number("--openai-generation-admission-timeout-secs", 0.0),
    )


def _resolve_prefill(flags: FlagReader) -> PrefillChunkOptions:
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


def _resolve_openai(flags: FlagReader, config: StageConfig, source: str) -> OpenAIOptions | None:
    bind_addr = _endpoint_flag(flags, "--openai-bind-addr", http=True)
    if bind_addr is None:
        return None
    if not config.is_first:
        raise ConfigError(
            f"--openai-bind-addr is only allowed on stage 0, but {source} has"
            f" stage_index {config.stage_index}"
        )
    draft_model_path = flags.text("--openai-draft-model-path")
    window = flags.integer("--openai-speculative-window", 4, minimum=0)
    if draft_model_path is not None and window == 0:
        raise ConfigError(
            "--openai-speculative-window must be > 0 when --openai-draft-model-path is set, got 0"
        )
    plan_path = flags.text("--openai-speculative-config")
    plan = SpeculativeDecodeConfig.load(plan_path) if plan_path is not None else None
    sidecar = flags.text("--openai-native-mtp-draft-model-path")
    if sidecar is not None:
        if not config.native_mtp_enabled:
            reason = f"{source} sets native_mtp_enabled = false"
        elif plan is not None and not plan.native_mtp.enabled:
            reason = f"{plan_path} sets native_mtp.enabled = false"
        else:
            reason = None
        if reason is not None:
            raise ConfigError(
                f"--openai-native-mtp-draft-model-path requires native MTP, but {reason}"
            )
    return OpenAIOptions(
        bind_addr=bind_addr,
        model_id=flags.text("--openai-model-id", config.model_id) or config.model_id,
        default_max_tokens=flags.integer("--openai-default-max-tokens", 16),
        admission=_resolve_admission(flags, config.lane_count),
        prefill=_resolve_prefill(flags),
        speculative=plan,
        draft_model_path=draft_model_path,
        speculative_window=window,
        adaptive_speculative_window=flags.switch("--openai-adaptive-speculative-window"),
        native_mtp_draft_model_path=sidecar,
    )


def _resolve_wire(flags: FlagReader) -> WireCondition:
    delay_flag, mbps_flag = "--downstream-wire-delay-ms", "--downstream-wire-mbps"
    delay = flags.number(delay_flag, 0.0)
    mbps = flags.number(mbps_flag, 0.0, positive=True) if flags.given(mbps_flag) else None
    try:
        return WireCondition(delay_ms=delay, mbps=mbps)
    except FieldError as error:
        raise error.as_flag(delay_flag if error.field == "delay_ms" else mbps_flag) from None


def resolve_serving_options(args: argparse.Namespace) -> ServingOptions:
    """Load the config (and topology) named by ``args`` and resolve every flag."""
    flags = FlagReader(args)
    source = flags.text("--config")
    if source is None:
        raise ConfigError("--config is required")
    config = StageConfig.load(source)
    topology_path = flags.text("--topology")
    topology = None
    if topology_path is not None:
        topology = StageTopology.load(topology_path)
        config.check_against(topology, source)
    max_inflight = min(flags.integer("--max-inflight", 4), config.lane_count)
    sync_forward = flags.switch("--no-async-prefill-forward")
    return ServingOptions(
        config=config,
        topology=topology,
        bind_addr=_endpoint_flag(flags, "--bind-addr", http=False) or config.bind_addr,
        max_inflight=max_inflight,
        reply_credit_limit=flags.integer("--reply-credit-limit", max_inflight - 1, minimum=0),
        async_prefill_forward=flags.switch("--async-prefill-forward") or not sync_forward,
        wire=_resolve_wire(flags),
        downstream_connect_timeout_secs=flags.number("--downstream-connect-timeout-secs", 60.0),
        telemetry_level=flags.choice("--telemetry-level", TelemetryLevel, TelemetryLevel.SUMMARY),
        metrics_otlp_grpc=flags.text("--metrics-otlp-grpc"),
        openai=_resolve_openai(flags, config, source),
        native_mtp_enabled=config.native_mtp_enabled,
    )


def resolve_mtp_source(options: ServingOptions) -> MtpSource:
    """Where native-MTP drafts come from (notes §9.1 "MTP source resolution")."""
    if not options.native_mtp_enabled or not options.config.native_mtp_enabled:
        return MtpSource.DISABLED
    if options.openai is None:
        return MtpSource.INTEGRATED
    plan = options.openai.speculative
    if plan is not None and not plan.native_mtp.enabled:
        return MtpSource.DISABLED
    if options.openai.native_mtp_draft_model_path is not None:
        return MtpSource.EXTERNAL
    return MtpSource.INTEGRATED


class _RaisingParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are ConfigErrors instead of exits."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message)


def parse_serving_args(argv: list[str]) -> ServingOptions:
    """Parse ``argv`` (without the program name) and resolve it."""
    parser = _RaisingParser(prog="skippy-stage", description="Run one skippy stage.")
    add_serving_arguments(parser)
    return resolve_serving_options(parser.parse_args(argv))
