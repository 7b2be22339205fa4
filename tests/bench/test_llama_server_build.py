"""The llama-server build for `skippy bench http`: its CMake flags (the wheel's, AMX off on x86-64), its
cache key, reuse of a finished build without running anything, and a failed step named with its log's
tail. No real build runs here (that takes minutes); a fake `cmake` on PATH stands in."""

from __future__ import annotations

import argparse
import os
import platform
import stat
from pathlib import Path
from typing import Any

import pytest

from skippy.bench import http as bench_http
from skippy.bench import llama_server_build as build
from skippy.bench.http_report import pairs, ratios, table
from skippy.bench.http_servers import llama_server_args


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SKIPPY_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    return tmp_path


def test_flags_are_the_wheels_plus_a_server_only_build(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = build.cmake_args()
    wanted = {"-DGGML_NATIVE=ON", "-DLLAMA_BUILD_SERVER=ON", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_USE_PREBUILT_UI=OFF"}
    assert wanted <= set(args)
    if platform.machine() == "x86_64":
        assert f"-DCMAKE_C_FLAGS={build.NO_AMX}" in args and f"-DCMAKE_CXX_FLAGS={build.NO_AMX}" in args
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_CUDA=on '-DCMAKE_C_FLAGS=-O2'")
    args = build.cmake_args()
    assert args[:2] == ["-DGGML_CUDA=on", "-DCMAKE_C_FLAGS=-O2"]
    assert not any(a.startswith("-DCMAKE_CXX_FLAGS") for a in args)  # the user's flags are left alone, as setup does


def test_the_cache_key_follows_version_and_flags(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = build.build_dir()
    assert plain.parent == cache and plain.name.startswith(f"llama-server-{build.llama_version()}-")
    assert build.build_dir() == plain
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_VULKAN=on")
    assert build.build_dir() != plain


def test_a_finished_build_is_reused_without_running_anything(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = build.build_dir() / "build" / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    (binary.parent / "ggml-rpc-server").write_text("")
    (build.build_dir() / "built").write_text("flags\n")

    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("a finished build must not run anything")

    monkeypatch.setattr(build.subprocess, "Popen", no_run)
    assert build.ensure_llama_server_binary() == binary
    assert build.ensure_rpc_server_binary() == binary.parent / "ggml-rpc-server"


def test_a_failed_step_is_named_with_the_tail_of_its_log(cache: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    fake = tools / "cmake"
    fake.write_text("#!/bin/sh\necho '[1/3] Building CXX object x.o'\necho 'CMake Error: no compiler here' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    sources = tmp_path / "llama.cpp"
    sources.mkdir()
    monkeypatch.setattr(build, "_sources", lambda root, log: sources)
    with pytest.raises(build.LlamaServerBuildError) as info:
        build.ensure_llama_server_binary()
    message = str(info.value)
    assert "failed at 'configure (cmake)' (exit 3" in message and "CMake Error: no compiler here" in message
    assert not (build.build_dir() / "built").exists()


def level(c: int, tok_s: float) -> dict[str, Any]:
    """One concurrency level's summary, as skippy.bench.http_load.run_level returns it."""
    return {"concurrency": c, "tok_s": tok_s, "ttft_p50_ms": 1, "ttft_p95_ms": 2, "tpot_p50_ms": 3, "tpot_p95_ms": 4,
            "status_429": 0}


def test_the_table_marks_each_peers_targets() -> None:
    results = {"skippy": [level(1, 9.0), level(8, 80.0)], "llama-server": [level(1, 10.0), level(8, 100.0)]}
    lines = table(results, "llama-server").splitlines()
    assert "tok/s ls" in lines[0]
    assert lines[1].split()[3:6] == ["0.90", ">=0.9", "ok"] and lines[2].split()[3:6] == ["0.80", ">=0.85", "NO"]


def test_each_skippy_variant_is_compared_with_each_peer() -> None:
    results = {"skippy": [level(1, 8.0)], "skippy-spec": [level(1, 12.0)], "llama-server": [level(1, 10.0)],
               "llama-server-spec": [level(1, 16.0)]}
    assert pairs(results) == [("skippy", "llama-server"), ("skippy", "llama-server-spec"),
                              ("skippy-spec", "llama-server"), ("skippy-spec", "llama-server-spec")]
    assert ratios(results, "llama-server-spec", "skippy-spec") == {1: 0.75}
    lines = table(results, "llama-server", "skippy-spec").splitlines()
    assert "tok/s sk+s" in lines[0] and "tok/s ls" in lines[0]
    assert lines[1].split()[3:6] == ["1.20", ">=0.9", "ok"]
    assert all(len(line.split()) == len(lines[1].split()) for line in lines[1:])


def test_llama_server_spec_drafts_from_the_context() -> None:
    assert llama_server_args(4, 2)[-2:] == ["-tb", "2"]
    assert llama_server_args(4, 2, speculative=True)[-2:] == ["--spec-type", "ngram-simple"]


def recorded_http_bench(monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[str, str | None, list[str]]],
                                                                  argparse.ArgumentParser]:
    """`skippy bench http`'s parser, its `start_skippy` recording (name, split, flags) instead of starting a server."""
    started: list[tuple[str, str | None, list[str]]] = []

    def start_skippy(model: str, split: str | None, run_dir: Path, lanes: int, flags: list[str],
                     name: str = "skippy") -> str:
        started.append((name, split, list(flags)))
        return name

    monkeypatch.setattr(bench_http, "start_skippy", start_skippy)
    kinds = argparse.ArgumentParser().add_subparsers()
    bench_http.add_to(kinds)
    return started, kinds.choices["http"]


@pytest.mark.parametrize("extra", [[], ["--no-speculative"]])
def test_bench_http_starts_skippy_spec_unless_told_not_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          extra: list[str]) -> None:
    """`skippy bench http` starts `skippy up --no-speculative` and, unless --no-speculative, default `skippy up`
    (what starts it is recorded here instead of run: each is a whole server)."""
    started, parser = recorded_http_bench(monkeypatch)
    args = parser.parse_args(["--skippy-flags=--no-prefix-cache", *extra])
    starters = bench_http._skippy_starters(args, tmp_path, 16, 2)
    assert [start() for start in starters] == ["skippy"] + ([] if extra else ["skippy-spec"])
    assert started[0] == ("skippy", None, ["--no-prefix-cache", "--no-speculative"])  # plain, split as skippy up
    if not extra:  # skippy-spec: default skippy up, the speculation policy
        assert started[1] == ("skippy-spec", None, ["--no-prefix-cache"])


def test_bench_http_split_plan_serves_skippy_as_planned_for_one_host(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`--split plan`: no --split, the machine's CPUs as one host (`--stage-cpus 0-N`), for `skippy up` to plan."""
    started, parser = recorded_http_bench(monkeypatch)
    for split, threads, expected in (["plan", 4, (None, ["--stage-cpus", "0-3", "--no-speculative"])],
                                     ["plan", 1, (None, ["--stage-cpus", "0", "--no-speculative"])],
                                     ["5", 4, ("5", ["--no-speculative"])]):
        started.clear()
        args = parser.parse_args(["--split", split, "--no-speculative"])
        [start() for start in bench_http._skippy_starters(args, tmp_path, 16, threads)]
        assert started == [("skippy", *expected)]
        assert ("one stage" in bench_http._skippy_shape(args, threads)[2]) == (split == "plan")
    assert "one stage" in bench_http._skippy_shape(parser.parse_args([]), 2)[2]  # the default: as skippy up serves
