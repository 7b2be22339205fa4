"""End-to-end fixtures: a real `skippy up` (stages + broker + OpenAI adapter) in a subprocess.

`launch_up(...)` starts `python -m skippy.cli.main up ...` in its own process group with a fresh
`SKIPPY_CACHE_DIR`, waits (bounded) for the `skippy ready: URL/v1 (model ID)` line on stdout and
then for /readyz to answer 200 (the broker learns pipeline readiness by polling stage 0, which can
lag the ready line), and on teardown sends SIGINT, waits up to 30 s (then SIGKILLs the group) and
asserts that no `skippy.cli.main` process mentioning the run directory is left.

`server` is the module-scoped shared server on the tiny llama model (2 stages, 2 lanes); tests
that need special admission settings or that break the server start their own with `launch_up`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from up_helpers import SHARED_SERVER_FLAGS, SkippyServer, launch_up


# -- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_llama(tiny_model: Callable[..., Path]) -> Path:
    """The tiny 6-layer llama (ctx 2048 trained), split at layer 3 into stage0 / stage1."""
    return tiny_model("llama")


@pytest.fixture(scope="session")
def start_up(tmp_path_factory: pytest.TempPathFactory, skippy_cache_dir: Path) -> Callable[..., Any]:
    """`with start_up(name, model, *args) as server:` — a private `skippy up` for one test or module."""

    def start(name: str, model: Path | None, *args: str) -> Any:
        return launch_up(tmp_path_factory.mktemp(name), skippy_cache_dir, model, args)

    return start


@pytest.fixture(scope="module")
def server(start_up: Callable[..., Any], tiny_llama: Path) -> Iterator[SkippyServer]:
    """One shared tiny-llama server per module: 2 stages, 2 lanes, concurrency 2, queue capacity 2, and a
    default max_tokens (11) unlike the built-in default (16), so a test can tell the flag from the default."""
    with start_up("up-shared", tiny_llama, *SHARED_SERVER_FLAGS) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: SkippyServer) -> Iterator[openai.OpenAI]:
    c = server.client()
    yield c
    c.close()
