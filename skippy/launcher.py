"""Start and supervise a pipeline's stage processes: downstream first, each waited for until ready.

Each stage's JSON log goes to `<run_dir>/<stage_id>.log`. `StageProcesses.stop()` sends SIGTERM to
every stage, waits, and kills what is left, so nothing outlives its owner. `write_local_topology`
makes a topology plus one config per stage for a model split at given layers, on ipc:// endpoints
in a directory (or tcp on loopback), for tests, `skippy generate --topology` and scripts.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from skippy.config import StageTopology

READY_TIMEOUT_S = 120.0


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the launching process dies, however it dies (no orphans)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class LaunchError(RuntimeError):
    """A stage exited or never logged `ready`; the message names it and points at its log."""


def write_local_topology(
    directory: Path, model_path: str | Path, n_layer: int, split_points: Sequence[int], *, lane_count: int = 4,
    ctx_size: int = 512, topology_id: str = "local", model_id: str = "model", tcp_ports: Sequence[int] | None = None,
    extra: dict[str, object] | None = None,
) -> tuple[Path, list[Path]]:
    """Write topology.json and stage<i>.json for the split; returns (topology path, config paths)."""
    directory.mkdir(parents=True, exist_ok=True)
    edges = [0, *split_points, n_layer]
    endpoints = [
        f"tcp://127.0.0.1:{tcp_ports[i]}" if tcp_ports else f"ipc://{directory.resolve()}/stage{i}.sock"
        for i in range(len(edges) - 1)
    ]
    stages = [
        {"stage_id": f"stage{i}", "stage_index": i, "host": "127.0.0.1", "endpoint": endpoints[i],
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
        path = directory / f"stage{i}.json"
        path.write_text(json.dumps(config, indent=2))
        configs.append(path)
    return topology, configs


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
    """Supervised `skippy ...` child processes, each logging to <run_dir>/<name>.log; stop() ends them all."""

    def __init__(self, run_dir: Path, env: dict[str, str] | None = None) -> None:
        self.run_dir = run_dir
        self.env = {**os.environ, **(env or {})}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def log_path(self, name: str) -> Path:
        return self.run_dir / f"{name}.log"

    def start_process(self, name: str, skippy_args: list[str], timeout_s: float = READY_TIMEOUT_S) -> None:
        """Run `skippy <skippy_args>` as child `name`, logging to <run_dir>/<name>.log, and wait for `ready`."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path(name)
        offset = log.stat().st_size if log.exists() else 0
        cmd = [sys.executable, "-m", "skippy.cli.main", *skippy_args]
        with log.open("ab") as out:
            self.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                                start_new_session=True, preexec_fn=_die_with_parent)
        self.wait_ready(name, offset, timeout_s)

    def supervise(self, program: str, start: Callable[[], str]) -> int:
        """Run `start` (which returns the ready line to print), then watch until SIGINT/SIGTERM (exit 0)
        or until a child dies (reported by name; exit 1); everything started is stopped either way."""
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            print(start(), flush=True)
            while not stop.wait(0.2):  # supervision poll
                dead = self.dead()
                for name, code in dead:
                    print(f"{program}: {name} exited with code {code} (log {self.log_path(name)}); stopping",
                          file=sys.stderr)
                if dead:
                    return 1
            return 0
        finally:
            codes = self.stop()
            print(f"stopped: {', '.join(f'{name}={code}' for name, code in codes.items())}", file=sys.stderr)

    def dead(self) -> list[tuple[str, int]]:
        """Children that have exited: (name, exit code)."""
        return [(name, p.returncode) for name, p in self.procs.items() if p.poll() is not None]

    def wait_ready(self, stage_id: str, offset: int, timeout_s: float) -> None:
        log, proc = self.log_path(stage_id), self.procs[stage_id]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with log.open("rb") as f:
                f.seek(offset)
                if any(b'"event": "ready"' in line for line in f):
                    return
            if proc.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                raise LaunchError(f"stage {stage_id} exited with code {proc.returncode} before ready (log {log}): "
                                  + " | ".join(tail))
            time.sleep(0.05)  # bounded poll of the child's log file
        raise LaunchError(f"stage {stage_id} not ready within {timeout_s:g} s (log {log})")

    def kill(self, stage_id: str) -> None:
        """SIGKILL one stage (tests of failure handling)."""
        proc = self.procs[stage_id]
        proc.kill()
        proc.wait(10)

    def stop(self, timeout_s: float = 15.0) -> dict[str, int | None]:
        """SIGTERM every child (most recently started first), wait, then SIGKILL stragglers; returns exit codes."""
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        codes: dict[str, int | None] = {}
        for stage_id, proc in self.procs.items():
            try:
                codes[stage_id] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[stage_id] = proc.wait(5)
        return codes



class StageProcesses(Children):
    """Stage processes of one topology (optionally skipping stage 0), started downstream first."""

    def __init__(self, topology_path: Path, config_paths: Sequence[Path], run_dir: Path,
                 flags: Sequence[str] = (), include_stage0: bool = False, env: dict[str, str] | None = None) -> None:
        super().__init__(run_dir, env)
        self.topology_path = topology_path
        self.topology = StageTopology.load(topology_path)
        self.config_paths = list(config_paths)
        self.flags = list(flags)
        self.first = 0 if include_stage0 else 1

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> StageProcesses:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            for index in range(len(self.config_paths) - 1, self.first - 1, -1):
                self.start_stage(index, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def start_stage(self, index: int, timeout_s: float = READY_TIMEOUT_S) -> None:
        self.start_process(self.topology.stages[index].stage_id,
                           ["stage", "--config", str(self.config_paths[index]), "--topology", str(self.topology_path),
                            *self.flags], timeout_s)

    def __enter__(self) -> StageProcesses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
