"""Session-wide fixtures: a fresh slice cache, tiny test models, the packaged models.

Nothing here is autouse: tests that need a model ask for `tiny_model` / `gemma_path` / `smollm2_path`, which bring
the fresh `SKIPPY_CACHE_DIR` with them (tests/runtime/conftest.py turns it on for every runtime test).
skippy is imported lazily so other test directories do not pay for llama.cpp.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def skippy_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`SKIPPY_CACHE_DIR` pointed at a session tmp dir, so slices are written fresh; restored at the end."""
    path = tmp_path_factory.mktemp("skippy-cache")
    old = os.environ.get("SKIPPY_CACHE_DIR")
    os.environ["SKIPPY_CACHE_DIR"] = str(path)
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop("SKIPPY_CACHE_DIR", None)
        else:
            os.environ["SKIPPY_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, skippy_cache_dir: Path) -> Callable[..., Path]:
    """`tiny_model("gemma3", n_layer=6)` -> path of a tiny random-weight GGUF, written once per session."""
    from skippy.testing.tiny_models import tiny_model_path

    root = tmp_path_factory.mktemp("tiny-models")
    made: dict[tuple[str, tuple[tuple[str, Any], ...]], Path] = {}

    def make(family: str, **kwargs: Any) -> Path:
        key = (family, tuple(sorted(kwargs.items())))
        if key not in made:
            made[key] = tiny_model_path(family, root, **kwargs)
        return made[key]

    return make


@pytest.fixture(scope="session")
def gemma_path(skippy_cache_dir: Path) -> Path:
    """The packaged Gemma 3 270M base model (Q4_K_M; `--model gemma3-270m`), named explicitly: not the default."""
    from skippy.runtime.models import resolve_model_path

    return resolve_model_path("gemma3-270m")


def _part_packaged(name: str) -> Iterator[Path]:
    """A model assembled from its installed part packages into this session's cache (skipped, naming why, where
    they are not installed), removed at the session's end: pytest keeps old temp dirs, and it is a gigabyte."""
    from skippy.runtime.models import PACKAGED, resolve_model_path
    from skippy.runtime.part_packages import installed_part_files

    parts = PACKAGED[name].parts
    assert parts is not None
    files = installed_part_files(parts)
    if isinstance(files, str):
        pytest.skip(f"{name}'s part packages are not installed ({files}): {PACKAGED[name].install} installs them")
    path = resolve_model_path(name)
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def qwen05b_path(skippy_cache_dir: Path) -> Iterator[Path]:
    """The packaged default model, Qwen2.5-Coder-0.5B-Instruct (Q4_K_M; `--model qwen2.5-coder-0.5b` or no `--model`)."""
    yield from _part_packaged("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def qwen15b_path(skippy_cache_dir: Path) -> Iterator[Path]:
    """The packaged Qwen2.5-Coder-1.5B-Instruct (`--model qwen2.5-coder-1.5b`; `scripts/setup --model ...` installs it)."""
    yield from _part_packaged("qwen2.5-coder-1.5b")


@pytest.fixture(scope="session")
def smollm2_path(skippy_cache_dir: Path) -> Path:
    """The packaged SmolLM2-135M-Instruct (Q4_1; `--model smollm2-135m`), the fast instruct model of the tests."""
    from skippy.runtime.models import resolve_model_path

    return resolve_model_path("smollm2-135m")
