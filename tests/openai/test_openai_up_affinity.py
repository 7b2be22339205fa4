"""CPU affinity reaches the stage processes: `skippy up --stage-cpus` pins stage i to the i-th set, every
thread of the process (read from /proc/<pid>/task/*/status), before the model loads (the `loading`
line names the set), and llama.cpp's default thread count follows it. No timing is asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from up_helpers import SkippyServer

from skippy.cpu_pinning import allowed_cpus
from skippy.launcher import read_events
from skippy.openmp import stage_env

needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs this process may use")


def _thread_cpus(pid: int) -> set[tuple[int, ...]]:
    """The allowed CPUs of every thread of `pid`."""
    return {allowed_cpus(f"{pid}/task/{tid}") for tid in os.listdir(f"/proc/{pid}/task")}


def _spin(alone: bool) -> str:
    """The OpenMP spin a stage gets (skippy.openmp): long when no other stage shares its CPUs, unless the user
    running the tests chose one."""
    return stage_env(not alone, os.environ).get("GOMP_SPINCOUNT", os.environ["GOMP_SPINCOUNT"])


def _loading(server: SkippyServer, stage_id: str) -> dict[str, Any]:
    return _event(server, stage_id, "loading")


def _event(server: SkippyServer, stage_id: str, name: str) -> dict[str, Any]:
    return next(e for e in read_events(server.run_dir / f"{stage_id}.log") if e.get("event") == name)


@needs_two_cpus
def test_up_pins_each_stage_to_its_cpus(start_up: Callable[..., Any], tiny_llama: Path) -> None:
    first, second = sorted(os.sched_getaffinity(0))[:2]
    with start_up("up-cpus", tiny_llama, "--stage-cpus", f"{second},{first}") as server:
        for stage_id, cpu in (("stage0", second), ("stage1", first)):
            (pid,) = server.stage_pids(stage_id)
            assert allowed_cpus(pid) == (cpu,)
            assert _thread_cpus(pid) == {(cpu,)}  # every thread, also those started before the pinning
            assert _loading(server, stage_id)["cpu_affinity"] == str(cpu)
            assert _loading(server, stage_id)["openmp_spin"] == _spin(alone=True)  # no other stage on its core
        # stages on disjoint cores compute at once: the driver keeps a micro-batch in flight for each
        assert _event(server, "stage0", "pipeline_ready")["max_iterations_in_flight"] == 2
        client = server.client()
        reply = client.completions.create(model=server.model_id, prompt="one two three", max_tokens=4,
                                          temperature=0, extra_body={"ignore_eos": True})
        client.close()
        assert reply.usage is not None and reply.usage.completion_tokens == 4


def test_unpinned_stages_keep_every_cpu(server: SkippyServer) -> None:
    (pid,) = server.stage_pids("stage1")
    assert set(allowed_cpus(pid)) == os.sched_getaffinity(0)
    assert _loading(server, "stage1")["cpu_affinity"] == "all"
    assert {_loading(server, s)["openmp_spin"] for s in ("stage0", "stage1")} == {_spin(alone=False)}
    assert _event(server, "stage0", "pipeline_ready")["max_iterations_in_flight"] == 1  # they share every core


@needs_two_cpus
def test_pin_process_moves_existing_threads_and_the_default_thread_count() -> None:
    """In a child: numpy's pool threads exist before pin_process; all end up pinned, default_threads() == 1."""
    cpu = max(os.sched_getaffinity(0))
    code = ("import os, threading, numpy; from skippy.cpu_pinning import pin_process, allowed_cpus;"
            "from skippy.runtime.llama_api import default_threads;"
            "t = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True); t.start();"
            f"print(pin_process([{cpu}]), default_threads(),"
            " sorted({allowed_cpus(f'self/task/{tid}') for tid in os.listdir('/proc/self/task')}))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert out == f"({cpu},) 1 [({cpu},)]"
