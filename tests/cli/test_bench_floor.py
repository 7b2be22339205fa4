"""`skippy.cli.bench_floor`: the bare 2-process llama.cpp + ZeroMQ pipeline that `bench pipeline` reports as its floor."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from skippy.cli.bench_floor import floor_in_child


def test_the_floor_runs_both_halves_and_splits_each_token_into_compute_and_the_rest(
        tiny_model: Callable[..., Path]) -> None:
    result = asyncio.run(floor_in_child(tiny_model("gemma3", n_layer=4), 2, 30, timeout_s=120))
    assert set(result) == {"overhead_ms", "token_ms", "compute_ms"}
    assert all(math.isfinite(v) and v > 0 for v in result.values())
    assert result["compute_ms"] < result["token_ms"]


def test_a_bad_split_fails_with_the_childs_error(tiny_model: Callable[..., Path]) -> None:
    with pytest.raises(RuntimeError, match="bench floor exited with"):
        asyncio.run(floor_in_child(tiny_model("gemma3", n_layer=4), 9, 10, timeout_s=120))
