"""The real agent clients (Codex CLI, Claude Code) as their users run them: where they are installed, the
environment and settings that point them at one server and nothing else, and one run of one command.

`scripts/setup-agents` installs them with npm at pinned versions into `.cache/agents`. Each client runs with a
fresh HOME, its settings pointed at 127.0.0.1:PORT, and every proxy variable pointed at a closed local port
(only 127.0.0.1 is exempt), so it reaches nothing but the server; telemetry, error reporting, update checks and
other traffic are switched off as each client documents. `run_client` runs one command in its own process
group with a timeout and kills the whole group afterwards (a client's children, Codex's sandboxed commands, too).
Used by `skippy bench agents` and by tests/openai/agent_clients.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENTS_BIN = ROOT / ".cache" / "agents" / "node_modules" / ".bin"
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing listens, so a connection through "the proxy" fails at once
CLAUDE_QUIET = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
                "DISABLE_AUTOUPDATER": "1", "DISABLE_BUG_COMMAND": "1"}
CLIENTS = {"codex": "Codex CLI (@openai/codex)", "claude": "Claude Code (@anthropic-ai/claude-code)"}


def not_installed(what_is: str) -> str:
    """Why `what_is` ("Codex CLI (...) is") cannot run here, and what installs it."""
    if shutil.which("npm") is None:
        return f"{what_is} not installed and npm is not on PATH (scripts/setup-agents installs them with npm)"
    return f"{what_is} not installed in .cache/agents: run scripts/setup-agents"


def client_missing(name: str) -> str | None:
    """Why client `name` (a key of CLIENTS) cannot run here; None where it can."""
    what = CLIENTS[name]
    if not (AGENTS_BIN / name).exists():
        return not_installed(f"{what} is")
    if shutil.which("node") is None:
        return f"node is not on PATH ({what}'s launcher runs on Node.js)"
    return None


def client_env(home: Path, **extra: str) -> dict[str, str]:
    """A fresh environment: HOME, PATH with node, every proxy variable at a closed port but for 127.0.0.1."""
    node = shutil.which("node")
    assert node is not None, "node is not on PATH"
    home.mkdir(parents=True, exist_ok=True)
    proxies = {name: NOWHERE for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy",
                                          "all_proxy")}
    return {"PATH": f"{Path(node).parent}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb",
            **proxies, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", **extra}


def codex_home(root: Path, port: int, model: str, provider: Mapping[str, int] | None = None) -> Path:
    """CODEX_HOME with a config.toml whose provider is the server at 127.0.0.1:`port` (the Responses API);
    `provider`: more of the provider's integer settings (e.g. stream_idle_timeout_ms, request_max_retries)."""
    home = root / "codex-home"
    home.mkdir(parents=True)
    more = "".join(f"{key} = {value}\n" for key, value in (provider or {}).items())
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "skippy"\nsandbox_mode = "read-only"\napproval_policy = "never"\n'
        'check_for_update_on_startup = false\n\n[model_providers.skippy]\nname = "skippy"\n'
        f'base_url = "http://127.0.0.1:{port}/v1"\nwire_api = "responses"\n{more}')
    return home


def claude_env(home: Path, port: int, **extra: str) -> dict[str, str]:
    """Claude Code's environment: the Anthropic Messages API at 127.0.0.1:`port`, nonessential traffic off."""
    return client_env(home, ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}", ANTHROPIC_API_KEY="sk-skippy-test",
                      **CLAUDE_QUIET, **extra)


@dataclass
class ClientRun:
    args: list[str]
    returncode: int  # -9 where it was killed at its timeout
    stdout: str
    stderr: str
    wall_s: float  # launch to exit
    timed_out: bool = False

    def explain(self) -> str:
        return f"{' '.join(self.args)} -> {self.returncode}\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr[-4000:]}"


def run_client(args: list[str | Path], cwd: Path, env: dict[str, str], timeout_s: float) -> ClientRun:
    """Run a client command to its end (stdin closed), or kill its process group after `timeout_s` (timed_out);
    the group is killed whatever happens meanwhile."""
    argv = [str(a) for a in args]
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    timed_out = False
    try:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill(proc)
            stdout, stderr = proc.communicate()
        wall_s = time.monotonic() - start
    finally:
        _kill(proc)
    return ClientRun(argv, proc.returncode, stdout, stderr, wall_s, timed_out)


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)
