"""Start and supervise a pipeline's stage processes: downstream first, each waited for until ready.

A child says ready over a pipe (`SKIPPY_READY_FD`, see `skippy.log.announce_ready`) with its bound
endpoints; a thread per child waits on its exit. Each stage's JSON log goes to
`<run_dir>/<stage_id>.log` (a stage on another machine starts through its `remote_prefix`: skippy.remote).
`StageProcesses.stop()` sends SIGTERM to every stage, waits, and kills what is left, so nothing outlives its owner.
`write_local_topology` makes a topology plus one config per stage for a model split at given layers, on ipc:// endpoints
in a directory (or tcp on loopback), for tests, `skippy generate --topology` and scripts.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from skippy.config import StageTopology
from skippy.config.cpu_sets import CpuSet, stages_sharing_cores
from skippy.log import READY_FD_ENV
from skippy.netns.owner import stage_address, stage_command_prefix
from skippy.openmp import stage_env
from skippy.telemetry.targets import record_target

READY_TIMEOUT_S = 120.0


def die_with_parent() -> None:
    """In the child: get SIGTERM when the launching process dies, however it dies (no orphans)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Restarts(Protocol):
    """What `Children.supervise` asks when a child dies (skippy.restarts.StageRestarter)."""

    def restart(self, name: str, code: int) -> bool: ...  # True: it will be brought back, keep serving
    def close(self) -> None: ...  # no more restarts: everything is about to stop


class LaunchError(RuntimeError):
    """A child exited or never said ready; the message names it, the knob to raise, and its log."""


def write_local_topology(
    directory: Path, model_path: str | Path, n_layer: int, split_points: Sequence[int], *, lane_count: int = 4,
    ctx_size: int = 512, topology_id: str = "local", model_id: str = "model", tcp_ports: Sequence[int] | None = None,
    extra: dict[str, object] | None = None, stage_prefix: str = "",
) -> tuple[Path, list[Path]]:
    """Write topology.json and stage<i>.json for the split; returns (topology path, config paths). Stage ids are
    `<stage_prefix>stage<i>` (a prefix keeps replicas' stages apart under one `skippy up`)."""
    directory.mkdir(parents=True, exist_ok=True)
    edges = [0, *split_points, n_layer]
    endpoints = [
        f"tcp://127.0.0.1:{tcp_ports[i]}" if tcp_ports else f"ipc://{directory.resolve()}/stage{i}.sock"
        for i in range(len(edges) - 1)
    ]
    stages = [
        {"stage_id": f"{stage_prefix}stage{i}", "stage_index": i, "host": "127.0.0.1", "endpoint": endpoints[i],
         "layer_start": edges[i], "layer_end": edges[i + 1], "load_mode": "runtime-slice"}
        for i in range(len(edges) - 1)
    ]
    topology = directory / "topology.json"
    topology.write_text(json.dumps({"topology_id": topology_id, "model_id": model_id, "stages": stages}, indent=2))
    configs = []
    for i, stage in enumerate(stages):
        peer = lambda j: {"stage_id": stages[j]["stage_id"], "stage_index": j, "endpoint": endpoints[j]}  # noqa: E731
        config = {
            "run_id": topology_id, "topology_id": topology_id, "model_id": model_id, "model_path": str(model_path),
            "stage_id": stage["stage_id"], "stage_index": i, "layer_start": stage["layer_start"],
            "layer_end": stage["layer_end"], "ctx_size": ctx_size, "lane_count": lane_count,
            "load_mode": "runtime-slice", "bind_addr": endpoints[i],
            "upstream": peer(i - 1) if i > 0 else None, "downstream": peer(i + 1) if i + 1 < len(stages) else None,
            **(extra or {}),
        }
        path = directory / f"{stage['stage_id']}.json"  # `skippy up --topology` finds it by stage id
        path.write_text(json.dumps(config, indent=2))
        configs.append(path)
    return topology, configs


def default_kv_cache(lane_count: int) -> dict[str, object]:
    """`skippy up`'s prefix cache: 4 entries per lane, kept outside the lanes' KV pool in at most as many bytes as the
    pool's (max_bytes 0), every other `kv_cache` field at its default."""
    return {"mode": "lookup-record", "max_entries": 4 * lane_count, "max_bytes": 0}


def read_events(log_path: Path) -> list[dict[str, object]]:
    """The JSON lines of a log file (other lines skipped)."""
    events = []
    try:
        text = log_path.read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


