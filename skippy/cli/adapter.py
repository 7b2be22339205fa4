"""`skippy adapter --broker ENDPOINT --model PATH`: the OpenAI HTTP front door for a broker."""

from __future__ import annotations

import argparse
import asyncio

from skippy.driver.client import DriverClient
from skippy.http.adapter import OpenAIAdapter
from skippy.http.chat_template import ChatTemplate
from skippy.http.server import HttpServer
from skippy.log import announce_ready, configure_logging, get_logger
from skippy.runtime.models import resolve_model_path
from skippy.runtime.slices import read_model_info
from skippy.runtime.tokenizer import Tokenizer
from skippy.stage.links import ignore_signals, stop_on_signals


def split_host_port(text: str, flag: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{flag} must look like HOST:PORT, got {text!r}")
    return host, int(port)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("adapter", help="serve the OpenAI HTTP API in front of a broker")
    p.add_argument("--broker", required=True, help="the broker's endpoint, e.g. ipc:///run/broker.sock")
    p.add_argument("--model", default="default", help="the served GGUF (for its tokenizer and chat template)")
    p.add_argument("--model-id", required=True, help="the id clients put in `model`")
    p.add_argument("--bind", default="127.0.0.1:9337", type=lambda t: split_host_port(t, "--bind"))
    p.add_argument("--default-max-tokens", type=int, default=16)
    p.add_argument("--telemetry-level", choices=("off", "summary", "debug"), default="summary")
    p.set_defaults(run=run)


async def serve(args: argparse.Namespace) -> int:
    log = get_logger()
    path = resolve_model_path(args.model)
    tokenizer = Tokenizer(path)
    template = ChatTemplate(tokenizer.model, read_model_info(path).architecture)
    broker = DriverClient(args.broker)
    adapter = OpenAIAdapter(broker, tokenizer, template, args.model_id, args.default_max_tokens)
    host, port = args.bind
    server = HttpServer(adapter.router(), host, port)
    await server.start()
    stopped = asyncio.Event()
    stop_on_signals(stopped)
    announce_ready(log, url=f"http://{host}:{server.port}", model_id=args.model_id, broker=args.broker,
             chat_template=template.source)
    await stopped.wait()
    ignore_signals()
    await server.close()
    broker.close()
    tokenizer.close()
    log.info("stopped", requests=sum(adapter.metrics.requests.values()))
    return 0


def run(args: argparse.Namespace) -> int:
    configure_logging(args.telemetry_level, stage_id="adapter", role="adapter")
    return asyncio.run(serve(args))
