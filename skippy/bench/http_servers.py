"""`skippy bench http`, the servers: start `skippy up`, llama-cpp-python's OpenAI server and llama.cpp's own
`llama-server` on the same GGUF and the same cores, wait until each answers, and stop them.

Each server runs in its own process group with its log in the bench's temp dir. skippy is ready when
`skippy up` prints its ready line; the llama.cpp servers when their HTTP endpoint answers 200
(llama-server's /health answers 503 while the model loads). `stop` sends SIGINT, waits, then SIGKILLs
the process group.
"""

from __future__ import annotations

import http.client
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from skippy.bench.http_load import Server
from skippy.openmp import user_env

__all__ = ["LLAMA_SERVER_SLOT_CTX", "llama_server_args", "start_llama_cpp_python", "start_llama_server", "start_skippy",
           "start_skippy_up", "stop"]

READY = re.compile(r"skippy ready: (http://\S+)/v1 \(model (\S+)\)")
LLAMA_SERVER_SLOT_CTX = 512  # context per llama-server slot (skippy up's default per lane before its lanes shared a pool)


def _drain(stream: IO[bytes] | None, lines: queue.Queue[bytes]) -> None:
    assert stream is not None
    for line in iter(stream.readline, b""):
        lines.put(line)


def start_skippy(model: str, split: str | None, run_dir: Path, lanes: int, flags: Sequence[str] = (),
                 name: str = "skippy") -> Server:
    """`skippy up` at `split` (None: its own choice, planned when `flags` name hosts, e.g. --stage-cpus)."""
    return start_skippy_up(["--model", model, *(["--split", split] if split else []), "--lane-count", str(lanes),
                            "--openai-generation-concurrency", str(lanes), *flags], run_dir, name)


def start_skippy_up(up_flags: Sequence[str], run_dir: Path, name: str = "skippy") -> Server:
    """`skippy up UP_FLAGS` on 127.0.0.1, a free port, logs in `run_dir`; its stderr in `run_dir`'s parent."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(Path(sys.executable).with_name("skippy")), "up", "--bind", "127.0.0.1:0", "--run-dir", str(run_dir), *up_flags]
    with open(run_dir.parent / f"{name}-up.stderr", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    lines: queue.Queue[bytes] = queue.Queue()  # stdout, drained by a thread so the ready wait can time out
    threading.Thread(target=_drain, args=(proc.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + 300
    server = Server(name, proc, "", 0, None)
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            match = READY.search(lines.get(timeout=0.5).decode())
        except queue.Empty:
            continue
        if match:
            host, port = match.group(1).removeprefix("http://").rsplit(":", 1)
            server.host, server.port, server.model = host, int(port), match.group(2)
            return server
    stop(server)
    raise SystemExit(f"bench: {name} (skippy up) did not get ready (see {run_dir.parent / f'{name}-up.stderr'})")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_http(name: str, cmd: list[str], port: int, log_path: Path, ready_path: str, timeout_s: float = 180) -> Server:
    """Start `cmd` (serving on 127.0.0.1:`port`); wait until GET `ready_path` answers 200. It runs as its user
    would run it: without the OpenMP settings skippy gave this process (skippy.openmp)."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=user_env(os.environ))
    server = Server(name, proc, "127.0.0.1", port, None)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", ready_path)
            if conn.getresponse().status == 200:
                return server
        except OSError:
            pass
        time.sleep(0.3)
    stop(server)
    raise SystemExit(f"bench: {name} did not get ready (see {log_path})")


def start_llama_cpp_python(model: Path, log_path: Path, threads: int) -> Server:
    """llama-cpp-python's server; `--interrupt_requests False`, else a new request ends the running stream."""
    port = _free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1", "--port",
           str(port), "--n_ctx", "2048", "--n_threads", str(threads), "--n_threads_batch", str(threads),
           "--interrupt_requests", "False"]
    return _start_http("llama-cpp-python", cmd, port, log_path, "/v1/models")


def llama_server_args(parallel: int, threads: int, speculative: bool = False,
                      slot_ctx: int = LLAMA_SERVER_SLOT_CTX) -> list[str]:
    """llama-server's flags besides model and address: N slots of `slot_ctx` tokens, `threads` threads;
    `speculative`: its own n-gram drafting from the context (`--spec-type ngram-simple`, no draft model)."""
    return ["--parallel", str(parallel), "-c", str(parallel * slot_ctx), "-t", str(threads),
            "-tb", str(threads), *(["--spec-type", "ngram-simple"] if speculative else [])]


def start_llama_server(binary: Path, model: Path, log_path: Path, parallel: int, threads: int,
                       speculative: bool = False, cpus: str | None = None,
                       slot_ctx: int = LLAMA_SERVER_SLOT_CTX) -> Server:
    """llama.cpp's llama-server (continuous batching over `parallel` slots); `cpus`: pinned there (taskset)."""
    port = _free_port()
    cmd = [*(["taskset", "-c", cpus] if cpus else []), str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           *llama_server_args(parallel, threads, speculative, slot_ctx)]
    return _start_http(log_path.stem, cmd, port, log_path, "/health")


def stop(server: Server, timeout_s: float = 30.0) -> int | None:
    """SIGINT, wait; then SIGKILL the process group."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGINT)
        try:
            server.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait()
    return server.proc.returncode
