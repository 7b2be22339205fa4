"""`skippy broker --bind ENDPOINT --pipeline TOPOLOGY.json [--pipeline ...] [admission flags]`: the broker's flags,
resolved into `BrokerSettings` for its process (brokers.broker_main). Also runnable as `python -m skippy.cli.broker`."""


from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace

from brokers.broker_main import BrokerSettings, run
from skippy.config import (
    ConfigError,
    FlagReader,
    Owner,
    StageTopology,
    add_serving_arguments,
    resolve_admission,
)
from skippy.config.endpoint import normalize_host, normalize_zmq_endpoint
from skippy.config.link_keys import non_loopback
from skippy.config.topology import with_keys_dir
from skippy.telemetry.options import add_telemetry_arguments, resolve_telemetry
from skippy.transport.curve_keys import client_link_keys
from skippy.transport.endpoints import request_endpoint

__all__ = ["main", "register", "resolve_broker_settings", "run_broker"]


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


def run_broker(args: argparse.Namespace) -> int:
    return run(resolve_broker_settings(args))


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
