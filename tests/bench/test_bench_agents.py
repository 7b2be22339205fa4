"""`skippy bench agents` (skippy.bench.agent_first_answer): a real run of Claude Code, cold then warm, against
`skippy up` on the tiny llama with a 32k context (skipped, naming what is missing, where Claude Code is not
installed: scripts/setup-agents), and its flags refused with one line before any server starts."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from skippy.bench.agent_client_launch import client_missing

SKIPPY = str(Path(sys.executable).with_name("skippy"))


def _bench(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SKIPPY, "bench", "agents", *args], capture_output=True, text=True, timeout=timeout_s)


def test_claude_code_cold_then_warm_hits_the_prefix_cache(tiny_model: Callable[..., Path], tmp_path: Path) -> None:
    missing = client_missing("claude")
    if missing is not None:
        pytest.skip(missing)
    out = tmp_path / "agents.json"
    # Claude Code's default tools are ~38k tokens of the tiny model's vocabulary: Read alone fits its 32k context
    done = _bench("--model", str(tiny_model("llama", n_ctx_train=32768)), "--clients", "claude", "--claude-tools", "Read",
                  "--client-timeout", "240", "--out", str(out), "--", "--split", "none", "--ctx-size", "32768",
                  timeout_s=900)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["skipped"] == {} and report["claude_tools"] == "Read"
    cold, warm = report["runs"]
    assert (cold["client"], cold["run"], warm["run"]) == ("claude", "cold", "warm")
    assert cold["exit_code"] == warm["exit_code"] == 0 and not cold["timed_out"], cold["stderr_tail"]
    first_cold, first_warm = cold["requests"][0], warm["requests"][0]
    assert first_cold["prompt_tokens"] > 4000 and first_cold["cached_tokens"] == 0  # a fresh server per client
    assert first_cold["ttft_s"] is not None and first_warm["ttft_s"] is not None
    # the same prompt (a fresh HOME at the same path): all of it but the last token restored
    assert first_warm["prompt_tokens"] == first_cold["prompt_tokens"]
    assert first_warm["cached_tokens"] > 0.9 * first_warm["prompt_tokens"], first_warm
    rows = [line.split() for line in done.stdout.splitlines() if line.lstrip().startswith("claude ")]
    assert [(r[1], r[3], r[4], r[-1]) for r in rows] == [
        ("cold", str(first_cold["prompt_tokens"]), "0", "0"),
        ("warm", str(first_warm["prompt_tokens"]), str(first_warm["cached_tokens"]), "0")], done.stdout


def test_bad_flags_are_refused_before_any_server_starts() -> None:
    done = _bench("--clients", "codex,gpt")
    assert done.returncode == 2 and "argument --clients: unknown gpt; choose from codex, claude" in done.stderr
    done = _bench("--client-timeout", "0")
    assert done.returncode == 2 and "agents: --client-timeout must be a number of seconds > 0, got 0.0" in done.stderr
    done = _bench("--out", "/nonexistent/agents.json")
    assert done.returncode == 2 and "agents: --out /nonexistent/agents.json: no directory /nonexistent" in done.stderr
    done = _bench("--clients", "codex", "--", "--run-dir", "/tmp/x")
    assert done.returncode == 2, done.stderr
    assert "skippy bench: error: agents: --run-dir after --: the bench sets --bind and --run-dir itself" in done.stderr
