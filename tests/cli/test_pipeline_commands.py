"""The pipeline commands as a user runs them, with real stage processes on a tiny model.

`skippy generate --topology` (starting and stopping its own stages, or using a running pipeline),
`skippy pipeline` (supervise; Ctrl-C stops all), `skippy wire`, `skippy logs`, and a stage whose
downstream never answers. Topologies live on ipc:// endpoints in short tmp dirs; every process a test
starts (directly or through a launcher) is found by its topology directory and stopped at teardown.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from skippy.launcher import read_events, write_local_topology

N_LAYER = 6
SPLIT = 3
PROMPT = "Hello world"
MAX_TOKENS = "8"
RUN_TIMEOUT_S = 120
READY_TIMEOUT_S = 120.0
POLL_S = 0.05  # interval of the bounded polls below (never a synchronisation by itself)


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, alive: subprocess.Popen[Any] | None = None,
             detail: Callable[[], str] = lambda: "") -> Any:
    """Poll `condition` until truthy (returned) or `timeout_s` passes; fail early if `alive` exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if alive is not None and alive.poll() is not None:
            pytest.fail(f"process exited with {alive.returncode} while waiting for {what}: {detail()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}: {detail()}")
        time.sleep(POLL_S)


def pids_mentioning(text: str) -> list[int]:
    """Processes whose command line mentions `text` (pgrep never lists itself)."""
    out = subprocess.run(["pgrep", "-f", text], capture_output=True, text=True, timeout=30)
    return [int(p) for p in out.stdout.split()]


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def events_named(log: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in read_events(log) if e.get("event") == name]


