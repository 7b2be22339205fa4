"""`skippy broker --bind ENDPOINT --pipeline TOPOLOGY.json [--pipeline ...] [admission flags]`: run the broker.

Each `--pipeline` topology names one pipeline replica; the broker talks to its stage 0 request
endpoint (`request_endpoint(topology.first().endpoint)`).  The process logs `ready` once its
socket is bound (pipeline readiness is separate: see `pipeline_ready` lines and Status), and on
SIGTERM/SIGINT fails queued and running requests with code "unavailable" ("broker stopping"),
closes its sockets, logs `stopped` and exits 0.  Also runnable as `python -m skippy.cli.broker`.
The admission flags are stage 0's `--openai-generation-*` flags, declared and resolved by
skippy.config (`resolve_admission`, without a lane_count: unset values follow each pipeline's);
`skippy up` and stage 0's front write them with `AdmissionOptions.to_flags`. The telemetry flags
are a stage's (`--telemetry-level`, `--telemetry-queue-capacity`, `--metrics-otlp-grpc`); the
broker serves its own /metrics (URL in its `ready` line).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

import zmq
import zmq.asyncio

from brokers import Broker
from skippy.config import (
    AdmissionOptions,
    ConfigError,
    FlagReader,
    Owner,
    StageTopology,
    TelemetryLevel,
    add_serving_arguments,
    resolve_admission,
)
from skippy.config.endpoint import normalize_zmq_endpoint
from skippy.config.topology import with_keys_dir
from skippy.log import configure_logging
from skippy.stage.links import ignore_signals, stop_on_signals
from skippy.telemetry.options import TelemetryOptions, add_telemetry_arguments, resolve_telemetry
from skippy.telemetry.process import start_telemetry
from skippy.transport.curve_guard import LinkKeys, secure
from skippy.transport.curve_keys import client_link_keys
from skippy.transport.endpoints import request_endpoint

__all__ = ["BrokerSettings", "main", "register", "resolve_broker_settings", "run_broker"]


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


def add_broker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", metavar="ENDPOINT", default=None,
                        help="ZeroMQ endpoint adapters connect to (tcp://HOST:PORT or ipc://PATH)")
    parser.add_argument("--pipeline", metavar="TOPOLOGY.json", action="append", default=None,
                        help="a pipeline replica's topology (repeatable); the broker talks to its stage 0")
    parser.add_argument("--link-secret-key", metavar="PATH", default=None,
                        help="the broker's CURVE secret key (default: <keys_dir>/client.key_secret of a topology with keys)")
    add_serving_arguments(parser, [Owner.BROKER])
    add_telemetry_arguments(parser)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("broker", help="run the admission broker in front of one or more pipelines")
    add_broker_arguments(p)
    p.set_defaults(run=run_broker)


def resolve_broker_settings(args: argparse.Namespace) -> BrokerSettings:
    """Validated settings from parsed flags; any bad value is a one-line ConfigError naming its flag."""
    flags = FlagReader(args)
    bind = flags.text("--bind")
    if bind is None:
        raise ConfigError("--bind is required")
    try:
        bind = normalize_zmq_endpoint(bind, bind=True)
    except ValueError as error:
        raise ConfigError(f"--bind {error}") from None
    paths = flags.raw("--pipeline") or []
    if not paths:
        raise ConfigError("--pipeline is required (a topology file; repeat it for each replica)")
    admission = resolve_admission(flags)
    telemetry = resolve_telemetry(args, {"stage_id": "broker"})
    topologies = [with_keys_dir(StageTopology.load(path), path) for path in paths]  # last: flag mistakes first
    return BrokerSettings(
        bind=bind,
        pipelines=tuple(request_endpoint(t.first().endpoint) for t in topologies),
        stage0_ids=tuple(t.first().stage_id for t in topologies),
        admission=admission,
        telemetry_level=telemetry.level,
        telemetry=replace(telemetry, resource={"topology_id": topologies[0].topology_id,
                                               "model_id": topologies[0].model_id, **telemetry.resource}),
        link_keys=client_link_keys(topologies, flags.text("--link-secret-key")),
    )


async def serve(settings: BrokerSettings) -> int:
    """Run until SIGTERM/SIGINT, then stop cleanly."""
    stopped = asyncio.Event()
    stop_on_signals(stopped)
    link_ctx = zmq.asyncio.Context() if settings.link_keys is not None else None
    if link_ctx is not None and settings.link_keys is not None:
        secure(link_ctx, settings.link_keys)
    broker = Broker(settings.bind, settings.pipelines, settings.admission, stage0_ids=settings.stage0_ids,
                    link_ctx=link_ctx)
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


def run_broker(args: argparse.Namespace) -> int:
    settings = resolve_broker_settings(args)
    configure_logging(str(settings.telemetry_level), role="broker", stage_id="broker")
    start_telemetry(settings.telemetry, "broker", settings.bind)
    return asyncio.run(serve(settings))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m skippy.cli.broker ...`: the same command without the `skippy` dispatcher."""
    parser = argparse.ArgumentParser(prog="skippy broker", description="Run the admission broker.")
    add_broker_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_broker(args)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"skippy broker: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
