"""`skippy bench hosts`, the peer: llama.cpp's RPC split of the same model over the same namespace hosts.

llama.cpp splits a model across machines with `ggml-rpc-server` on each other machine and `llama-server --rpc
HOST:PORT,... -ngl N` on the first: the first host reads the whole GGUF, keeps the first layers on its CPU and sends
the weights of the last N layers to the RPC servers, split between them by `--tensor-split`. Here each process runs
inside its namespace host (and its memory cgroup), llama-server on the first host and one RPC server on each other
one, with the layer ranges skippy's plan gave its stages, the same threads and as many slots as skippy has lanes over
a shared KV pool of the same cells (`--kv-unified`), and no prompt cache in RAM (`--cache-ram 0`; skippy runs without
its prefix cache): with it, llama-server copies an idle slot's KV state back from the RPC servers before each new
request, which over a 20 ms link stalled it for over a minute between requests. Ready when llama-server's /health
answers 200 from here.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from skippy.bench.http_load import Server
from skippy.netns import HostSet
from skippy.netns.cgroups import join_prefix
from skippy.openmp import user_env

__all__ = ["RPC_PORT", "RpcSplit", "rpc_layer_flags", "start_rpc_split", "stop_rpc_split"]

RPC_PORT = 50052
HTTP_PORT = 8090
READY_TIMEOUT_S = 900.0  # the first host sends every offloaded layer over the emulated link


@dataclass
class RpcSplit:
    server: Server
    rpc_servers: list[subprocess.Popen[bytes]]


def rpc_layer_flags(ranges: Sequence[tuple[int, int]]) -> list[str]:
    """llama-server's flags putting layer range k on host k: the first range stays on the first host's CPU, the
    others are offloaded (`-ngl` counts the last layers) to the RPC servers in order, in proportion to their ranges."""
    offloaded = [end - start for start, end in ranges[1:]]
    if not offloaded:
        return ["-ngl", "0"]
    return ["-ngl", str(sum(offloaded)), "--tensor-split", ",".join(str(n) for n in offloaded)]


def _in_host(hosts: HostSet, k: int, cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    namespace = hosts.namespace(k)
    with open(log, "wb") as out:
        return subprocess.Popen([*join_prefix(namespace), "ip", "netns", "exec", namespace, *cmd], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, env=user_env(os.environ))


def _listening(hosts: HostSet, k: int, port: int) -> bool:
    out = subprocess.run(["ip", "netns", "exec", hosts.namespace(k), "ss", "-Hltn", f"sport = :{port}"],
                         capture_output=True, text=True)
    return bool(out.stdout.strip())


def _healthy(address: str, port: int) -> bool:
    try:
        conn = http.client.HTTPConnection(address, port, timeout=5)
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False


def start_rpc_split(hosts: HostSet, binaries: tuple[Path, Path], model: Path, ranges: Sequence[tuple[int, int]],
                    threads: int, slots: int, kv_cells: int, log_dir: Path) -> RpcSplit:
    """An RPC server on hosts 2..len(ranges), then llama-server on host 1 split over them; returns once it is
    healthy (SystemExit naming the log when a process exits or the deadline passes)."""
    llama_server, rpc_server = binaries
    rpc_servers: list[subprocess.Popen[bytes]] = []
    server: subprocess.Popen[bytes] | None = None
    try:
        for k in range(2, len(ranges) + 1):
            log = log_dir / f"rpc-server-h{k}.log"
            rpc_servers.append(proc := _in_host(hosts, k, [str(rpc_server), "-H", hosts.address(k), "-p",
                                                           str(RPC_PORT), "-t", str(threads)], log))
            deadline = time.monotonic() + 60
            while not _listening(hosts, k, RPC_PORT):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"bench: ggml-rpc-server on host {k} did not listen (see {log})")
                time.sleep(0.2)  # poll interval of a bounded wait
        rpc = ",".join(f"{hosts.address(k)}:{RPC_PORT}" for k in range(2, len(ranges) + 1))
        log = log_dir / "llama-server-rpc.log"
        server = _in_host(hosts, 1, [
            str(llama_server), "-m", str(model), "--host", hosts.address(1), "--port", str(HTTP_PORT),
            *(["--rpc", rpc] if rpc else []), *rpc_layer_flags(ranges), "--parallel", str(slots), "--kv-unified",
            "-c", str(kv_cells), "--cache-ram", "0", "-t", str(threads), "-tb", str(threads)], log)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _healthy(hosts.address(1), HTTP_PORT):
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"bench: llama-server with --rpc did not get ready (see {log})")
            time.sleep(0.5)  # poll interval of a bounded wait
    except BaseException:
        _stop([*([server] if server is not None else []), *rpc_servers])
        raise
    return RpcSplit(Server("llama.cpp RPC", server, hosts.address(1), HTTP_PORT, None), rpc_servers)


def stop_rpc_split(split: RpcSplit) -> None:
    _stop([split.server.proc, *split.rpc_servers])


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process (group), then SIGKILL what is left after 30 s."""
    for proc in procs:
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
