"""Serving options: the stage server's CLI flags resolved against its config.

``resolve_serving_options`` turns parsed flags (see ``serving_args``) into a
typed, validated :class:`ServingOptions`, applying the
defaults that depend on the stage config:
``max_inflight`` clamped to ``lane_count``, reply credit =
``max_inflight - 1``.  The front's admission options (the broker's) are
resolved by ``admission``; stage 0's generation options (prefill chunking,
speculative decoding) by ``generation``, with or without the OpenAI front.
``resolve_mtp_source`` decides where native-MTP drafts come from.
``parse_cors_origins`` checks the origins the adapter sends CORS headers to.

Flags whose feature is not built yet still resolve (so their values are
checked and visible), but ``refuse_unsupported`` fails a process that would
start with them: every entry point that starts something calls it.
"""

from __future__ import annotations

import argparse
import enum
import functools
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from skippy.config.admission import AdmissionOptions, default_queue_capacity, resolve_admission
from skippy.config.api_key import read_api_key_file
from skippy.config.cpu_sets import resolve_affinity
from skippy.config.endpoint import normalize_host, normalize_http_addr, normalize_otlp_url, normalize_zmq_endpoint
from skippy.config.errors import ConfigError, FieldError
from skippy.config.generation import (
    PrefillChunkOptions,
    PrefillChunkPolicy,
    SpeculativeOptions,
    prefill_problems,
    resolve_prefill,
    resolve_speculative,
    speculative_problems,
)
from skippy.config.http_limits import HttpLimits, resolve_http_limits
from skippy.config.schema import ConfigModel
from skippy.config.serving_args import FlagReader, Owner, add_serving_arguments
from skippy.config.stage import StageConfig
from skippy.config.topology import StageTopology, insecure_problem, secret_key_path, with_keys_dir
from skippy.config.wire import WireChoice, WireCondition

__all__ = [
    "AdmissionOptions",
    "MtpSource",
    "OpenAIOptions",
    "PrefillChunkOptions",
    "PrefillChunkPolicy",
    "ServingOptions",
    "SpeculativeOptions",
    "TelemetryLevel",
    "add_serving_arguments",
    "default_queue_capacity",
    "parse_cors_origins",
    "parse_serving_args",
    "refuse_unsupported",
    "resolve_mtp_source",
    "resolve_serving_options",
    "unsupported_options",
]


# --openai-default-max-tokens: a reply's budget when the request names none (clamped to the rest of the context);
# an answer cut at OpenAI's legacy 16 tokens is no answer for a client that never sets it (Codex does not)
DEFAULT_MAX_TOKENS = 4096
DEFAULT_RESUME_TIMEOUT_S = 60.0  # --openai-resume-timeout-s: stage 0's replays and the adapter's resumes


class TelemetryLevel(enum.StrEnum):
    OFF = "off"
    SUMMARY = "summary"
    DEBUG = "debug"


class MtpSource(enum.Enum):
    DISABLED = "disabled"
    INTEGRATED = "integrated"  # the served model's own MTP heads
    EXTERNAL = "external"  # a native-MTP sidecar GGUF


@dataclass(frozen=True, kw_only=True)
class OpenAIOptions(ConfigModel):
    """The OpenAI front of stage 0 (``--openai-bind-addr``): its broker and adapter."""

    bind_addr: str
    model_id: str
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    sse_ping_interval_s: float = 30.0  # --openai-sse-ping-interval (0: no pings)
    admission: AdmissionOptions
    api_key: str | None = field(default=None, repr=False)  # --openai-api-key(-file) (the adapter also reads its env var)
    cors_origins: tuple[str, ...] = ()  # --openai-cors-origins: () = no CORS headers, preflights without them
    strict_request_fields: bool = False  # --openai-strict-request-fields: unknown request fields are a 400
    http: HttpLimits = field(default_factory=HttpLimits)  # --openai-http-*: deadlines and the connection cap


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
    activation_wire: WireChoice = WireChoice.F32  # --activation-wire-dtype as asked (auto: wire starts in f32)
    certify_wire: bool = True  # stage 0 certifies an f16/q8/auto wire at startup (--no-activation-wire-certify)
    downstream_connect_timeout_secs: float = 60.0
    telemetry_level: TelemetryLevel = TelemetryLevel.SUMMARY
    cpu_affinity: tuple[int, ...] = ()  # this stage's CPUs (--cpu-affinity or its --stage-cpus entry); () = not pinned
    stage_cpus: tuple[tuple[int, ...], ...] = ()  # every stage's CPUs by stage_index (--stage-cpus); () = not given
    telemetry_queue_capacity: int = 1024  # telemetry events buffered for export (--telemetry-queue-capacity)
    metrics_otlp_grpc: str | None = None  # http://host:port of an OTLP gRPC collector; None: no span export
    metrics_bind: str = "127.0.0.1"  # --metrics-bind: the host /metrics listens on
    prefill: PrefillChunkOptions = field(default_factory=PrefillChunkOptions)  # stage 0's driver
    speculative: SpeculativeOptions = field(default_factory=SpeculativeOptions)  # stage 0's driver
    resume_timeout_s: float = DEFAULT_RESUME_TIMEOUT_S  # a paused or lost request's deadline (driver.replay, adapter.resume)
    openai: OpenAIOptions | None = None
    native_mtp_enabled: bool = True
    insecure_links: bool = False  # --insecure-links: plain links beyond loopback allowed (and logged)
    link_secret_key: str | None = None  # this process's CURVE secret key file (None: the topology has no keys)


