"""`skippy bench prefill` (skippy.bench.prefill): a real run on the tiny llama, skippy (one host and split over two
pinned stages) against llama-server built from the pinned llama.cpp sources, with the concurrent stream and the
per-chunk timeline; and its bad flags refused in one line before any server starts. Timings are not asserted, only
that every side was measured as the report says (same prompt length per round, every round, ratios paired)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from bench_run import run_bench

from skippy.bench import llama_server_build

SERVERS = {"skippy", "llama-server", "skippy-split", "llama-server-1core"}


def _built_llama_server() -> Path | None:
    """The llama-server already built in the user's cache, found at collection (the suite's fixtures point
    SKIPPY_CACHE_DIR at a fresh dir, where the bench would start a build of minutes)."""
    binary = llama_server_build.build_dir() / "build" / "bin" / "llama-server"
    return binary if (binary.parents[2] / "built").exists() and binary.exists() else None


BUILT_LLAMA_SERVER = _built_llama_server()


def _bench(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return run_bench("prefill", args, timeout_s)


@pytest.mark.skipif(BUILT_LLAMA_SERVER is None, reason="llama-server not built here (`skippy bench http` builds it)")
def test_both_pairs_are_timed_round_by_round_with_the_chunks_shown(tiny_model: Callable[..., Path],
                                                                     tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    out = tmp_path / "prefill.json"
    done = _bench("--model", str(tiny_model("llama")), "--lengths", "80,160", "--repeat", "2",
                  "--stage-cpus", f"{cpus[0]},{cpus[-1]}", "--split", "3", "--concurrent-stream", "--timeline",
                  "--llama-server", str(BUILT_LLAMA_SERVER), "--json", str(out), timeout_s=270)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    samples = report["samples"]
    assert {(s["server"], s["length"], s["round"]) for s in samples} == {
        (name, n, r) for name in SERVERS for n in (80, 160) for r in (0, 1)}
    for s in samples:
        assert abs(s["prompt_tokens"] - s["length"]) <= 2, s  # the server's own count of the prompt it was sent
        assert s["ttft_s"] > 0 and s["cpu_s"] >= 0 and s["stream"]["before_tok_s"] > 0, s
        roles = set(s["cpu_by_role"])  # each process's share: a split's stages apart
        assert roles == {"llama-server"} if s["server"].startswith("llama") else \
            {"stage:stage0", "broker", "adapter"} <= roles and ("stage:stage1" in roles) == (s["server"] == "skippy-split")
    # the servers of a round read the same prompt, each round a new one
    for n in (80, 160):
        for r in (0, 1):
            assert len({s["prompt_tokens"] for s in samples if s["length"] == n and s["round"] == r}) == 1
    assert set(report["ratios"]) == {f"{n}/{a}/{b}" for n in (80, 160)
                                     for a, b in (("skippy", "llama-server"), ("skippy-split", "llama-server-1core"))}
    assert all(len(r["round_ratios"]) == 2 and len(r["busiest_cpu_s"]) == 2 for r in report["ratios"].values())
    text = done.stdout
    assert "2 stages (split 3) on CPUs" in text and "concurrent stream, tokens/s before -> during the prefill" in text
    split_timeline = text.split("skippy-split, the last 160-token prompt, chunk by chunk (ms):\n", 1)[1]
    chunk_lines = [line for line in split_timeline.splitlines() if "|" in line and line.split()[0].isdigit()]
    last = [s for s in samples if s["server"] == "skippy-split" and s["length"] == 160][-1]
    prompt_rows = sum(int(line.split()[1].split("+")[0]) for line in chunk_lines)
    assert prompt_rows == last["prompt_tokens"], split_timeline  # every prompt row of the last prompt, chunk by chunk
    assert all(line.count("|") == 2 for line in chunk_lines)  # stage 0 and stage 1 on each chunk
    assert "stage1:" in split_timeline and "busy" in split_timeline


def test_bad_flags_are_refused_in_one_line_before_anything_starts() -> None:
    for args, message in ((["--lengths", "4q"], "bench prefill: --lengths takes token counts like 1k,4k,16k, got '4q'"),
                          (["--pairs", "both"], "bench prefill: --pairs must name some of one-host, split, got 'both'"),
                          (["--repeat", "0"], "bench prefill: --repeat and --lanes must be at least 1"),
                          (["--llama-server", "/nonexistent"],
                           "bench prefill: --llama-server /nonexistent is not an executable file")):
        done = _bench("--model", "no-such.gguf", *args)
        assert done.returncode != 0 and done.stderr.strip().splitlines()[-1] == message, done.stderr
