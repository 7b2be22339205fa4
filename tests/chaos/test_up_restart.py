"""`skippy up` brings a killed stage back: restarted with backoff, counted in /metrics, serving again
without restarting the other processes; it gives up (and stops everything) after too many deaths in a row.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from chaos_load import kill_and_wait_back, kill_stage, metric, wait_metric
from up_helpers import leftover_processes

WITHIN_S = 60.0  # bounded waits (not timing claims)


def test_up_restarts_a_killed_stage_and_serves_again(start_up: Callable[..., Any], tiny_llama: Path) -> None:
    with start_up("up-restart", tiny_llama) as server:
        assert metric(server, "skippy_stage_restarts_total", "stage1") == 0.0
        stage0 = server.stage_pids("stage0")
        # killed, restarted, and greeted again by stage 0 (`stage_back`): a restart faster than the heartbeat
        # bound leaves /readyz at 200 until stage 0 hears the new process, so /readyz alone is not enough
        old = kill_and_wait_back(server, "stage1", 1, time.monotonic()).killed_pid
        client = server.client()
        reply = client.chat.completions.create(model=server.model_id, max_tokens=4,
                                               messages=[{"role": "user", "content": "hi"}])
        client.close()
        assert reply.choices[0].finish_reason in ("length", "stop")
        took = metric(server, "skippy_stage_last_restart_seconds", "stage1")
        assert took is not None and took > 0
        assert server.stage_pids("stage0") == stage0  # stage 0 (and the front) kept running
        assert server.stage_pids("stage1") not in ([], [old])
        assert server.proc.poll() is None
        stderr = server.stderr_path.read_text()
        assert "stage1 exited with code -9" in stderr and "stage1 restarted (restart 1" in stderr, stderr


def test_up_gives_up_after_too_many_deaths_in_a_row(start_up: Callable[..., Any], tiny_llama: Path) -> None:
    with start_up("up-give-up", tiny_llama, "--max-stage-restarts", "1") as server:
        kill_stage(server, "stage1")
        wait_metric(server, "skippy_stage_restarts_total", "stage1", 1.0)
        kill_stage(server, "stage1")
        try:
            code = server.proc.wait(WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"skippy up did not give up\n{server.log_tail()}")
        assert code == 1
        stderr = server.stderr_path.read_text()
        assert "not restarting: it died 2 times in a row (--max-stage-restarts 1)" in stderr, stderr
        assert not leftover_processes(server.run_dir)
