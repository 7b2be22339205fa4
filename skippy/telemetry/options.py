"""Telemetry settings of one process: level, event-queue capacity, OTLP endpoint, resource attributes.

Stages read them from their serving flags (`--telemetry-level`, `--telemetry-queue-capacity`,
`--metrics-otlp-grpc`, resolved in `skippy.config.serving`); the broker and the adapter declare the
same flags with `add_telemetry_arguments`, and whoever launches them (`skippy up`, stage 0's OpenAI
front) hands them on with `TelemetryOptions.to_flags`, so every child process runs at the level and
exports where the stages do. Levels: `off` exports nothing, `summary`
(default) exports request-level totals and lifecycle spans, `debug` adds per-message spans.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field

from skippy.config import FlagReader, ServingOptions, StageConfig, TelemetryLevel
from skippy.config.endpoint import normalize_otlp_url

__all__ = ["DEFAULT_QUEUE_CAPACITY", "Resource", "TelemetryOptions", "add_telemetry_arguments", "resolve_telemetry",
           "stage_resource"]

DEFAULT_QUEUE_CAPACITY = 1024  # --telemetry-queue-capacity's default
Resource = Mapping[str, str | int]


@dataclass(frozen=True)
class TelemetryOptions:
    level: TelemetryLevel = TelemetryLevel.SUMMARY
    queue_capacity: int = DEFAULT_QUEUE_CAPACITY
    otlp_endpoint: str | None = None  # http://host:port of an OTLP gRPC collector; None: no span export
    run_id: str | None = None  # the pipeline's run id, for processes without a stage config
    resource: Mapping[str, str | int] = field(default_factory=dict)

    @classmethod
    def from_serving(cls, options: ServingOptions) -> TelemetryOptions:
        """A stage's telemetry: its flags, and the span resource attributes from its config."""
        return cls(options.telemetry_level, options.telemetry_queue_capacity, options.metrics_otlp_grpc,
                   options.config.run_id, stage_resource(options.config))

    def to_flags(self) -> list[str]:
        """These options as the flags `add_telemetry_arguments` declares (for a child process)."""
        flags = ["--telemetry-level", str(self.level), "--telemetry-queue-capacity", str(self.queue_capacity)]
        if self.otlp_endpoint is not None:
            flags += ["--metrics-otlp-grpc", self.otlp_endpoint]
        if self.run_id is not None:
            flags += ["--telemetry-run-id", self.run_id]
        return flags


def stage_resource(config: StageConfig) -> dict[str, str | int]:
    """The span resource attributes of a stage process (what identifies its spans at a collector)."""
    return {"run_id": config.run_id, "model_id": config.model_id, "topology_id": config.topology_id,
            "stage_id": config.stage_id, "stage_index": config.stage_index, "layer_start": config.layer_start,
            "layer_end": config.layer_end, "load_mode": str(config.load_mode)}


def add_telemetry_arguments(parser: argparse.ArgumentParser) -> None:
    """The telemetry flags of a process that is not a stage (broker, adapter)."""
    for flag, metavar, text in (
            ("--telemetry-level", "LEVEL", "off | summary | debug (default summary)"),
            ("--telemetry-queue-capacity", "N", f"events buffered for export (default {DEFAULT_QUEUE_CAPACITY})"),
            ("--metrics-otlp-grpc", "URL", "export spans to this OTLP gRPC collector"),
            ("--telemetry-run-id", "ID", "the pipeline's run id (a span resource attribute)")):
        parser.add_argument(flag, metavar=metavar, default=None, help=text)


def resolve_telemetry(args: argparse.Namespace, resource: Resource) -> TelemetryOptions:
    """Validated telemetry options from `add_telemetry_arguments` flags; bad values are one-line ConfigErrors."""
    flags = FlagReader(args)
    endpoint = flags.endpoint("--metrics-otlp-grpc", normalize_otlp_url)
    run_id = flags.text("--telemetry-run-id")
    return TelemetryOptions(flags.choice("--telemetry-level", TelemetryLevel, TelemetryLevel.SUMMARY),
                            flags.integer("--telemetry-queue-capacity", DEFAULT_QUEUE_CAPACITY), endpoint, run_id,
                            {**({"run_id": run_id} if run_id else {}), **resource})