class Cli:
    """`python -m skippy.cli.main ...` with the session's slice cache, and one topology in a short dir."""

    def __init__(self, directory: Path, model: Path, cache_dir: Path) -> None:
        self.directory = directory
        self.model = model
        self.env = {**os.environ, "SKIPPY_CACHE_DIR": str(cache_dir)}
        self.topology, self.configs = write_local_topology(directory / "topo", model, N_LAYER, [SPLIT], lane_count=2)
        self.topo_dir = self.topology.parent
        self.run_dir = directory / "run"
        self.popens: list[subprocess.Popen[bytes]] = []
        stages = json.loads(self.topology.read_text())["stages"]
        self.endpoints = {s["stage_id"]: s["endpoint"] for s in stages}
        assert all(len(e) < 100 for e in self.endpoints.values()), self.endpoints  # ipc path limit

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "skippy.cli.main", *args]

    def run(self, *args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(self.cmd(*args), capture_output=True, timeout=timeout, env=self.env)

    def popen(self, *args: str, stdout: Path, stderr: Path) -> subprocess.Popen[bytes]:
        with stdout.open("wb") as out, stderr.open("wb") as err:
            proc = subprocess.Popen(self.cmd(*args), stdout=out, stderr=err, env=self.env)
        self.popens.append(proc)
        return proc

    def stop_everything(self) -> list[str]:
        """Stop what this test started: its Popen'd commands, then any process still naming the topology dir."""
        problems = []
        for proc in self.popens:
            if proc.poll() is None:
                problems.append(f"{proc.args} still running at teardown")
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        for pid in pids_mentioning(str(self.topo_dir)):
            problems.append(f"pid {pid} still names {self.topo_dir} at teardown")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return problems


@pytest.fixture(scope="module")
def model_path(tiny_model: Callable[..., Path]) -> Path:
    return tiny_model("gemma3", n_layer=N_LAYER)


@pytest.fixture
def cli(model_path: Path, skippy_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    c = Cli(tmp_path_factory.mktemp("cli"), model_path, skippy_cache_dir)
    try:
        yield c
    finally:
        problems = c.stop_everything()
    assert not problems, problems


@pytest.fixture(scope="module")
def single_process_completion(model_path: Path, skippy_cache_dir: Path) -> bytes:
    """stdout of `skippy generate --model M --split 3` (one process, greedy)."""
    out = subprocess.run(
        [sys.executable, "-m", "skippy.cli.main", "generate", "--model", str(model_path), "--split", str(SPLIT),
         "--prompt", PROMPT, "--max-tokens", MAX_TOKENS],
        capture_output=True, timeout=RUN_TIMEOUT_S, env={**os.environ, "SKIPPY_CACHE_DIR": str(skippy_cache_dir)},
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    assert out.stdout.startswith(PROMPT.encode()) and len(out.stdout) > len(PROMPT) + 1, out.stdout
    return out.stdout


def assert_one_line_error(stderr: str, *needles: str) -> str:
    """Apart from JSON log lines, stderr is exactly one line holding every needle, with no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("{")]
    assert len(lines) == 1, stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# --- a. generate --topology starts, uses and stops its own stages ----------------------------------------------


def test_generate_over_topology_matches_single_process_and_leaves_no_stage(
        cli: Cli, single_process_completion: bytes) -> None:
    out = cli.run("generate", "--topology", str(cli.topology), "--prompt", PROMPT, "--max-tokens", MAX_TOKENS,
                  "--run-dir", str(cli.run_dir))
    stderr = out.stderr.decode(errors="replace")
    assert out.returncode == 0, stderr
    assert out.stdout == single_process_completion, stderr
    assert "starting 2 stage processes" in stderr
    assert pids_mentioning(str(cli.topo_dir)) == []
    for stage_id in ("stage0", "stage1"):
        log = cli.run_dir / f"{stage_id}.log"
        assert events_named(log, "ready"), log.read_text(errors="replace")[-2000:]
        assert events_named(log, "stopped"), log.read_text(errors="replace")[-2000:]


# --- b. pipeline + generate + wire + logs + Ctrl-C --------------------------------------------------------------


def test_pipeline_serves_generate_takes_wire_changes_and_stops_on_ctrl_c(
        cli: Cli, single_process_completion: bytes) -> None:
    out_path, err_path = cli.directory / "pipeline.out", cli.directory / "pipeline.err"
    pipeline = cli.popen("pipeline", str(cli.topology), "--run-dir", str(cli.run_dir), "--",
                         "--downstream-wire-delay-ms", "1", stdout=out_path, stderr=err_path)
    stage0_log, stage1_log = cli.run_dir / "stage0.log", cli.run_dir / "stage1.log"

    def pipeline_output() -> str:
        return (f"stdout: {out_path.read_text(errors='replace')!r} stderr: {err_path.read_text(errors='replace')!r}")

    wait_for(lambda: " ready: " in out_path.read_text(errors="replace"), READY_TIMEOUT_S, "the pipeline's ready line",
             alive=pipeline, detail=pipeline_output)
    assert events_named(stage0_log, "ready") and events_named(stage1_log, "ready")

    # generate uses the running pipeline: it starts nothing and prints the same completion
    gen = cli.run("generate", "--topology", str(cli.topology), "--prompt", PROMPT, "--max-tokens", MAX_TOKENS)
    gen_err = gen.stderr.decode(errors="replace")
    assert gen.returncode == 0, gen_err
    assert "starting" not in gen_err, gen_err
    assert gen.stdout == single_process_completion
    assert pipeline.poll() is None, pipeline_output()

    # wire: stage 0 logs the new condition of its downstream link
    wire = cli.run("wire", str(cli.topology), "--delay-ms", "7")
    assert wire.returncode == 0, wire.stderr.decode(errors="replace")
    changed = wait_for(lambda: [e for e in events_named(stage0_log, "wire_changed") if e.get("delay_ms") == 7],
                       30.0, "stage0's wire_changed line", alive=pipeline, detail=pipeline_output)
    assert len(changed) == 1, changed
    assert changed[0]["downstream"] == cli.endpoints["stage1"]
    assert changed[0]["mbps"] is None

    # logs: the merged, filtered JSON lines
    logs = cli.run("logs", str(cli.run_dir), "--event", "wire_changed", "--json", timeout=60)
    assert logs.returncode == 0, logs.stderr.decode(errors="replace")
    printed = [json.loads(line) for line in logs.stdout.decode().splitlines()]
    assert printed == changed
    none_yet = cli.run("logs", str(cli.run_dir), "--stage", "stage1", "--event", "stopped", timeout=60)
    assert none_yet.returncode == 0, none_yet.stderr.decode(errors="replace")
    assert none_yet.stdout == b""

    # Ctrl-C stops every stage cleanly
    pipeline.send_signal(signal.SIGINT)
    try:
        code = pipeline.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pipeline still running 30 s after SIGINT: {pipeline_output()}")
    stderr = err_path.read_text(errors="replace")
    assert code == 0, stderr
    match = re.search(r"^stopped: (.*)$", stderr, re.MULTILINE)
    assert match, stderr
    codes = dict(part.split("=") for part in match.group(1).split(", "))
    assert codes == {"stage0": "0", "stage1": "0"}, stderr
    for log in (stage0_log, stage1_log):
        assert events_named(log, "stopped"), log.read_text(errors="replace")[-2000:]
    assert pids_mentioning(str(cli.topo_dir)) == []

    stopped = cli.run("logs", str(cli.run_dir), "--stage", "stage1", "--event", "stopped", "--json", timeout=60)
    assert [e["event"] for e in json_lines(stopped.stdout.decode())] == ["stopped"]


# --- c. a downstream that never answers ---------------------------------------------------------------------------


def test_stage_without_downstream_fails_startup_with_one_line(cli: Cli) -> None:
    out = cli.run("stage", "--config", str(cli.configs[0]), "--topology", str(cli.topology),
                  "--downstream-connect-timeout-secs", "1", timeout=60)
    stderr = out.stderr.decode(errors="replace")
    assert out.returncode == 2, stderr
    assert_one_line_error(stderr, cli.endpoints["stage1"], "--downstream-connect-timeout-secs")
    assert pids_mentioning(str(cli.topo_dir)) == []


# --- d. logs of a missing run directory -------------------------------------------------------------------------


def test_logs_of_a_missing_run_dir_is_one_line(cli: Cli) -> None:
    out = cli.run("logs", "/no/such/dir", timeout=60)
    stderr = out.stderr.decode(errors="replace")
    assert out.returncode == 2, stderr
    assert out.stdout == b""
    assert_one_line_error(stderr, "/no/such/dir")
    assert len(stderr.strip().splitlines()) == 1
