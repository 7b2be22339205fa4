"""The real agent clients (Codex CLI, Claude Code) as their users run them, for tests/openai/test_openai_agent_clients.py.

`scripts/setup-agents` installs them with npm at pinned versions into `.cache/agents` (scripts/setup does where
npm is on PATH; .ci/run installs npm first); `client_binary` finds one or skips, naming what is missing. Each
client runs with a fresh HOME, its settings pointed at a proxy in front of `skippy up`, and every proxy variable
pointed at a closed local port (only 127.0.0.1 is exempt), so it reaches nothing but the server; telemetry,
error reporting, update checks and other traffic are switched off as each client documents. `run_client` runs
one command in its own process group with a timeout, killing the group on a timeout or any failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENTS_BIN = ROOT / ".cache" / "agents" / "node_modules" / ".bin"
CLIENT_TIMEOUT_S = 240.0
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing listens, so a connection through "the proxy" fails at once
CLAUDE_QUIET = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
                "DISABLE_AUTOUPDATER": "1", "DISABLE_BUG_COMMAND": "1"}


CLIENTS = {"codex": "Codex CLI (@openai/codex)", "claude": "Claude Code (@anthropic-ai/claude-code)"}


def require_a_client() -> None:
    """Skip, naming what is missing, unless at least one client is installed (before a server is started for none)."""
    if not any((AGENTS_BIN / name).exists() for name in CLIENTS):
        _skip_missing(" and ".join(CLIENTS.values()) + " are")


def client_binary(name: str) -> Path:
    """`.cache/agents/node_modules/.bin/NAME` (a key of CLIENTS), or skip naming what is missing."""
    path, what = AGENTS_BIN / name, CLIENTS[name]
    if not path.exists():
        _skip_missing(f"{what} is")
    if shutil.which("node") is None:
        pytest.skip(f"node is not on PATH ({what}'s launcher runs on Node.js)")
    return path


def _skip_missing(what_is: str) -> NoReturn:
    if shutil.which("npm") is None:
        pytest.skip(f"{what_is} not installed and npm is not on PATH (scripts/setup-agents installs them with npm)")
    pytest.skip(f"{what_is} not installed in .cache/agents: run scripts/setup-agents")


def client_env(home: Path, **extra: str) -> dict[str, str]:
    """A fresh environment: HOME, PATH with node, every proxy variable at a closed port but for 127.0.0.1."""
    node = shutil.which("node")
    assert node is not None
    home.mkdir(parents=True, exist_ok=True)
    proxies = {name: NOWHERE for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy",
                                          "all_proxy")}
    return {"PATH": f"{Path(node).parent}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb",
            **proxies, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", **extra}


def codex_home(root: Path, port: int, model: str) -> Path:
    """CODEX_HOME with a config.toml whose provider is the server at 127.0.0.1:`port` (the Responses API)."""
    home = root / "codex-home"
    home.mkdir(parents=True)
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "skippy"\nsandbox_mode = "read-only"\napproval_policy = "never"\n'
        'check_for_update_on_startup = false\n\n[model_providers.skippy]\nname = "skippy"\n'
        f'base_url = "http://127.0.0.1:{port}/v1"\nwire_api = "responses"\n')
    return home


def claude_env(home: Path, port: int) -> dict[str, str]:
    return client_env(home, ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}", ANTHROPIC_API_KEY="sk-skippy-test",
                      **CLAUDE_QUIET)


@dataclass
class ClientRun:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float

    def explain(self) -> str:
        return f"{' '.join(self.args)} -> {self.returncode}\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr[-4000:]}"


def run_client(args: list[str | Path], cwd: Path, env: dict[str, str], timeout_s: float = CLIENT_TIMEOUT_S) -> ClientRun:
    """Run a client command to its end (stdin closed); its whole process group is killed if it overruns or the
    test fails meanwhile."""
    argv = [str(a) for a in args]
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{argv[0]} did not finish within {timeout_s:g} s\n{stderr[-4000:]}")
    finally:
        _kill(proc)
    return ClientRun(argv, proc.returncode, stdout, stderr, time.monotonic() - start)


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group: a client's children (Codex's sandboxed commands) too
    except ProcessLookupError:
        pass
    proc.wait(10)
