"""`skippy adapter --broker ENDPOINT --model PATH`: the OpenAI HTTP front door for a broker.

Besides the OpenAI routes it serves its own /metrics and the live pipeline page /dashboard, which
shows every process listed in `--metrics-targets` (the run's metrics-targets.json; skippy.http.dashboard);
`OpenAIAdapter.router` is its one route table, every route behind the API key but /health and /readyz.
The key comes from `$SKIPPY_OPENAI_API_KEY` (how `skippy up` hands it over), `--openai-api-key-file`,
or `--openai-api-key` (warned about: visible on the command line); a non-loopback `--bind` without a
key is warned about too. A broker serving CURVE (its topologies have keys and it binds tcp) is reached
with `--link-secret-key` (this adapter's pair, a client of the topology) and `--broker-public-key`
(default: that pair's own public key, as when the broker serves with the same `client` pair).
On SIGTERM every request still generating fails with code unavailable ("the OpenAI adapter is
stopping"): an open stream gets its error event and `[DONE]`, a waiting response a 503, and both up to
STOP_GRACE_S to be sent before the connections close; never a cut answer without a reason.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import zmq.asyncio

from skippy.client import PipelineClient
from skippy.config import ConfigError
from skippy.config.api_key import COMMAND_LINE_WARNING, open_bind_warning, read_api_key_file
from skippy.config.errors import FieldError
from skippy.config.http_limits import ADAPTER_FLAGS, resolve_http_limits
from skippy.config.link_keys import check_public_key
from skippy.config.serving import parse_cors_origins
from skippy.config.serving_args import FlagReader
from skippy.http.adapter import OpenAIAdapter
from skippy.http.auth import API_KEY_ENV, api_key_from
from skippy.http.chat_template import ChatTemplate
from skippy.http.cors import CorsPolicy
from skippy.http.metrics import DirectEventsCollector
from skippy.http.resubmit import DEFAULT_RESUME_TIMEOUT_S
from skippy.http.server import HttpServer
from skippy.log import announce_ready, configure_logging, get_logger
from skippy.restarts import RestartsCollector
from skippy.runtime.models import resolve_model_path
from skippy.runtime.slices import read_model_info
from skippy.runtime.tokenizer import Tokenizer
from skippy.stage.links import ignore_signals, stop_on_signals
from skippy.telemetry.options import add_telemetry_arguments, resolve_telemetry
from skippy.telemetry.process import start_telemetry
from skippy.transport.curve_guard import LinkKeys, secure
from skippy.transport.curve_keys import load_key_pair

STOP_GRACE_S = 2.0  # on SIGTERM, open responses get this long to send their error event and end


def split_host_port(text: str, flag: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{flag} must look like HOST:PORT, got {text!r}")
    return host, int(port)


def ipc_only(text: str) -> str:
    """`--events-endpoint`: stage 0 pushes events only to an ipc endpoint (on its own host)."""
    if not text.startswith("ipc://") or len(text) <= len("ipc://"):
        raise argparse.ArgumentTypeError(f"--events-endpoint must be ipc://PATH, got {text!r}")
    return text


def positive_seconds(text: str) -> float:
    """`--openai-resume-timeout-s`: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--openai-resume-timeout-s must be a number of seconds > 0, got {text!r}")
    return value


def cors_origins(text: str) -> tuple[str, ...]:
    """`--cors-origins`: checked as `skippy up --openai-cors-origins` is (blank: none)."""
    if not text.strip():
        return ()
    try:
        return parse_cors_origins(text, "--cors-origins")
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("adapter", help="serve the OpenAI HTTP API in front of a broker")
    p.add_argument("--broker", required=True, help="the broker's endpoint, e.g. ipc:///run/broker.sock")
    p.add_argument("--events-endpoint", default=None, metavar="ipc://PATH", type=ipc_only,
                   help="bind this ipc endpoint for token events stage 0 sends straight here; the broker asks for it"
                        " when adapter, broker and stage 0 share a host (default: every event through the broker)")
    p.add_argument("--model", default="default", help="the served GGUF (for its tokenizer and chat template)")
    p.add_argument("--model-id", required=True, help="the id clients put in `model`")
    p.add_argument("--bind", default="127.0.0.1:9337", type=lambda t: split_host_port(t, "--bind"))
    p.add_argument("--default-max-tokens", type=int, default=16)
    p.add_argument("--openai-resume-timeout-s", type=positive_seconds, default=DEFAULT_RESUME_TIMEOUT_S, metavar="SECS",
                   help="a request lost with its stage 0 or the broker is resubmitted with the tokens it has once a"
                        " pipeline is ready; it fails after this long (default %(default)s)")
    p.add_argument("--cors-origins", default=(), type=cors_origins, metavar="LIST",
                   help="origins browsers may call from, comma separated scheme://host[:port], or * (default: none)")
    p.add_argument("--http-head-timeout-s", default=None, metavar="SECS",
                   help="a request head must arrive whole within this, from the accept (kept alive: its first byte);"
                        " then a 408 and close (default 30)")
    p.add_argument("--http-body-timeout-s", default=None, metavar="SECS",
                   help="a request body must arrive whole within this, from the end of its head (default 60)")
    p.add_argument("--http-max-connections", default=None, metavar="N",
                   help="open connections at most; one more is answered 503 and closed (default 512)")
    add_telemetry_arguments(p)
    p.add_argument("--metrics-targets", type=Path, default=None, metavar="PATH",
                   help="the run's metrics-targets.json: /dashboard shows every process listed there")
    p.add_argument("--openai-api-key", default=None, metavar="KEY",
                   help=f"Bearer key every route but /health and /readyz wants, visible on the command line"
                        f" (default: ${API_KEY_ENV}; unset: open)")
    p.add_argument("--openai-api-key-file", default=None, metavar="PATH", help="file holding the Bearer key")
    p.add_argument("--link-secret-key", default=None, metavar="PATH",
                   help="this adapter's CURVE key pair (a client of the broker's topology) toward a keyed broker")
    p.add_argument("--broker-public-key", default=None, metavar="KEY",
                   help="the keyed broker's CURVE public key (default: --link-secret-key's own public key)")
    p.add_argument("--restarts-file", type=Path, default=None, metavar="PATH",
                   help="the run's restarts.json (skippy up): /metrics serves the stage restart counts")
    p.set_defaults(run=run)


