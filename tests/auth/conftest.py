"""Fixtures for the link-authentication tests: keyed pipelines of real stage processes (stage 0 too).

`keyed_pipeline(model, splits)` is the pipeline tests' `make_pipeline` with every stage started as a
process after `skippy keys --topology` gave the topology keys for each stage and for the `client`
pair; `stranger` is a key pair the topology does not know. Fixtures shared via tests/chaos.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "chaos"))
from fixture_sharing import fixtures_of  # noqa: E402

from skippy.transport.curve_keys import write_key_pair  # noqa: E402

_pipeline = fixtures_of("pipeline")
make_pipeline = _pipeline.make_pipeline
_fresh_slice_cache = _pipeline._fresh_slice_cache


@pytest.fixture
def keyed_pipeline(make_pipeline: Callable[..., Any]) -> Callable[..., Any]:
    from auth_helpers import add_keys

    def make(model: Path, splits: list[int], **kwargs: Any) -> Any:
        pipe = make_pipeline(model, splits, start=False, include_stage0=True, **kwargs)
        add_keys(pipe)
        return pipe.start()

    return make


@pytest.fixture
def stranger(tmp_path: Path) -> tuple[Path, str]:
    """A key pair no topology names: (its secret key file, its public key)."""
    public = write_key_pair(tmp_path / "stranger-keys", "stranger")
    return tmp_path / "stranger-keys" / "stranger.key_secret", public