def _endpoint_flag(flags: FlagReader, flag: str, *, http: bool) -> str | None:
    return flags.endpoint(flag, normalize_http_addr if http else functools.partial(normalize_zmq_endpoint, bind=True))


_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://(\[[0-9a-f:.]+\]|[a-z0-9]([a-z0-9.-]*[a-z0-9])?)(:(?P<port>[0-9]{1,5}))?")


def parse_cors_origins(text: str, flag: str) -> tuple[str, ...]:
    """A comma-separated origin list -> origins as browsers send them in `Origin`: scheme://host[:port],
    lower-cased, a trailing / dropped, duplicates once; `*` allows any origin. Raises ConfigError naming
    `flag` for anything else (a path, a missing scheme, a bad port) and for a list without origins."""
    origins: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        origin = part.lower().removesuffix("/")
        if not part:
            continue
        match = _ORIGIN.fullmatch(origin)
        if origin != "*" and (match is None or not 0 < int(match["port"] or 1) < 65536):
            raise ConfigError(f"{flag} must list origins as scheme://host[:port] (e.g. http://localhost:3000)"
                              f" or *, comma separated, got {part!r}")
        if origin not in origins:
            origins.append(origin)
    if not origins:
        raise ConfigError(f"{flag} must list at least one origin (scheme://host[:port] or *), got {text!r}")
    return tuple(origins)


def _resolve_openai(flags: FlagReader, config: StageConfig, source: str) -> OpenAIOptions | None:
    bind_addr = _endpoint_flag(flags, "--openai-bind-addr", http=True)
    if bind_addr is None:
        stray = flags.argv((Owner.BROKER, Owner.ADAPTER))
        if stray:
            raise ConfigError(
                f"{stray[0]} needs --openai-bind-addr (or give it to skippy up, which hands it"
                " to its broker or adapter)"
            )
        return None
    if not config.is_first:
        raise ConfigError(
            f"--openai-bind-addr is only allowed on stage 0, but {source} has"
            f" stage_index {config.stage_index}"
        )
    return OpenAIOptions(
        bind_addr=bind_addr,
        model_id=flags.text("--openai-model-id", config.model_id) or config.model_id,
        default_max_tokens=flags.integer("--openai-default-max-tokens", DEFAULT_MAX_TOKENS),
        sse_ping_interval_s=flags.number("--openai-sse-ping-interval", 30.0),
        admission=resolve_admission(flags, config.lane_count),
        api_key=_api_key(flags),
        cors_origins=_cors_origins(flags),
        strict_request_fields=flags.switch("--openai-strict-request-fields"),
        http=resolve_http_limits(flags),
    )


def _api_key(flags: FlagReader) -> str | None:
    """`--openai-api-key-file`'s key, else `--openai-api-key`'s (not both)."""
    path = flags.text("--openai-api-key-file")
    if path is None:
        return flags.text("--openai-api-key")
    if flags.given("--openai-api-key"):
        raise ConfigError("give --openai-api-key or --openai-api-key-file, not both")
    return read_api_key_file(path)


def _cors_origins(flags: FlagReader) -> tuple[str, ...]:
    text = flags.text("--openai-cors-origins")
    return () if text is None else parse_cors_origins(text, "--openai-cors-origins")


def _resolve_wire(flags: FlagReader, choice: WireChoice) -> WireCondition:
    delay_flag, mbps_flag = "--downstream-wire-delay-ms", "--downstream-wire-mbps"
    delay = flags.number(delay_flag, 0.0)
    mbps = flags.number(mbps_flag, 0.0, positive=True) if flags.given(mbps_flag) else None
    try:
        return WireCondition(delay_ms=delay, mbps=mbps, activation_dtype=choice.initial)
    except FieldError as error:
        raise error.as_flag(delay_flag if error.field == "delay_ms" else mbps_flag) from None


