"""The real agent clients (Codex CLI, Claude Code) as their users run them, for tests/openai/test_openai_agent_clients.py.

`scripts/setup-agents` installs them with npm at pinned versions into `.cache/agents` (scripts/setup does where
npm is on PATH; .ci/run installs npm first); `client_binary` finds one or skips, naming what is missing. Their
environment (fresh HOME, settings pointed at a proxy in front of `skippy up`, no network but 127.0.0.1) and the
run of one command are skippy.bench.agent_client_launch's, which `skippy bench agents` shares; `run_client` here
fails the test on a timeout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from skippy.bench import agent_client_launch
from skippy.bench.agent_client_launch import AGENTS_BIN, CLIENTS, ClientRun, client_missing, not_installed

CLIENT_TIMEOUT_S = 240.0


def require_a_client() -> None:
    """Skip, naming what is missing, unless at least one client is installed (before a server is started for none)."""
    if not any((AGENTS_BIN / name).exists() for name in CLIENTS):
        pytest.skip(not_installed(" and ".join(CLIENTS.values()) + " are"))


def client_binary(name: str) -> Path:
    """`.cache/agents/node_modules/.bin/NAME` (a key of CLIENTS), or skip naming what is missing."""
    missing = client_missing(name)
    if missing is not None:
        pytest.skip(missing)
    return AGENTS_BIN / name


def run_client(args: list[str | Path], cwd: Path, env: dict[str, str], timeout_s: float = CLIENT_TIMEOUT_S) -> ClientRun:
    """Run a client command to its end (stdin closed); the test fails if it overruns `timeout_s`."""
    run = agent_client_launch.run_client(args, cwd, env, timeout_s)
    if run.timed_out:
        pytest.fail(f"{run.args[0]} did not finish within {timeout_s:g} s\n{run.stderr[-4000:]}")
    return run
