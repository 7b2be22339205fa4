"""The API key and the metrics bind as flags resolve them: `--openai-api-key-file` (errors naming the
file), not both key flags, `--metrics-bind` (loopback by default, a host without a port), Bearer
parsing, and the warning for a non-loopback HTTP bind without a key."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_helpers import OPENAI, Serve, ServeError

from skippy.config.api_key import API_KEY_ENV, bearer_matches, bearer_token, open_bind_warning


def test_the_key_comes_from_its_file(serve: Serve, serve_error: ServeError, tmp_path: Path) -> None:
    key_file = tmp_path / "api.key"
    key_file.write_text("  sk-from-file\n")
    assert serve(*OPENAI, "--openai-api-key-file", str(key_file)).openai.api_key == "sk-from-file"  # type: ignore[union-attr]
    assert serve(*OPENAI, "--openai-api-key", "sk-flag").openai.api_key == "sk-flag"  # type: ignore[union-attr]
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    assert serve_error(*OPENAI, "--openai-api-key-file", str(empty)) == f"--openai-api-key-file {empty}: the key file is empty"
    missing = tmp_path / "missing.key"
    assert serve_error(*OPENAI, "--openai-api-key-file", str(missing)).startswith(
        f"--openai-api-key-file {missing}: cannot read the key file (")
    assert serve_error(*OPENAI, "--openai-api-key-file", str(key_file), "--openai-api-key", "x") == (
        "give --openai-api-key or --openai-api-key-file, not both")


def test_metrics_bind_is_loopback_unless_given(serve: Serve, serve_error: ServeError) -> None:
    assert serve().metrics_bind == "127.0.0.1"
    assert serve("--metrics-bind", "0.0.0.0").metrics_bind == "0.0.0.0"
    assert serve("--metrics-bind", "[::1]").metrics_bind == "::1"
    assert serve_error("--metrics-bind", "127.0.0.1:9000").startswith("--metrics-bind must be a host (an address or name")


def test_bearer_tokens_and_the_open_bind_warning() -> None:
    assert bearer_token("Bearer  sk-1 ") == "sk-1" and bearer_token("bearer sk-1") == "sk-1"
    assert bearer_token("Basic sk-1") is None and bearer_token("Bearer ") is None and bearer_token("") is None
    assert bearer_matches("sk-1", "sk-1") and not bearer_matches("sk-1x", "sk-1") and not bearer_matches(None, "sk-1")
    assert not bearer_matches("ключ", "sk-1")  # not latin-1: compared, refused, no exception
    for bind in ("127.0.0.1:9337", "localhost:9337", "[::1]:9337"):
        assert open_bind_warning(bind, None, "--bind") is None
    assert open_bind_warning("0.0.0.0:9337", "sk-1", "--bind") is None
    warning = open_bind_warning("0.0.0.0:9337", None, "--bind")
    assert warning is not None and warning.startswith("--bind 0.0.0.0:9337: a non-loopback address without an API key")
    assert f"${API_KEY_ENV}" in warning and "\n" not in warning


@pytest.mark.parametrize("bind", ["10.1.2.3:80", "example.org:9337", "[fd00::1]:9337"])
def test_every_non_loopback_bind_is_warned_about(bind: str) -> None:
    assert open_bind_warning(bind, None, "--bind") is not None
