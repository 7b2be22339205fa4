"""Helpers for the end-to-end `skippy up` tests (imported by conftest.py and the test modules)."""

from __future__ import annotations

import http.client
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
READYZ_TIMEOUT_S = 30.0
_READY_PREFIX = "skippy ready: "
# the shared tiny-llama server of tests/openai (conftest.py's `server`): 2 lanes, concurrency 2, queue capacity 2,
# default max_tokens 11
SHARED_SERVER_FLAGS = ("--openai-generation-concurrency", "2", "--openai-generation-queue-capacity", "2",
                       "--openai-default-max-tokens", "11")


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class SkippyServer:
    proc: subprocess.Popen[str]
    run_dir: Path
    stderr_path: Path
    base_url: str  # http://127.0.0.1:PORT/v1
    model_id: str
    stdout_lines: list[str] = field(default_factory=list)

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        port = urlsplit(self.base_url).port
        assert port is not None
        return port

    def client(self, **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, max_retries=0, **{"api_key": "x", "timeout": 60.0, **kwargs})

    def request(self, method: str, path: str, body: bytes | str | dict[str, Any] | list[Any] | None = None,
                headers: dict[str, str] | None = None, timeout: float = 30.0) -> RawResponse:
        """One raw HTTP request on a fresh connection (no client-side validation)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            if isinstance(body, dict | list):
                body = json.dumps(body)
            hdrs = {"content-type": "application/json", **(headers or {})} if body is not None else dict(headers or {})
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            return RawResponse(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    def stage_pids(self, stage_id: str) -> list[int]:
        """Pids of the stage process whose command line names <run_dir>/topology/<stage_id>.json."""
        config = str(self.run_dir / "topology" / f"{stage_id}.json")
        out = subprocess.run(["pgrep", "-f", config], capture_output=True, text=True).stdout
        return [int(pid) for pid in out.split()]

    def log_tail(self, lines: int = 15) -> str:
        parts = [f"--- skippy up stdout ---\n{''.join(self.stdout_lines)}",
                 f"--- skippy up stderr ---\n{_read(self.stderr_path)}"]
        for log in sorted(self.run_dir.glob("*.log")):
            parts.append(f"--- {log.name} (last {lines} lines) ---\n"
                         + "\n".join(_read(log).splitlines()[-lines:]))
        return "\n".join(parts)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def leftover_processes(run_dir: Path) -> list[str]:
    """`skippy.cli.main` processes whose command line mentions the run directory."""
    out = subprocess.run(["pgrep", "-af", "skippy.cli.main"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(run_dir) in line]


def _pump(stream: Any, lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def wait_readyz(server: SkippyServer, timeout_s: float = READYZ_TIMEOUT_S) -> None:
    """Bounded poll of /readyz until it says 200."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            pytest.fail(f"skippy up exited with {server.proc.returncode} before /readyz\n{server.log_tail()}")
        try:
            last = server.request("GET", "/readyz", timeout=5.0)
            if last.status == 200:
                return
        except OSError as exc:
            last = exc
        time.sleep(0.05)  # poll interval of a bounded poll
    pytest.fail(f"/readyz not 200 within {timeout_s:g} s (last: {last})\n{server.log_tail()}")


def wait_idle(server: SkippyServer, timeout_s: float = READYZ_TIMEOUT_S) -> None:
    """Bounded poll of /readyz until no request holds or waits for a generation permit.

    A response that ended on a stop string is complete before its generation is cancelled at the
    pipeline; greedy text is only reproducible when the next request does not share the batch /
    KV cache with that still-running one, so tests comparing greedy outputs wait for this.
    """
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = server.request("GET", "/readyz", timeout=5.0)
        if last.status == 200 and last.json().get("running") == 0 and last.json().get("waiting") == 0:
            return
        time.sleep(0.01)  # poll interval of a bounded poll
    pytest.fail(f"server not idle within {timeout_s:g} s (last /readyz: {last})")


def stop_up(server: SkippyServer) -> int | None:
    """SIGINT, wait up to 30 s, else SIGKILL the group; returns the exit code and asserts no leftovers."""
    proc = server.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)  # in case a test froze the supervisor
        proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with _suppress_lookup():
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        pytest.fail(f"skippy up did not stop within {STOP_TIMEOUT_S:g} s of SIGINT\n{server.log_tail()}")
    left = leftover_processes(server.run_dir)
    assert not left, f"processes left behind after skippy up stopped: {left}"
    return code


@contextmanager
def _suppress_lookup() -> Iterator[None]:
    try:
        yield
    except ProcessLookupError:
        pass


@contextmanager
def launch_up(run_root: Path, cache_dir: Path, model: Path | None, args: Sequence[str] = ()) -> Iterator[SkippyServer]:
    """`skippy up` on 127.0.0.1:0 in `run_root/run`; yields the ready server and stops it afterwards."""
    run_dir = run_root / "run"
    stderr_path = run_root / "up.stderr"
    cmd = [sys.executable, "-m", "skippy.cli.main", "up", "--bind", "127.0.0.1:0", "--run-dir", str(run_dir)]
    if model is not None:
        cmd += ["--model", str(model), "--split", "3", "--lane-count", "2"]
    cmd += list(args)  # later flags override the defaults above
    env = {**os.environ, "SKIPPY_CACHE_DIR": str(cache_dir), "PYTHONUNBUFFERED": "1"}
    with stderr_path.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                text=True, start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    server = SkippyServer(proc, run_dir, stderr_path, "", "")
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not server.base_url:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"skippy up not ready within {READY_TIMEOUT_S:g} s\n{server.log_tail()}")
            try:
                line = lines.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if line is None:
                proc.wait(10)
                pytest.fail(f"skippy up exited with {proc.returncode} before ready\n{server.log_tail()}")
            server.stdout_lines.append(line)
            if line.startswith(_READY_PREFIX):
                words = line[len(_READY_PREFIX):].split()
                server.base_url = words[0]
                server.model_id = line.split("(model ", 1)[1].split(")", 1)[0]
        assert server.base_url.startswith("http://127.0.0.1:") and server.base_url.endswith("/v1"), server.base_url
        wait_readyz(server)
        yield server
    finally:
        stop_up(server)
