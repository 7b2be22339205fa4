"""skippy.bench.cpu_time: roles from real argv shapes, and a real child process's CPU time in a snapshot."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from skippy.bench.cpu_time import per_token_ms, role, snapshot
from skippy.bench.http_report import cpu_by_role, table

BURN = "x = 0\nfor i in range(2_000_000):\n    x += i\nprint('ready', flush=True)\ninput()\n"


def test_roles_of_skippy_up_processes_and_peers() -> None:
    py = "/work/main/.venv/bin/python"
    assert role([py, "-m", "skippy.cli.main", "stage", "--config", "/r/stage1.json", "--topology", "t"]) == "stage:stage1"
    assert role([py, "-m", "skippy.cli.main", "broker", "--bind", "ipc:///x"]) == "broker"
    assert role(["/venv/bin/skippy", "up", "--model", "m"]) == "up"
    assert role(["/cache/build/bin/llama-server", "-m", "m.gguf"]) == "llama-server"
    assert role([]) == "?"


def test_snapshot_counts_a_child_and_per_token_splits_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"  # its loop has run
        mine = snapshot(child.pid)
        tree = snapshot(os.getpid())
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)
    name = role([sys.executable])
    assert list(mine) == [name] and mine[name] > 0
    assert tree[name] >= mine[name]  # the child is in this process's tree
    shares = per_token_ms({"a": 1.0, "b": 2.0}, {"a": 1.5, "b": 2.25, "c": 9.0}, 250)
    assert shares == {"a": 2.0, "b": 1.0, "total": 3.0}  # "c" started meanwhile: not counted
    assert per_token_ms({}, {}, 0) == {}


def test_the_reports_show_cpu_per_token() -> None:
    def level(tok_s: float, cpu: dict[str, float]) -> dict[str, Any]:
        return {"concurrency": 8, "tok_s": tok_s, "ttft_p50_ms": 1, "ttft_p95_ms": 2, "tpot_p50_ms": 3,
                "tpot_p95_ms": 4, "status_429": 0, "cpu_ms_per_token": cpu}

    results = {"skippy": [level(9.0, {"adapter": 0.3, "stage:stage0": 4.0, "total": 4.3})],
               "llama-server": [level(10.0, {"llama-server": 3.5, "total": 3.5})]}
    lines = table(results, "llama-server").splitlines()
    assert "CPU ms/tok sk/ls" in lines[0] and "4.30/3.50" in lines[1].split()
    assert "skippy            c=8     4.30 ms/token (adapter 0.30, stage:stage0 4.00)" in cpu_by_role(results)
