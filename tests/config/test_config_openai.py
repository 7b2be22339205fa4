"""Stage 0's OpenAI front (``--openai-bind-addr``): its defaults, the adapter's flags, where the
front is allowed, and front flags given without it.  Its admission options: test_config_admission."""

from __future__ import annotations

import argparse

import pytest
from config_helpers import OPENAI, Serve, ServeError

from skippy.cli.adapter import cors_origins as adapter_cors_origins
from skippy.cli.adapter import ipc_only
from skippy.cli.front import cors_flags, strict_fields_flags
from skippy.cli.main import build_parser


def test_openai_defaults(serve: Serve) -> None:
    openai = serve(*OPENAI).openai
    assert openai is not None
    assert openai.bind_addr == "127.0.0.1:9337"
    assert openai.model_id == "tiny-model"
    assert openai.default_max_tokens == 4096


def test_openai_overrides(serve: Serve) -> None:
    openai = serve(*OPENAI, "--openai-model-id", "served-name", "--openai-default-max-tokens", "64").openai
    assert openai is not None
    assert (openai.model_id, openai.default_max_tokens) == ("served-name", 64)


def test_bad_default_max_tokens(serve_error: ServeError) -> None:
    message = serve_error(*OPENAI, "--openai-default-max-tokens", "0")
    assert message == "--openai-default-max-tokens must be > 0, got 0"


def test_blank_model_id_rejected(serve_error: ServeError) -> None:
    message = serve_error(*OPENAI, "--openai-model-id", " ")
    assert message.startswith("--openai-model-id must be a non-empty string")


def test_bad_openai_bind_addr(serve_error: ServeError) -> None:
    assert serve_error("--openai-bind-addr", "9337").startswith(
        "--openai-bind-addr must be host:port"
    )


def test_openai_only_on_stage_zero(serve_error: ServeError) -> None:
    stage = {"stage_index": 1, "layer_start": 4, "layer_end": 8}
    message = serve_error(*OPENAI, stage=stage)
    assert message.startswith("--openai-bind-addr is only allowed on stage 0")
    assert message.endswith("has stage_index 1")


@pytest.mark.parametrize(
    "flags",
    [
        ["--openai-generation-concurrency", "2"],
        ["--openai-adaptive-generation-concurrency"],
        ["--openai-model-id", "x"],
        ["--openai-default-max-tokens", "9"],
        ["--openai-cors-origins", "http://ui.example"],
        ["--openai-strict-request-fields"],
    ],
)
def test_front_flags_need_the_front(serve_error: ServeError, flags: list[str]) -> None:
    """Admission, model id, default max tokens and CORS act only through a front: never accepted and dropped."""
    message = serve_error(*flags)
    assert message.startswith(f"{flags[0]} needs --openai-bind-addr (or give it to skippy up")



def test_cors_origins_default_to_none(serve: Serve) -> None:
    openai = serve(*OPENAI).openai
    assert openai is not None and openai.cors_origins == ()


def test_cors_origins_resolved(serve: Serve) -> None:
    """Origins as browsers send them: lower-cased, a trailing / dropped, each once; `*` for any."""
    given = " http://UI.example:3000/ ,https://app.example, http://[::1]:8080,*,http://ui.example:3000"
    openai = serve(*OPENAI, "--openai-cors-origins", given).openai
    assert openai is not None
    assert openai.cors_origins == ("http://ui.example:3000", "https://app.example", "http://[::1]:8080", "*")


@pytest.mark.parametrize("bad", ["ui.example", "http://ui.example/app", "http://ui.example:0", "http://ui.example:99999",
                                 "http://", "http://ui example", "http://ui.example?x=1", "localhost:3000", "**"])
def test_bad_cors_origin_refused_naming_the_flag(serve_error: ServeError, bad: str) -> None:
    message = serve_error(*OPENAI, "--openai-cors-origins", f"http://fine.example,{bad}")
    assert message == ("--openai-cors-origins must list origins as scheme://host[:port] (e.g. http://localhost:3000)"
                       f" or *, comma separated, got {bad!r}")


@pytest.mark.parametrize("empty", [",", " , "])
def test_cors_origins_without_an_origin_refused(serve_error: ServeError, empty: str) -> None:
    assert serve_error(*OPENAI, "--openai-cors-origins", empty).startswith(
        "--openai-cors-origins must list at least one origin")


def test_blank_cors_origins_refused(serve_error: ServeError) -> None:
    assert serve_error(*OPENAI, "--openai-cors-origins", " ").startswith(
        "--openai-cors-origins must be a non-empty string")


def test_adapter_cors_origins_checked_alike() -> None:
    """`skippy adapter --cors-origins`, which the front is given, is checked by the same rule."""
    assert adapter_cors_origins("") == () and adapter_cors_origins("http://a.example/,*") == ("http://a.example", "*")
    with pytest.raises(argparse.ArgumentTypeError, match="^--cors-origins must list origins as scheme://host"):
        adapter_cors_origins("a.example")
    assert cors_flags(()) == [] and cors_flags(("http://a.example", "*")) == ["--cors-origins", "http://a.example,*"]


def test_strict_request_fields_travel_to_the_adapter(serve: Serve) -> None:
    """Off by default (unknown request fields ignored); `skippy up`'s flag becomes the adapter's."""
    default, strict = serve(*OPENAI).openai, serve(*OPENAI, "--openai-strict-request-fields").openai
    assert default is not None and strict is not None
    assert (default.strict_request_fields, strict.strict_request_fields) == (False, True)
    assert strict_fields_flags(False) == [] and strict_fields_flags(True) == ["--strict-request-fields"]
    adapter = ["adapter", "--broker", "ipc:///b", "--model-id", "m"]
    assert not build_parser().parse_args(adapter).strict_request_fields
    assert build_parser().parse_args([*adapter, *strict_fields_flags(True)]).strict_request_fields


@pytest.mark.parametrize("bad", ["tcp://127.0.0.1:5555", "ipc://", "/run/events.sock"])
def test_adapter_events_endpoint_must_be_ipc(bad: str) -> None:
    """`skippy adapter --events-endpoint`: stage 0 pushes events only to an ipc endpoint on its host."""
    assert ipc_only("ipc:///run/skippy/events.sock") == "ipc:///run/skippy/events.sock"
    with pytest.raises(argparse.ArgumentTypeError, match="^--events-endpoint must be ipc://PATH"):
        ipc_only(bad)
