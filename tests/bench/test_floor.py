"""`skippy.bench.floor`: the bare 2-process llama.cpp + ZeroMQ pipeline that `bench pipeline` reports as its floor."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from skippy.bench.floor import _await_answer, floor_in_child


def test_the_floor_runs_both_halves_and_splits_each_token_into_compute_and_the_rest(
        tiny_model: Callable[..., Path]) -> None:
    result = asyncio.run(floor_in_child(tiny_model("gemma3", n_layer=4), 2, 30, timeout_s=120))
    assert set(result) == {"overhead_ms", "token_ms", "compute_ms"}
    # not a race between timings: each token's time is taken around both computes (the child's inside the wait
    # for its answer), so per token compute < token and overhead > 0, and so for their medians
    assert all(math.isfinite(v) and v > 0 for v in result.values())
    assert result["compute_ms"] < result["token_ms"]


def test_a_bad_split_fails_with_the_childs_error(tiny_model: Callable[..., Path]) -> None:
    with pytest.raises(RuntimeError, match="bench floor exited with"):
        asyncio.run(floor_in_child(tiny_model("gemma3", n_layer=4), 9, 10, timeout_s=120))



def test_a_child_stage_that_exits_fails_the_wait_at_once(tmp_path: Path) -> None:
    """The parent waits for the child's answer only while the child lives (no 60 s wait on a dead one)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(f"ipc://{tmp_path}/a")
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    try:
        with pytest.raises(RuntimeError, match="the child stage exited with 3"):
            _await_answer(pull, child, timeout_s=60)
    finally:
        child.wait(30)
        pull.close(0)
        ctx.term()
