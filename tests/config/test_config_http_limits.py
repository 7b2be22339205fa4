"""The adapter's HTTP limits (skippy.config.http_limits): `--openai-http-*` resolved with the front, their
defaults, bad values refused naming the flag, and the `skippy adapter` flags the front hands them over as
(which the adapter reads back into the same limits)."""

from __future__ import annotations

import pytest
from config_helpers import OPENAI, Serve, ServeError

from skippy.cli.main import build_parser
from skippy.config import FlagReader
from skippy.config.http_limits import ADAPTER_FLAGS, HttpLimits, resolve_http_limits


def test_defaults_are_production_limits(serve: Serve) -> None:
    openai = serve(*OPENAI).openai
    assert openai is not None and openai.http == HttpLimits()
    assert (HttpLimits().head_timeout_s, HttpLimits().body_timeout_s, HttpLimits().max_connections) == (30.0, 60.0, 512)


def test_flags_set_the_limits(serve: Serve) -> None:
    openai = serve(*OPENAI, "--openai-http-head-timeout-s", "2.5", "--openai-http-body-timeout-s", "7",
                   "--openai-http-max-connections", "64").openai
    assert openai is not None
    assert openai.http == HttpLimits(head_timeout_s=2.5, body_timeout_s=7.0, max_connections=64)


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--openai-http-head-timeout-s", "0", "must be finite and > 0, got 0"),
    ("--openai-http-body-timeout-s", "-1", "must be finite and > 0, got -1"),
    ("--openai-http-body-timeout-s", "inf", "must be finite and > 0, got inf"),
    ("--openai-http-head-timeout-s", "soon", "must be a number, got 'soon'"),
    ("--openai-http-max-connections", "0", "must be > 0, got 0"),
    ("--openai-http-max-connections", "1.5", "must be an integer, got '1.5'"),
])
def test_bad_values_are_refused_naming_the_flag(serve_error: ServeError, flag: str, value: str, message: str) -> None:
    assert serve_error(*OPENAI, flag, value) == f"{flag} {message}"


@pytest.mark.parametrize("flag", ["--openai-http-head-timeout-s", "--openai-http-max-connections"])
def test_the_flags_need_the_front(serve_error: ServeError, flag: str) -> None:
    assert serve_error(flag, "5").startswith(f"{flag} needs --openai-bind-addr (or give it to skippy up")


def test_the_adapter_reads_its_flags_back_into_the_same_limits() -> None:
    limits = HttpLimits(head_timeout_s=0.25, body_timeout_s=90.0, max_connections=3)
    flags = limits.adapter_flags()
    assert flags == ["--http-head-timeout-s", "0.25", "--http-body-timeout-s", "90.0", "--http-max-connections", "3"]
    args = build_parser().parse_args(["adapter", "--broker", "ipc:///b", "--model-id", "m", *flags])
    assert resolve_http_limits(FlagReader(args), ADAPTER_FLAGS) == limits
    bare = build_parser().parse_args(["adapter", "--broker", "ipc:///b", "--model-id", "m"])
    assert resolve_http_limits(FlagReader(bare), ADAPTER_FLAGS) == HttpLimits()
