"""`skippy bench hosts` (skippy.bench.hosts): a real run on SmolLM2 over two namespace hosts reached only over SSH
(root, Debian's openssh-server), skippy against llama.cpp's RPC split built from the pinned sources. Timings are not
asserted; what is: each side was measured, each skippy host received less than the model (only its slice), and when
a host is cut off mid-stream skippy's streams all finish (the host left holds the model) while none of the RPC
split's does. The layer flags the RPC split gets are checked without root."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench_run import run_bench

from skippy.bench import llama_server_build
from skippy.bench.hosts_rpc import rpc_layer_flags
from skippy.netns import down, unavailable_reason
from skippy.netns.sshd import namespace_processes, sshd_missing
from skippy.runtime.models import resolve_model_path


def _built() -> bool:
    """llama-server and ggml-rpc-server already built in the user's cache, found at collection (the suite's fixtures
    point SKIPPY_CACHE_DIR at a fresh dir, where the bench would start a build of minutes)."""
    root = llama_server_build.build_dir()
    return (root / "built").exists() and all((root / "build" / "bin" / t).exists() for t in llama_server_build.TARGETS)


BUILT = _built()


def test_the_rpc_split_puts_each_range_on_its_host() -> None:
    assert rpc_layer_flags([(0, 28)]) == ["-ngl", "0"]
    assert rpc_layer_flags([(0, 14), (14, 28)]) == ["-ngl", "14", "--tensor-split", "14"]
    assert rpc_layer_flags([(0, 12), (12, 24), (24, 28)]) == ["-ngl", "16", "--tensor-split", "12,4"]


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"tbh{os.getpid() % 10000:04d}"
    yield name
    for namespace in Path("/run/netns").glob(f"{name}*-h*"):  # a bench killed at its timeout leaves them
        for line in namespace_processes(namespace.name):
            try:
                os.kill(int(line.split(" ", 1)[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
    down(f"{name}2")


@pytest.mark.skipif(not BUILT, reason="llama-server and ggml-rpc-server not built here"
                                      " (`python -m skippy.bench.llama_server_build`)")
@pytest.mark.timeout(1200)  # ~1.5 min on 2 idle CPUs, over 5 beside the other SSH tests
def test_skippy_and_the_rpc_split_are_measured_and_only_skippy_survives_a_lost_host(
        tmp_path: Path, prefix: str) -> None:
    if (reason := unavailable_reason() or sshd_missing()) is not None:
        pytest.skip(reason)
    out = tmp_path / "hosts.json"
    done = run_bench("hosts", ["--model", "smollm2-135m", "--hosts", "2", "--mem-mb", "300", "--lanes", "4",
                               "--ctx-size", "512", "--levels", "1,4", "--prompt-tokens", "300", "--loss-timeout-s", "60",
                               "--prefix", prefix, "--subnet", "10.79",
                               "--json", str(out)], timeout_s=1100)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["system"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"skippy", "llama.cpp RPC"}
    model_mb = resolve_model_path("smollm2-135m").stat().st_size / 1e6
    skippy, rpc = rows["skippy"], rows["llama.cpp RPC"]
    assert skippy["split"] == rpc["split"] and len(skippy["split"]) == 2
    assert all(0 < mb < model_mb for mb in skippy["received_mb"]), (skippy["received_mb"], model_mb)
    for row in (skippy, rpc):
        assert row["tok_s"]["1"] > 0 and row["tok_s"]["4"] > 0 and row["ttft_s"] > 0
        assert abs(row["prompt_tokens"] - 300) <= 30
    lost = skippy["host_loss"]
    assert lost["finished"] == lost["streams"] == 4 and lost["resumed"] == 4, lost
    assert lost["replanned_s"] is not None and lost["pause_max_s"] >= lost["replanned_s"] - 1, lost
    assert rpc["host_loss"]["finished"] == 0, rpc["host_loss"]
    assert "| 2 | skippy |" in done.stdout and "| 2 | llama.cpp RPC |" in done.stdout
