"""`skippy bench agents`: each real agent client's wall time to its first answer against plain `skippy up`,
with a cold and then a warm prefix cache.

For each client installed in `.cache/agents` (skippy.bench.agent_client_launch; one not installed is skipped,
named): a fresh `skippy up` with the flags given (none by default: the default model and context; `--model` and
everything after `--` pass through), so that the cold run finds nothing of another client in the cache; then the
client twice, each time a fresh session (a new HOME, and CODEX_HOME, at the same path: both clients write their
home's path into the system prompt) in the same work directory with the same prompt: cold, then warm (its
prefix cache hit: cached tokens > 0). Codex CLI runs `codex exec`, Claude Code `claude -p`, each
with its own default system prompt and tools (what makes its first request long); `--claude-tools` trims
Claude Code's. Each run: wall time from launch to exit, exit code, and from stage 0's `request_done` log lines
the model requests it made (the first one's prompt tokens, cached tokens and server TTFT, submit to first token).

The clients' own timeouts are raised to `--client-timeout` and their retries switched off, so a slow prefill is
waited for and a failure shows as one (an exit code, not a hidden second request): Claude Code API_TIMEOUT_MS
(its request timeout, default 10 min) and CLAUDE_STREAM_IDLE_TIMEOUT_MS, CLAUDE_CODE_MAX_RETRIES=0; Codex's
provider stream_idle_timeout_ms (default 5 min), request_max_retries = stream_max_retries = 0. A client still
running at `--client-timeout` is killed and its run marked timed out. Table on stdout; `--out` the JSON.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from skippy.bench.agent_client_launch import (
    AGENTS_BIN,
    CLIENTS,
    ClientRun,
    claude_env,
    client_env,
    client_missing,
    codex_home,
    run_client,
)
from skippy.bench.http_load import Server
from skippy.bench.http_servers import start_skippy_up, stop
from skippy.config import ConfigError
from skippy.launcher import read_events

PROMPT = "Reply with the word hello."
RUNS = ("cold", "warm")
UP_FLAGS_TAKEN = ("--bind", "--run-dir")  # the bench's own: a free port, logs in its temp dir


@dataclass
class ModelRequest:
    """One model request as stage 0 logged it (`request_done`, or `request_abandoned` for one cut off)."""

    prompt_tokens: int
    cached_tokens: int
    ttft_s: float | None  # None: abandoned before its first token
    finish_reason: str
    generated_tokens: int
    submitted: float  # epoch seconds, to order them


@dataclass
class AgentRun:
    client: str
    run: str  # cold | warm
    wall_s: float
    exit_code: int
    timed_out: bool
    requests: list[ModelRequest] = field(default_factory=list)
    stdout_tail: str = ""
    stderr_tail: str = ""

    def first(self) -> ModelRequest | None:
        return self.requests[0] if self.requests else None


def served_requests(run_dir: Path, since: float, until: float) -> list[ModelRequest]:
    """The model requests stage 0 (every stage 0 of the run) logged as submitted in [since, until], in order."""
    found = []
    for log in sorted(run_dir.glob("*.log")):
        for e in read_events(log):
            if e.get("event") == "request_done" and "cached_prompt_tokens" in e:
                ttft_s = float(str(e["ttft_ms"])) / 1e3
                took = ttft_s + float(str(e.get("decode_ms", 0.0))) / 1e3
                found.append(ModelRequest(int(str(e["prompt_tokens"])), int(str(e["cached_prompt_tokens"])), ttft_s,
                                          str(e["finish_reason"]), int(str(e["generated_tokens"])),
                                          float(str(e["ts"])) - took))
            elif e.get("event") == "request_abandoned":
                found.append(ModelRequest(int(str(e["prompt_tokens"])), int(str(e["cached_tokens"])), None, "abandoned",
                                          int(str(e["generated_tokens"])), float(str(e["ts"]))))
    return sorted((r for r in found if since <= r.submitted <= until), key=lambda r: r.submitted)


def _metric(server: Server, name: str) -> float | None:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        for line in conn.getresponse().read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    finally:
        conn.close()
    return None


def wait_idle(server: Server, timeout_s: float = 60.0) -> None:
    """Until the broker holds no request (stage 0 logged each one's end before the broker saw it end)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _metric(server, "skippy_requests_running") == 0 and _metric(server, "skippy_requests_waiting") == 0:
            return
        time.sleep(0.2)
    print(f"bench: {server.name} still busy {timeout_s:g} s after the client exited", file=sys.stderr)


def client_command(name: str, server: Server, home: Path, args: argparse.Namespace) -> tuple[list[str | Path], dict[str, str]]:
    """The command and environment of one fresh session of client `name` against `server`."""
    binary, model, timeout_ms = AGENTS_BIN / name, server.model or "", int(args.client_timeout * 1000)
    if name == "codex":
        provider = {"stream_idle_timeout_ms": timeout_ms, "request_max_retries": 0, "stream_max_retries": 0}
        env = client_env(home / "home", CODEX_HOME=str(codex_home(home, server.port, model, provider)))
        return [binary, "exec", "--skip-git-repo-check", args.prompt], env
    env = claude_env(home / "home", server.port, API_TIMEOUT_MS=str(timeout_ms),
                     CLAUDE_STREAM_IDLE_TIMEOUT_MS=str(timeout_ms), CLAUDE_CODE_MAX_RETRIES="0")
    tools = ["--tools", args.claude_tools] if args.claude_tools is not None else []
    return [binary, "--model", model, *tools, "-p", args.prompt], env


def bench_client(name: str, up_flags: list[str], tmp: Path, args: argparse.Namespace) -> list[AgentRun]:
    """A fresh `skippy up`, then client `name` cold and warm against it."""
    run_dir = tmp / name / "run"
    server = start_skippy_up(up_flags, run_dir, name=f"skippy-{name}")
    runs = []
    try:
        work = tmp / name / "work"
        work.mkdir()
        session = tmp / name / "session"
        for which in RUNS:
            shutil.rmtree(session, ignore_errors=True)  # fresh, at the same path: the path is in the clients' prompts
            argv, env = client_command(name, server, session, args)
            since = time.time()
            print(f"bench: {name} {which} ...", file=sys.stderr, flush=True)
            done: ClientRun = run_client(argv, work, env, args.client_timeout)
            wait_idle(server)
            runs.append(AgentRun(name, which, done.wall_s, done.returncode, done.timed_out,
                                 served_requests(run_dir, since, time.time()), done.stdout[-2000:], done.stderr[-4000:]))
    finally:
        print(f"bench: skippy up for {name} stopped ({stop(server)})", file=sys.stderr)
    return runs


def table(runs: list[AgentRun]) -> str:
    rows = [("client", "run", "wall s", "1st prompt tok", "1st cached tok", "1st TTFT s", "requests", "exit")]
    for r in runs:
        first = r.first()
        ttft = "-" if first is None or first.ttft_s is None else f"{first.ttft_s:.2f}"
        rows.append((r.client, r.run, f"{r.wall_s:.1f}", "-" if first is None else str(first.prompt_tokens),
                     "-" if first is None else str(first.cached_tokens), ttft, str(len(r.requests)),
                     "timeout" if r.timed_out else str(r.exit_code)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(f"{cell:>{w}}" for cell, w in zip(row, widths, strict=True)) for row in rows)


def parse_clients(text: str) -> list[str]:
    """`--clients`: comma separated names of CLIENTS."""
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in CLIENTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown {','.join(unknown) or '(none)'}; choose from {', '.join(CLIENTS)}")
    return names


def failures(runs: list[AgentRun]) -> list[str]:
    """A line for each run that did not end well: what the client said last."""
    lines = []
    for r in runs:
        if r.timed_out or r.exit_code != 0:
            said = (r.stdout_tail.strip() or r.stderr_tail.strip()).splitlines() or [""]
            lines.append(f"{r.client} {r.run}: {'timed out' if r.timed_out else f'exit {r.exit_code}'}: {said[-1][:300]}")
    return lines


def run_agents_bench(args: argparse.Namespace) -> int:
    names: list[str] = args.clients
    if not 0 < args.client_timeout < math.inf:
        raise ConfigError(f"agents: --client-timeout must be a number of seconds > 0, got {args.client_timeout}")
    if not args.prompt.strip():
        raise ConfigError("agents: --prompt is empty")
    if args.out and not Path(args.out).parent.is_dir():
        raise ConfigError(f"agents: --out {args.out}: no directory {Path(args.out).parent}")
    taken = [f for f in args.passthrough if f.split("=", 1)[0] in UP_FLAGS_TAKEN]
    if taken:
        raise ConfigError(f"agents: {taken[0]} after --: the bench sets --bind and --run-dir itself")
    up_flags = [*(["--model", args.model] if args.model else []), *args.passthrough]
    skipped = {n: why for n in names if (why := client_missing(n)) is not None}
    for name, why in skipped.items():
        print(f"bench: skipping {name}: {why}", file=sys.stderr)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    runs: list[AgentRun] = []
    with tempfile.TemporaryDirectory(prefix="skippy-bench-agents-") as tmp:
        for name in names:
            if name not in skipped:
                runs += bench_client(name, up_flags, Path(tmp), args)
    print(f"skippy up {' '.join(up_flags) or '(defaults)'}; prompt {args.prompt!r}; each run a fresh session,"
          f" cold then warm; client timeouts {args.client_timeout:g} s, retries off; TTFT: stage 0, submit to first"
          f" token\n{table(runs)}")
    for line in [*failures(runs), *(f"{name}: skipped: {why}" for name, why in skipped.items())]:
        print(line)
    if args.out:
        report: dict[str, Any] = {"up_flags": up_flags, "prompt": args.prompt, "client_timeout_s": args.client_timeout,
                                  "claude_tools": args.claude_tools, "skipped": skipped,
                                  "runs": [asdict(r) for r in runs]}
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def add_to(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("agents", help="Codex CLI and Claude Code: wall time to the first answer, cold and warm prefix cache",
                         description="skippy bench agents [flags] [-- skippy up flags]")
    p.add_argument("--model", default=None, help="passed to skippy up (default: its own default model)")
    p.add_argument("--clients", type=parse_clients, default=list(CLIENTS),
                   help=f"comma separated, of {', '.join(CLIENTS)} (default both)")
    p.add_argument("--prompt", default=PROMPT, help=f"the task given to each client (default {PROMPT!r})")
    p.add_argument("--client-timeout", type=float, default=1800.0,
                   help="seconds a client run may take, and its own request/stream timeouts (default 1800)")
    p.add_argument("--claude-tools", default=None,
                   help="Claude Code's --tools (e.g. Read; default: its default tools, untrimmed)")
    p.add_argument("--out", default=None, help="write the runs as JSON here")
    p.set_defaults(run=run_agents_bench)