def api_key(args: argparse.Namespace) -> str | None:
    """The key: `--openai-api-key-file`'s, else `--openai-api-key`'s, else the environment's (None: open)."""
    if args.openai_api_key_file is None:
        return api_key_from(args.openai_api_key)
    if args.openai_api_key is not None:
        raise ConfigError("give --openai-api-key or --openai-api-key-file, not both")
    return read_api_key_file(args.openai_api_key_file)


def broker_keys(args: argparse.Namespace) -> LinkKeys | None:
    """CURVE toward a keyed broker (None: plain)."""
    if args.link_secret_key is None:
        if args.broker_public_key is not None:
            raise ConfigError("--broker-public-key needs --link-secret-key (this adapter's own key pair)")
        return None
    if args.events_endpoint is not None:
        raise ConfigError("--events-endpoint cannot be used with --link-secret-key: a keyed broker is reached over"
                          " tcp, and token events then take its link")
    public, secret = load_key_pair(Path(args.link_secret_key))
    server = args.broker_public_key.strip() if args.broker_public_key is not None else public.decode()
    try:
        check_public_key(server, "public_key")
    except FieldError as error:
        raise error.as_flag("--broker-public-key") from None
    return LinkKeys("adapter", public, secret, {args.broker: server.encode()}, {})


async def serve(args: argparse.Namespace) -> int:
    log = get_logger()
    key = api_key(args)
    if args.openai_api_key is not None:
        log.warning("api_key_on_command_line", error=COMMAND_LINE_WARNING)
    host, port = args.bind
    exposed = open_bind_warning(f"{host}:{port}", key, "--bind")
    if exposed is not None:
        log.warning("api_open", error=exposed, bind=f"{host}:{port}")
    keys = broker_keys(args)
    ctx = zmq.asyncio.Context()
    if keys is not None:
        secure(ctx, keys)
    path = resolve_model_path(args.model)
    tokenizer = Tokenizer(path)
    template = ChatTemplate(tokenizer.model, read_model_info(path).architecture)
    broker = PipelineClient(args.broker, ctx, events_endpoint=args.events_endpoint)
    adapter = OpenAIAdapter(broker, tokenizer, template, args.model_id, args.default_max_tokens,
                            CorsPolicy(args.cors_origins), key, metrics_targets=args.metrics_targets,
                            resume_timeout_s=args.openai_resume_timeout_s)
    adapter.metrics.registry.register(DirectEventsCollector(lambda: broker.direct_events))
    if args.restarts_file is not None:
        adapter.metrics.registry.register(RestartsCollector(args.restarts_file))
    server = HttpServer(adapter.router(), host, port, limits=args.http_limits, observer=adapter.metrics)
    await server.start()
    dashboard = adapter.dashboard
    dashboard.own_url = f"http://{host}:{server.port}/metrics"
    stopped = asyncio.Event()
    stop_on_signals(stopped)
    announce_ready(log, url=f"http://{host}:{server.port}", metrics_url=dashboard.own_url, model_id=args.model_id,
                   broker=args.broker, events_endpoint=args.events_endpoint, chat_template=template.source,
                   http_limits=args.http_limits.to_dict())
    await stopped.wait()
    ignore_signals()
    failed = broker.fail_pending("the OpenAI adapter is stopping")  # each open response ends with this error
    log.info("stopping", failed_in_flight=failed)
    await server.close(grace_s=STOP_GRACE_S)
    broker.close()
    ctx.term()
    tokenizer.close()
    log.info("stopped", requests=adapter.metrics.requests_total(), direct_token_events=broker.direct_events)
    return 0


def run(args: argparse.Namespace) -> int:
    args.http_limits = resolve_http_limits(FlagReader(args), ADAPTER_FLAGS)  # a bad value fails before anything starts
    telemetry = resolve_telemetry(args, {"stage_id": "adapter", "model_id": args.model_id})
    configure_logging(str(telemetry.level), stage_id="adapter", role="adapter")
    start_telemetry(telemetry, "adapter", serve=False)  # its /metrics is a route of its own HTTP server
    return asyncio.run(serve(args))
