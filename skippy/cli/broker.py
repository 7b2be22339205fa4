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
broker serves its own /metrics on `--metrics-bind` (default loopback; URL in its `ready` line), behind
`$SKIPPY_OPENAI_API_KEY` when set.

Its socket: when its topologies have link keys and it binds tcp, its ROUTER is a CURVE server with the
client pair it already dials stage 0 with (`--link-secret-key`, default `<keys_dir>/client.key_secret`)
admitting only the topologies' `clients` (`skippy adapter --link-secret-key`); on ipc:// it stays plain
(the run directory guards it: `skippy up`, stage 0's front). A non-loopback bind without keys is
refused unless `--insecure-links` (then logged as a warning), as a stage's plain links are.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

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
from skippy.config.endpoint import normalize_host, normalize_zmq_endpoint
from skippy.config.link_keys import non_loopback
from skippy.config.topology import with_keys_dir
from skippy.log import configure_logging, get_logger
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
    serve_keys: LinkKeys | None = field(default=None, repr=False)  # CURVE on its own socket (keyed, on tcp)
    insecure_links: bool = False  # --insecure-links: a plain socket beyond loopback allowed (and logged)
    metrics_bind: str = "127.0.0.1"


def add_broker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", metavar="ENDPOINT", default=None,
                        help="ZeroMQ endpoint adapters connect to (tcp://HOST:PORT or ipc://PATH)")
    parser.add_argument("--pipeline", metavar="TOPOLOGY.json", action="append", default=None,
                        help="a pipeline replica's topology (repeatable); the broker talks to its stage 0")
    parser.add_argument("--link-secret-key", metavar="PATH", default=None,
                        help="the broker's CURVE secret key, toward stage 0 and for its own socket on tcp"
                             " (default: <keys_dir>/client.key_secret of a topology with keys)")
    parser.add_argument("--insecure-links", action="store_true", default=None,
                        help="allow a plain (unauthenticated) --bind on a non-loopback address (logged)")
    parser.add_argument("--metrics-bind", metavar="HOST", default=None,
                        help="where the broker's /metrics listens (default 127.0.0.1)")
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
    metrics_bind = flags.endpoint("--metrics-bind", normalize_host) or "127.0.0.1"
    topologies = [with_keys_dir(StageTopology.load(path), path) for path in paths]  # last: flag mistakes first
    link_keys = client_link_keys(topologies, flags.text("--link-secret-key"))
    serve_keys = None
    if link_keys is not None and bind.startswith("tcp://"):
        clients = {c.public_key.encode(): c.name for t in topologies if t.first().public_key for c in t.clients}
        serve_keys = replace(link_keys, allowed=clients)
    elif non_loopback(bind) and not flags.switch("--insecure-links"):
        raise ConfigError(f"broker --bind {bind} is a non-loopback address without link keys: give it --pipeline"
                          " topologies with keys (`skippy keys --topology FILE`) to authenticate and encrypt its socket,"
                          " or pass --insecure-links to serve it in the clear")
    return BrokerSettings(
        bind=bind,
        pipelines=tuple(request_endpoint(t.first().endpoint) for t in topologies),
        stage0_ids=tuple(t.first().stage_id for t in topologies),
        admission=admission,
        telemetry_level=telemetry.level,
        telemetry=replace(telemetry, resource={"topology_id": topologies[0].topology_id,
                                               "model_id": topologies[0].model_id, **telemetry.resource}),
        link_keys=link_keys,
        serve_keys=serve_keys,
        insecure_links=serve_keys is None and non_loopback(bind),
        metrics_bind=metrics_bind,
    )


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


def run_broker(args: argparse.Namespace) -> int:
    settings = resolve_broker_settings(args)
    configure_logging(str(settings.telemetry_level), role="broker", stage_id="broker")
    start_telemetry(settings.telemetry, "broker", settings.bind, metrics_bind=settings.metrics_bind)
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
