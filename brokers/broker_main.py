"""The broker process: `skippy broker`'s main (its flags are read in skippy.cli.broker).

Each `--pipeline` topology names one pipeline replica; the broker talks to its stage 0 request
endpoint (`request_endpoint(topology.first().endpoint)`).  The process logs `ready` once its
socket is bound (pipeline readiness is separate: see `pipeline_ready` lines and Status), and on
SIGTERM/SIGINT fails queued and running requests with code "unavailable" ("broker stopping"),
closes its sockets, logs `stopped` and exits 0.
The admission flags are stage 0's `--openai-generation-*` flags, declared and resolved by
skippy.config (`resolve_admission`, without a lane_count: unset values follow each pipeline's);
`skippy up` and stage 0's front write them with `AdmissionOptions.to_flags`. The telemetry flags
are a stage's (`--telemetry-level`, `--telemetry-queue-capacity`, `--metrics-otlp-grpc`); the
broker serves its own /metrics on `--metrics-bind` (default loopback; URL in its `ready` line), behind
`$SKIPPY_OPENAI_API_KEY` when set.

Its socket: when its topologies have link keys and it binds tcp, its ROUTER is a CURVE server with the
client pair it already dials stage 0 with (`--link-secret-key`, default `<keys_dir>/client.key_secret`)
admitting only the topologies' `clients` (`skippy adapter --link-secret-key`); on ipc:// it stays plain
(the run directory guards it: `skippy up`, stage 0's front). A non-loopback bind without keys is
refused unless `--insecure-links` (then logged as a warning), as a stage's plain links are.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from brokers import Broker
from skippy.config import (
    AdmissionOptions,
    ConfigError,
    TelemetryLevel,
)
from skippy.log import configure_logging, get_logger
from skippy.supervise import ignore_signals, stop_on_signals
from skippy.telemetry.options import TelemetryOptions
from skippy.telemetry.process import start_telemetry
from skippy.transport.curve_guard import LinkKeys, secure


@dataclass(frozen=True)
class BrokerSettings:
    """Everything `skippy broker` needs, resolved and validated."""

    bind: str
    pipelines: tuple[str, ...]  # stage 0 request endpoints
    stage0_ids: tuple[str, ...]
    admission: AdmissionOptions
    telemetry_level: TelemetryLevel
    telemetry: TelemetryOptions
    link_keys: LinkKeys | None = None  # CURVE toward the pipelines (their topologies name keys)
    serve_keys: LinkKeys | None = field(default=None, repr=False)  # CURVE on its own socket (keyed, on tcp)
    insecure_links: bool = False  # --insecure-links: a plain socket beyond loopback allowed (and logged)
    metrics_bind: str = "127.0.0.1"


async def serve(settings: BrokerSettings) -> int:
    """Run until SIGTERM/SIGINT, then stop cleanly."""
    stopped = asyncio.Event()
    stop_on_signals(stopped)
    if settings.insecure_links:
        get_logger().warning("insecure_links", error="--insecure-links: the broker's socket is plain ZeroMQ, neither"
                             " authenticated nor encrypted; anyone who reaches it submits requests", bind=settings.bind)
    keys = settings.serve_keys or settings.link_keys  # its own socket keyed too: one secured context for both
    link_ctx = zmq.asyncio.Context() if keys is not None else None
    if link_ctx is not None and keys is not None:
        secure(link_ctx, keys)
    broker = Broker(settings.bind, settings.pipelines, settings.admission, stage0_ids=settings.stage0_ids,
                    ctx=link_ctx if settings.serve_keys is not None else None, link_ctx=link_ctx)
    try:
        try:
            await broker.start()
        except zmq.ZMQError as exc:
            await broker.close("cannot bind")
            raise ConfigError(f"--bind {settings.bind}: cannot bind ({exc})") from None
        try:
            await stopped.wait()
            ignore_signals()
        finally:
            await broker.close("broker stopping")
    finally:
        if link_ctx is not None:
            link_ctx.term()
    return 0


def run(settings: BrokerSettings) -> int:
    configure_logging(str(settings.telemetry_level), role="broker", stage_id="broker")
    start_telemetry(settings.telemetry, "broker", settings.bind, metrics_bind=settings.metrics_bind)
    return asyncio.run(serve(settings))