def resolve_serving_options(args: argparse.Namespace) -> ServingOptions:
    """Load the config (and topology) named by ``args`` and resolve every flag."""
    flags = FlagReader(args)
    source = flags.text("--config")
    if source is None:
        raise ConfigError("--config is required")
    config = _deterministic(flags, StageConfig.load(source), source)
    topology_path = flags.text("--topology")
    topology = None
    if topology_path is not None:
        topology = with_keys_dir(StageTopology.load(topology_path), topology_path)
        config.check_against(topology, source)
    max_inflight = min(flags.integer("--max-inflight", 4), config.lane_count)
    sync_forward = flags.switch("--no-async-prefill-forward")
    cpu_affinity, stage_cpus = resolve_affinity(flags, config, topology)
    return ServingOptions(
        config=config,
        topology=topology,
        bind_addr=_endpoint_flag(flags, "--bind-addr", http=False) or config.bind_addr,
        max_inflight=max_inflight,
        reply_credit_limit=flags.integer("--reply-credit-limit", max_inflight - 1, minimum=0),
        async_prefill_forward=flags.switch("--async-prefill-forward") or not sync_forward,
        wire=_resolve_wire(flags, wire_choice := flags.choice("--activation-wire-dtype", WireChoice, WireChoice.F32)),
        activation_wire=wire_choice,
        certify_wire=not flags.switch("--no-activation-wire-certify"),
        downstream_connect_timeout_secs=flags.number("--downstream-connect-timeout-secs", 60.0),
        telemetry_level=flags.choice("--telemetry-level", TelemetryLevel, TelemetryLevel.SUMMARY),
        cpu_affinity=cpu_affinity,
        stage_cpus=stage_cpus,
        telemetry_queue_capacity=flags.integer("--telemetry-queue-capacity", 1024),
        metrics_otlp_grpc=flags.endpoint("--metrics-otlp-grpc", normalize_otlp_url),
        metrics_bind=flags.endpoint("--metrics-bind", normalize_host) or "127.0.0.1",
        prefill=resolve_prefill(flags),
        speculative=resolve_speculative(flags),
        resume_timeout_s=flags.number("--openai-resume-timeout-s", DEFAULT_RESUME_TIMEOUT_S, positive=True),
        openai=_resolve_openai(flags, config, source),
        native_mtp_enabled=config.native_mtp_enabled,
        insecure_links=flags.switch("--insecure-links"),
        link_secret_key=_path_text(secret_key_path(topology, config.stage_id, flags.text("--link-secret-key"))),
    )


def _deterministic(flags: FlagReader, config: StageConfig, source: str) -> StageConfig:
    """`--deterministic` sets the config's `deterministic`; what cannot be deterministic is refused in one line."""
    if not flags.switch("--deterministic"):
        return config
    try:
        return replace(config, deterministic=True)
    except FieldError as error:
        raise ConfigError(f"--deterministic cannot be served with {source}: {error}") from None


def _path_text(path: Path | None) -> str | None:
    return None if path is None else str(path)


def resolve_mtp_source(options: ServingOptions) -> MtpSource:
    """Where native-MTP drafts come from (``mtp_source`` in `skippy check-config`'s output).

    Off in the config (or the runtime) -> Disabled; no OpenAI front -> Integrated (External when given the
    sidecar path, as `skippy up` gives the final stage); with a front
    the plan decides (the default plan, used when no ``--openai-speculative-config`` is given,
    has native MTP off -> Disabled); a sidecar path -> External; else Integrated.
    """
    if not options.native_mtp_enabled or not options.config.native_mtp_enabled:
        return MtpSource.DISABLED
    speculative = options.speculative
    if options.openai is None:  # a later stage: `skippy up` hands the final stage the sidecar path
        return MtpSource.EXTERNAL if speculative.native_mtp_draft_model_path is not None else MtpSource.INTEGRATED
    if not speculative.plan.native_mtp.enabled:
        return MtpSource.DISABLED
    if speculative.native_mtp_draft_model_path is not None:
        return MtpSource.EXTERNAL
    return MtpSource.INTEGRATED


def unsupported_options(options: ServingOptions) -> list[str]:
    """One line per given flag whose feature is not built yet or cannot work as combined, and plain links
    beyond loopback without --insecure-links (empty: all fine)."""
    insecure = insecure_problem(options.topology, options.bind_addr, options.insecure_links)
    return (speculative_problems(options.speculative) + prefill_problems(options.prefill)
            + deterministic_problems(options) + ([insecure] if insecure else []))


def deterministic_problems(options: ServingOptions) -> list[str]:
    """`--deterministic` with a plan that asks for native MTP drafts: refused, since the MTP head drafts from
    the shared trunk context that deterministic mode replaces by one context per lane (docs/deterministic.md)."""
    spec = options.speculative
    if not options.config.deterministic or not spec.plan.native_mtp.enabled or spec.plan.disabled:
        return []
    source = spec.plan_path or "the speculative plan"
    return [f"--deterministic and the native MTP drafts of {source} cannot be combined: native MTP drafts from the"
            " shared trunk context that --deterministic replaces by one context per lane; drop one"
            " (docs/deterministic.md)"]


def refuse_unsupported(options: ServingOptions) -> None:
    """Fail (one line naming each flag) before anything starts with an unsupported flag."""
    lines = unsupported_options(options)
    if lines:
        raise ConfigError("; ".join(lines))


class _RaisingParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are ConfigErrors instead of exits."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message)


def parse_serving_args(argv: list[str]) -> ServingOptions:
    """Parse ``argv`` (without the program name) and resolve it."""
    parser = _RaisingParser(prog="skippy-stage", description="Run one skippy stage.")
    add_serving_arguments(parser)
    return resolve_serving_options(parser.parse_args(argv))
