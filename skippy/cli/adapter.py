"""`skippy adapter --broker ENDPOINT --model PATH`: the OpenAI HTTP front door for a broker (flags; the process
is skippy.adapter.adapter_main)."""


from __future__ import annotations

import argparse
from pathlib import Path

from skippy.adapter import adapter_main
from skippy.adapter.resume import DEFAULT_RESUME_TIMEOUT_S
from skippy.config import ConfigError
from skippy.config.serving import DEFAULT_MAX_TOKENS, parse_cors_origins
from skippy.http.auth import API_KEY_ENV
from skippy.http.sse import DEFAULT_PING_INTERVAL_S
from skippy.telemetry.options import add_telemetry_arguments


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
    p.add_argument("--default-max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--openai-resume-timeout-s", type=positive_seconds, default=DEFAULT_RESUME_TIMEOUT_S, metavar="SECS",
                   help="a request lost with its stage 0 or the broker resumes from the tokens it has once a"
                        " pipeline is ready; it fails after this long (default %(default)s)")
    p.add_argument("--sse-ping-interval", type=float, default=DEFAULT_PING_INTERVAL_S, metavar="SECS",
                   help="an SSE comment ping after this long without an event in a stream (default 30; 0: none)")
    p.add_argument("--topology", type=Path, default=None, metavar="PATH",
                   help="the pipeline's topology: /props and /slots show each stage's layer range")
    p.add_argument("--cors-origins", default=(), type=cors_origins, metavar="LIST",
                   help="origins browsers may call from, comma separated scheme://host[:port], or * (default: none)")
    p.add_argument("--strict-request-fields", action="store_true",
                   help="a request field no route knows is a 400 naming it (default: ignored, logged once per name"
                        " and counted as skippy_request_fields_ignored_total)")
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
    p.set_defaults(run=adapter_main.run)
