"""Stage 0's OpenAI front (``--openai-bind-addr``): its defaults, the adapter's flags, where the
front is allowed, and front flags given without it.  Its admission options: test_config_admission."""

from __future__ import annotations

import pytest
from config_helpers import OPENAI, Serve, ServeError


def test_openai_defaults(serve: Serve) -> None:
    openai = serve(*OPENAI).openai
    assert openai is not None
    assert openai.bind_addr == "127.0.0.1:9337"
    assert openai.model_id == "tiny-model"
    assert openai.default_max_tokens == 16


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
    ],
)
def test_front_flags_need_the_front(serve_error: ServeError, flags: list[str]) -> None:
    """Admission, model id and default max tokens act only through a front: never accepted and dropped."""
    message = serve_error(*flags)
    assert message.startswith(f"{flags[0]} needs --openai-bind-addr (or give it to skippy up")