class Children:
    """Supervised `skippy ...` child processes, each logging to <run_dir>/<name>.log; stop() ends them all.

    Readiness is a handshake: each child gets the write end of a pipe (`SKIPPY_READY_FD`) and writes
    its `ready` fields there (bound endpoints, URL); `ready[name]` keeps them. A thread per child
    waits on its exit, so supervision reacts to a death at once instead of polling.
    """

    def __init__(self, run_dir: Path, env: dict[str, str] | None = None) -> None:
        self.run_dir = run_dir
        self.env = {**os.environ, **(env or {})}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ready: dict[str, dict[str, Any]] = {}
        # None: a signal asked to stop. A SimpleQueue because the signal handlers put into it: Queue.put takes the
        # lock that the main thread holds inside get(), and a signal landing there deadlocked `skippy up` for good
        self._exits: queue.SimpleQueue[tuple[str, int] | None] = queue.SimpleQueue()
        self._async_exits: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[tuple[str, int]]]] = []
        self._lock = threading.Lock()
        self._stopping = False

    def log_path(self, name: str) -> Path:
        return self.run_dir / f"{name}.log"

    def start_process(self, name: str, skippy_args: list[str], timeout_s: float = READY_TIMEOUT_S,
                      prefix: Sequence[str] = (), env: dict[str, str] | None = None) -> dict[str, Any]:
        """Run `skippy <skippy_args>` as child `name` (log: <run_dir>/<name>.log); wait for its ready fields.
        `prefix` runs it through another command first (`ip netns exec NS`: it execs, the pid stays); `env` adds
        to the children's environment for this one."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        read_fd, write_fd = os.pipe()
        cmd = [*prefix, sys.executable, "-m", "skippy.cli.main", *skippy_args]
        try:
            with self.log_path(name).open("ab") as out:
                self.procs[name] = proc = subprocess.Popen(
                    cmd, stdout=out, stderr=subprocess.STDOUT, env={**self.env, **(env or {}), READY_FD_ENV: str(write_fd)},
                    pass_fds=(write_fd,), start_new_session=True, preexec_fn=die_with_parent)
        finally:
            os.close(write_fd)  # the child holds the only write end: EOF = it exited
        threading.Thread(target=self._wait_exit, args=(name, proc), name=f"wait-{name}", daemon=True).start()
        try:
            self.ready[name] = self._read_ready(name, read_fd, timeout_s)
        finally:
            os.close(read_fd)
        record_target(self.run_dir, name, self.ready[name])  # <run_dir>/metrics-targets.json: where its /metrics is
        return self.ready[name]

    def _read_ready(self, name: str, fd: int, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        data = b""
        while b"\n" not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise LaunchError(f"{name} not ready within {timeout_s:g} s (raise --startup-timeout-secs;"
                                  f" log {self.log_path(name)})")
            chunk = os.read(fd, 65536)
            if not chunk:
                code = self.procs[name].wait()
                tail = self.log_path(name).read_text(errors="replace").strip().splitlines()[-3:]
                raise LaunchError(f"{name} exited with code {code} before ready (log {self.log_path(name)}): "
                                  + " | ".join(tail))
            data += chunk
        try:
            return dict(json.loads(data.split(b"\n", 1)[0]))
        except ValueError as exc:
            raise LaunchError(f"{name} sent an unreadable ready line ({exc}); log {self.log_path(name)}") from None

    def _wait_exit(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        with self._lock:
            if self._stopping:
                return
            self._exits.put((name, code))
            for loop, exits in self._async_exits:
                loop.call_soon_threadsafe(exits.put_nowait, (name, code))

    async def wait_dead(self) -> tuple[str, int]:
        """The next child to exit (not counting those stop() ends): (name, exit code)."""
        with self._lock:
            if not self._async_exits:
                exits: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
                self._async_exits.append((asyncio.get_running_loop(), exits))
                for name, code in self.dead():
                    exits.put_nowait((name, code))
            exits = self._async_exits[0][1]
        return await exits.get()

    def supervise(self, program: str, start: Callable[[], str], restarts: Restarts | None = None) -> int:
        """Run `start` (which returns the ready line to print), then wait until SIGINT/SIGTERM (exit 0)
        or until a child dies that `restarts` does not bring back (reported by name; exit 1); everything
        started is stopped either way (`restarts` is closed first)."""
        signal.signal(signal.SIGINT, lambda *_: self._exits.put(None))
        signal.signal(signal.SIGTERM, lambda *_: self._exits.put(None))
        try:
            print(start(), flush=True)
            while (event := self._exits.get()) is not None:  # blocks until a child exits or a signal arrives
                name, code = event
                if restarts is None or not restarts.restart(name, code):
                    print(f"{program}: {name} exited with code {code} (log {self.log_path(name)}); stopping",
                          file=sys.stderr)
                    return 1
            return 0
        finally:
            if restarts is not None:
                restarts.close()
            codes = self.stop()
            print(f"stopped: {', '.join(f'{name}={code}' for name, code in codes.items())}", file=sys.stderr)

    def dead(self) -> list[tuple[str, int]]:
        """Children that have exited: (name, exit code)."""
        return [(name, p.returncode) for name, p in self.procs.items() if p.poll() is not None]

    def kill(self, name: str) -> None:
        """SIGKILL one child (tests of failure handling)."""
        proc = self.procs[name]
        proc.kill()
        proc.wait(10)

    def stop(self, timeout_s: float = 15.0) -> dict[str, int | None]:
        """SIGTERM every child (most recently started first), wait, then SIGKILL stragglers; returns exit codes."""
        with self._lock:
            self._stopping = True
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        codes: dict[str, int | None] = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = proc.wait(5)
        return codes


@dataclass(frozen=True)
class PipelineFiles:
    """One pipeline's files: its topology, its stage configs (by stage_index) and its stages' `--stage-cpus`
    value (None: not pinned)."""

    topology: Path
    configs: list[Path]
    stage_cpus: str | None = None


class StageProcesses(Children):
    """Stage processes of one topology (optionally skipping stage 0), started downstream first; with `replicas`, those
    pipelines' stages too, each pipeline after the one before (every stage id must be distinct). `flags` go to
    every stage, `first_flags` (stage 0's driver options) to each stage 0 only, `last_flags` to a final stage
    only when it is not stage 0 (the native-MTP sidecar, docs/mtp.md); a pipeline's own `--stage-cpus`
    (`own_stage_cpus` for the first) to its stages. `stage_cpus` (every stage's CPUs, pipeline after pipeline)
    chooses each stage's OpenMP spin (skippy.openmp): a stage no other stage shares a CPU with gets the long
    one."""

    def __init__(self, topology_path: Path, config_paths: Sequence[Path], run_dir: Path,
                 flags: Sequence[str] = (), include_stage0: bool = False, env: dict[str, str] | None = None,
                 first_flags: Sequence[str] = (), last_flags: Sequence[str] = (),
                 stage_cpus: Sequence[CpuSet] = (), replicas: Sequence[PipelineFiles] = (),
                 own_stage_cpus: str | None = None, remote_prefix: Callable[[str], list[str]] | None = None) -> None:
        super().__init__(run_dir, env)
        self.remote_prefix = remote_prefix  # stage id -> the command it starts through on another machine ([]: here)
        self.flags, self.first_flags, self.last_flags = list(flags), list(first_flags), list(last_flags)
        self.first = 0 if include_stage0 else 1
        self.use([PipelineFiles(topology_path, list(config_paths), own_stage_cpus), *replicas], stage_cpus)

    def use(self, pipelines: Sequence[PipelineFiles], stage_cpus: Sequence[CpuSet] = ()) -> None:
        """Serve these pipelines' stages from now on (the first's topology is `topology`): a re-plan's."""
        self.pipelines = list(pipelines)
        self.topology_path, self.config_paths = self.pipelines[0].topology, list(self.pipelines[0].configs)
        self.topology = StageTopology.load(self.topology_path)
        self._stages: list[tuple[PipelineFiles, StageTopology, int]] = []  # (pipeline, its topology, stage_index)
        for pipeline in self.pipelines:
            topology = self.topology if pipeline.topology == self.topology_path else StageTopology.load(pipeline.topology)
            self._stages += [(pipeline, topology, i) for i in range(len(pipeline.configs))]
        self.shares_cores = stages_sharing_cores(len(self._stages), stage_cpus)

    def stage_ids(self) -> list[tuple[int, str, int]]:
        """(the index start_stage takes, stage id, stage_index in its pipeline) of every stage of every pipeline."""
        return [(n, topology.stages[i].stage_id, i) for n, (_, topology, i) in enumerate(self._stages)]

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> StageProcesses:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            offset = 0
            for pipeline in self.pipelines:  # each pipeline downstream first
                for i in range(len(pipeline.configs) - 1, self.first - 1, -1):
                    self.start_stage(offset + i, timeout_s)
                offset += len(pipeline.configs)
        except BaseException:
            self.stop()
            raise
        return self

    def start_stage(self, index: int, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start stage `index` (its stage_index in the first pipeline; replicas' stages follow, as stage_ids)."""
        pipeline, topology, i = self._stages[index]
        extra = self.first_flags if i == 0 else self.last_flags if i == len(pipeline.configs) - 1 else []
        own = ["--stage-cpus", pipeline.stage_cpus] if pipeline.stage_cpus else []
        stage = topology.stages[i]  # a stage whose address a network namespace owns starts inside it
        prefix = (self.remote_prefix and self.remote_prefix(stage.stage_id)) or stage_command_prefix(stage.endpoint, stage.host)
        # inside a namespace (or on another machine) its loopback is its own: /metrics at the host's address
        metrics = (["--metrics-bind", str(stage_address(stage.endpoint, stage.host))]
                   if prefix and not any(f.split("=", 1)[0] == "--metrics-bind" for f in self.flags) else [])
        self.start_process(stage.stage_id,
                           ["stage", "--config", str(pipeline.configs[i]), "--topology", str(pipeline.topology),
                            *self.flags, *metrics, *own, *extra], timeout_s, prefix=prefix,
                           env=stage_env(self.shares_cores[index], self.env))

    def __enter__(self) -> StageProcesses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
