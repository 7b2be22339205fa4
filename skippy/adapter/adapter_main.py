"""The adapter process: `skippy adapter`'s main (flags in skippy.cli.adapter).

Besides the OpenAI routes it serves its own /metrics and the live pipeline page /dashboard, which
shows every process listed in `--metrics-targets` (the run's metrics-targets.json; skippy.adapter.dashboard);
`OpenAIAdapter.router` is its one route table, every route behind the API key but /health and /readyz.
The key comes from `$SKIPPY_OPENAI_API_KEY` (how `skippy up` hands it over), `--openai-api-key-file`,
or `--openai-api-key` (warned about: visible on the command line); a non-loopback `--bind` without a
key is warned about too. A broker serving CURVE (its topologies have keys and it binds tcp) is reached
with `--link-secret-key` (this adapter's pair, a client of the topology) and `--broker-public-key`
(default: that pair's own public key, as when the broker serves with the same `client` pair).
On SIGTERM every request still generating or waiting for a pipeline fails with code unavailable ("the OpenAI
adapter is stopping", or the run's own reason when a lost host left nothing to serve on: `--restarts-file`'s
`hosts.failed`, which also ends every waiting request at once): an open stream gets its error event and `[DONE]`,
a waiting response a 503, and both up to STOP_GRACE_S to be sent before the connections close; never a cut answer
without a reason.
"""


from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import zmq.asyncio

from skippy.adapter.chat_template import ChatTemplate
from skippy.adapter.pipeline_info import stage_ranges
from skippy.adapter.request_metrics import DirectEventsCollector
from skippy.adapter.routes import OpenAIAdapter
from skippy.client import PipelineClient
from skippy.config import ConfigError
from skippy.config.api_key import COMMAND_LINE_WARNING, open_bind_warning, read_api_key_file
from skippy.config.errors import FieldError
from skippy.config.http_limits import ADAPTER_FLAGS, resolve_http_limits
from skippy.config.link_keys import check_public_key
from skippy.config.serving_args import FlagReader
from skippy.http.auth import api_key_from
from skippy.http.cors import CorsPolicy
from skippy.http.server import HttpServer
from skippy.log import announce_ready, configure_logging, get_logger
from skippy.runtime.models import model_card_sampling, resolve_model_path
from skippy.runtime.slices import read_model_info
from skippy.runtime.tokenizer import Tokenizer
from skippy.supervise import ignore_signals, stop_on_signals
from skippy.telemetry.options import resolve_telemetry
from skippy.telemetry.process import start_telemetry
from skippy.telemetry.restart_counts import RestartsCollector, pipeline_gone, read_hosts_state
from skippy.transport.curve_guard import LinkKeys, secure
from skippy.transport.curve_keys import load_key_pair

STOP_GRACE_S = 2.0  # on SIGTERM, open responses get this long to send their error event and end


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
                            resume_timeout_s=args.openai_resume_timeout_s, strict_request_fields=args.strict_request_fields,
                            stages=stage_ranges(args.topology), ping_interval_s=args.sse_ping_interval or None,
                            model_card=model_card_sampling(path))
    adapter.metrics.registry.register(DirectEventsCollector(lambda: broker.direct_events))
    if args.restarts_file is not None:
        adapter.metrics.registry.register(RestartsCollector(args.restarts_file))
        adapter.resuming.gone = lambda: pipeline_gone(args.restarts_file)
        adapter.dashboard.hosts = lambda: read_hosts_state(args.restarts_file)
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
    adapter.resuming.stopping = adapter.resuming.gone_reason() or "the OpenAI adapter is stopping"
    failed = broker.fail_pending(adapter.resuming.stopping)  # each open response ends with this error
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
